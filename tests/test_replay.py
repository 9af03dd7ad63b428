"""Stored workflow histories replay through the current workflow code.

A change that would break running incidents (a reordered activity, a new timer) fails here.
The histories in tests/histories were recorded from real runs against the dev server and the
Slurm (and Kubernetes) sandbox by `make histories` (tests/histories/record.py); record them anew
when a change is meant to be incompatible, and use workflow.patched() for running ones.

tests/histories/paths holds one incident history per path of the workflow tests
(tests/test_workflow.py: approval by update, signal and timeout, abort, held then granted or not,
no capacity, observe, a late report, a failed health check...), recorded on the release before
the incident workflow was split into workflows/incident/ (597bac0), so every path, not only the
whole loop, replays through the code as it is now; with them one coordinator history from the
same release through the paths its successor changes (a grant taken back by the breaker, an
override, a cooldown hold served by the next event, a domain incident released), so a running
coordinator survives the upgrade.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from gpuheal.clients.temporal import DATA_CONVERTER
from gpuheal.workflows.domain import DomainIncidentWorkflow
from gpuheal.workflows.fleet import FleetCoordinator
from gpuheal.workflows.job_recovery import JobRecoveryWorkflow
from gpuheal.workflows.remediation import GpuRemediationWorkflow

HERE = Path(__file__).parent / "histories"
HISTORIES = sorted(HERE.glob("*.json")) + sorted((HERE / "paths").glob("*.json"))


def test_histories_are_present() -> None:
    assert len(HISTORIES) >= 3
    assert any(p.name.endswith(".fleet.json") for p in HISTORIES)  # the coordinator's too
    assert len(list((HERE / "paths").glob("*.json"))) >= 18  # every path of the workflow tests


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_replay(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    replayer = Replayer(
        workflows=[GpuRemediationWorkflow, JobRecoveryWorkflow, FleetCoordinator, DomainIncidentWorkflow],
        data_converter=DATA_CONVERTER,
    )
    await replayer.replay_workflow(history)
