"""The workflows' parts the worker shares across workflow runs (gpuheal.workers.main,
SHARED_WORKFLOW_PARTS) keep no state of their own: a run that changed one would change every
other run in the process, and a replay would not see it."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil
from datetime import datetime, timedelta
from enum import Enum
from pathlib import Path
from types import FunctionType, MappingProxyType, ModuleType
from typing import Any

from pydantic import BaseModel

from gpuheal.workers.main import SANDBOX, SHARED_WORKFLOW_PARTS

# What a shared part may keep at module level: values nothing can change.
IMMUTABLE = (int, float, str, bytes, bool, type(None), tuple, frozenset, timedelta, datetime, MappingProxyType, Enum)
# What the sandbox would refuse at run time in a workflow's own module, and cannot refuse in a
# shared part (passed through, it runs unrestricted): none of it may be imported there.
NONDETERMINISTIC = {"time", "random", "uuid", "os", "socket", "threading", "secrets", "subprocess"}
WORKFLOW_MODULES = (
    "gpuheal.workflows.remediation",
    "gpuheal.workflows.fleet",
    "gpuheal.workflows.job_recovery",
    "gpuheal.workflows.domain",
)


def shared_modules() -> list[ModuleType]:
    found = []
    for name in SHARED_WORKFLOW_PARTS:
        module = importlib.import_module(name)
        found.append(module)
        for info in pkgutil.walk_packages(getattr(module, "__path__", []), prefix=f"{name}."):
            found.append(importlib.import_module(info.name))
    return found


def test_every_part_is_found() -> None:
    names = {m.__name__ for m in shared_modules()}
    assert {"gpuheal.workflows.incident.state", "gpuheal.workflows.coordinator.reconcile"} <= names
    assert len(names) >= 20


def unchangeable(v: Any) -> bool:
    if isinstance(v, (*IMMUTABLE, FunctionType, ModuleType, type)):
        return not isinstance(v, tuple) or all(unchangeable(x) for x in v)
    if type(v).__module__ in ("typing", "typing_extensions", "collections.abc", "types", "__future__"):
        return True  # a type alias (Callable[...], Literal[...], a TypeVar)
    if dataclasses.is_dataclass(v):
        return type(v).__dataclass_params__.frozen  # type: ignore[attr-defined]
    if isinstance(v, BaseModel):
        return bool(type(v).model_config.get("frozen"))
    return False


def test_the_shared_parts_hold_nothing_that_can_change() -> None:
    held = [
        f"{m.__name__}.{k}: {type(v).__name__}"
        for m in shared_modules()
        for k, v in vars(m).items()
        if not k.startswith("__") and not unchangeable(v)
    ]
    assert not held, f"module state shared by every workflow run: {held}"


def test_no_shared_part_imports_what_the_sandbox_would_refuse() -> None:
    found = []
    for m in shared_modules():
        for node in ast.walk(ast.parse(Path(str(m.__file__)).read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            found += [f"{m.__name__}: {n}" for n in names if n.split(".")[0] in NONDETERMINISTIC]
    assert not found


def test_no_shared_part_rebinds_its_globals() -> None:
    rebinding = [
        f"{m.__name__}: global {', '.join(node.names)}"
        for m in shared_modules()
        for node in ast.walk(ast.parse(Path(str(m.__file__)).read_text()))
        if isinstance(node, ast.Global)
    ]
    assert not rebinding


def test_the_workflows_own_modules_stay_sandboxed() -> None:
    """Only the parts: each workflow's module is imported anew into its run's sandbox, where the
    sandbox checks its code."""
    passed = SANDBOX.restrictions.passthrough_modules
    for name in WORKFLOW_MODULES:
        assert not any(name == p or name.startswith(f"{p}.") for p in passed), name
    assert not SANDBOX.restrictions.passthrough_all_modules
    assert set(SHARED_WORKFLOW_PARTS) <= passed
