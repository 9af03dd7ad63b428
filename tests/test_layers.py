"""The house's rules that a user feels: the activity boundary is the one the workflow calls, and
the workflow, the webhook and the CLI's short commands start without loading heavy clients.
(The import direction itself is checked by `lint-imports` in `make test`.)"""

from __future__ import annotations

import inspect
import subprocess
import sys
import typing

import pytest

from gpuheal.activities import interface as act
from gpuheal.activities.borrowed import BorrowedNodes
from gpuheal.activities.carrying import StatePacking
from gpuheal.activities.fleet import FleetActivities
from gpuheal.activities.jobs import JobActivities
from gpuheal.activities.kubernetes import KubernetesActivities
from gpuheal.activities.remediation import RemediationActivities
from gpuheal.activities.rma import RmaActivities
from gpuheal.activities.validation import ValidationActivities
from tests.fakes import FakeCluster


@pytest.mark.parametrize(
    ("cls", "refs"),
    [
        (RemediationActivities, act.REMEDIATION),
        (JobActivities, act.JOBS),
        (FleetActivities, act.FLEET),
        (KubernetesActivities, act.KUBERNETES),
        (ValidationActivities, act.VALIDATION),
        (RmaActivities, act.RMA),
        (BorrowedNodes, act.BORROWED),
        (StatePacking, act.CARRYING),
    ],
)
def test_every_activity_matches_its_interface(cls: type, refs: tuple[act.Activity[object, object], ...]) -> None:
    impls = act.implementations(cls)
    assert set(impls) == {r.name for r in refs}
    for ref in refs:
        hints = typing.get_type_hints(impls[ref.name])
        (param,) = [p for p in inspect.signature(impls[ref.name]).parameters if p != "self"]  # one input model
        assert hints[param] is ref.input, ref.name
        assert hints["return"] is ref.output or (ref.output is type(None) and hints["return"] is type(None)), ref.name


def test_the_fakes_implement_the_same_interface() -> None:
    names = {fn.__temporal_activity_definition.name for fn in FakeCluster().activities()}  # type: ignore[attr-defined]
    assert names == {r.name for r in act.REMEDIATION + act.JOBS + act.FLEET_INCIDENT + act.VALIDATION + act.RMA}


@pytest.mark.parametrize(
    ("module", "heavy"),
    [
        ("gpuheal.workflows.remediation", {"kubernetes", "prometheus_client", "aiohttp"}),
        ("gpuheal.cli.main", {"kubernetes", "prometheus_client", "aiohttp", "temporalio", "pydantic"}),
        ("gpuheal.cli.incident", {"kubernetes", "prometheus_client", "aiohttp"}),
        # The commands that read Temporal alone (the fleet's, the policy's, the postmortem, and
        # the target they share): the Slurm client is a tenth of a second of their start, on a
        # machine a storm keeps busy (issue 36: within 1 s).
        ("gpuheal.cli.fleet", {"kubernetes", "prometheus_client", "aiohttp", "gpuheal.clients.slurm"}),
        ("gpuheal.cli.policy", {"kubernetes", "prometheus_client", "aiohttp", "gpuheal.clients.slurm"}),
        ("gpuheal.cli.postmortem", {"kubernetes", "prometheus_client", "aiohttp", "gpuheal.clients.slurm"}),
        ("gpuheal.triggers.webhook", {"kubernetes", "prometheus_client"}),
    ],
)
def test_light_modules_load_no_heavy_client(module: str, heavy: set[str]) -> None:
    code = f"import sys, {module}; print(' '.join(sorted(m for m in {sorted(heavy)!r} if m in sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert loaded == []
