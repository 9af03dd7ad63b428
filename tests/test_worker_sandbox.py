"""The workflows' parts the worker shares across workflow runs (gpuheal.workers.main,
SHARED_WORKFLOW_PARTS) keep no state of their own: a run that changed one would change every
other run in the process, and a replay would not see it."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from collections import OrderedDict, defaultdict, deque
from pathlib import Path
from types import ModuleType

from gpuheal.workers.main import SANDBOX, SHARED_WORKFLOW_PARTS

MUTABLE = (dict, list, set, bytearray, deque, defaultdict, OrderedDict)
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


def test_the_shared_parts_hold_no_mutable_module_state() -> None:
    held = [
        f"{m.__name__}.{k}: {type(v).__name__}"
        for m in shared_modules()
        for k, v in vars(m).items()
        if isinstance(v, MUTABLE) and not k.startswith("__")
    ]
    assert not held, f"module state shared by every workflow run: {held}"


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
