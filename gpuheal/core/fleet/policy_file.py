"""The cluster's policy as a file (YAML, the FleetPolicy's own field names): read, merged onto
a policy, compared, and digested. Pure, no I/O beyond reading the file it is given.

A file may say all of the policy or part of it (`budget: {cluster: "5%"}` alone): what it does
not say stays as it is. `gpuheal policy diff|apply FILE` (gpuheal.cli.policy) merge it onto the
cluster's current policy; a worker given `GPUHEAL_POLICY_FILE` (the chart's ConfigMap) merges it
onto the defaults, and offers the result to the coordinator as "the configuration" when it
starts (gpuheal.core.fleet.steering.configure: applied only when the configuration itself changed).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpuheal.core.fleet.policy import FleetPolicy


class PolicyFileError(ValueError):
    """A file that is not a policy: says where and what, and nothing is changed."""


def read(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise PolicyFileError(f"{path}: cannot read a policy: {err}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PolicyFileError(f"{path}: a policy is a mapping of fields (mode, budget, ...), not {type(data).__name__}")
    return data


def merged(current: FleetPolicy, changes: Mapping[str, Any], source: str = "the file") -> FleetPolicy:
    """`current` with what `changes` says, validated as a whole (a budget of "5.5" or a field
    that does not exist is refused, naming it and quoting the value)."""
    data = _merge(current.model_dump(mode="json", exclude_unset=True), changes)  # what is set stays "set"
    try:
        return FleetPolicy.model_validate(data)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            where = ".".join(str(p) for p in e["loc"])
            given = f" (given: {e['input']!r})" if e["type"] != "extra_forbidden" else ""
            problems.append(f"{where}: {e['msg']}{given}")
        raise PolicyFileError(f"{source} is not a valid policy: " + "; ".join(problems)) from err


def _merge(base: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def differences(old: FleetPolicy, new: FleetPolicy) -> list[str]:
    """Each field that differs, as `budget.cluster: '10%' -> '5%'`, in declaration order."""
    a, b = _flat(old.model_dump(mode="json")), _flat(new.model_dump(mode="json"))
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in b if a.get(k) != b.get(k)]


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, Mapping):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def digest(policy: FleetPolicy) -> str:
    """A short fingerprint of what a configuration sets (its variables or its file: defaults
    left out, so a release that adds a field or changes a default does not make an unchanged
    configuration look changed): what the coordinator remembers of the last one a worker
    offered, to tell a changed configuration from a restarted worker."""
    said = policy.model_dump(mode="json", exclude_unset=True)
    canonical = json.dumps(said, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def render(policy: FleetPolicy) -> str:
    """The whole policy as a file `apply` takes back unchanged."""
    return str(yaml.safe_dump(policy.model_dump(mode="json"), sort_keys=False))
