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
coordinator survives the upgrade. The issue34_* ones (each run of a continue-as-new chain its own
file) are the paths issue 34 added: a late, more severe report followed up, the application-fault
ladder's burn-in passed and failed. The issue35_* ones, issue 35's: a burn-in that gave no verdict
(could not run, never started; on a repaired node and on a new one), a rejected spare counted at
the coordinator, and RMA evidence whose history could not be read. The issue37_* ones: an
application restart reading its node's state from Slurm at the close (in service, still drained
by an earlier run of its incident, drained by someone else).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory

from gpuheal.workflows import fleet
from tests.replaying import replay
from tests.test_coordinator_carry import short_runs_limit

HERE = Path(__file__).parent / "histories"
HISTORIES = sorted(HERE.glob("*.json")) + sorted((HERE / "paths").glob("*.json"))
# The coordinator's own paths, recorded from its time-skipping tests (tests/histories/recording.py):
# the look for closed runs, containment, the rebuild, batches, continue-as-new, domain incidents.
# One folder per release that recorded them (kept: a later release replays every earlier one's).
COORDINATOR = sorted((HERE / "coordinator").rglob("*.json"))


def test_histories_are_present() -> None:
    assert len(HISTORIES) >= 3
    assert any(p.name.endswith(".fleet.json") for p in HISTORIES)  # the coordinator's too
    assert len(list((HERE / "paths").glob("*.json"))) >= 18  # every path of the workflow tests
    assert len(COORDINATOR) >= 12  # the coordinator's tests' own
    assert any(p.name.startswith("short_runs_") and ".0b." in p.name for p in COORDINATOR)  # a continued run


@pytest.mark.parametrize("path", HISTORIES + COORDINATOR, ids=[p.stem for p in HISTORIES + COORDINATOR])
async def test_replay(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its commands replay, and every update answers what it answered when it was recorded."""
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    limit = short_runs_limit(path.name)  # recorded with runs cut short (test_coordinator_carry)
    if limit is not None:
        monkeypatch.setattr(fleet, "HISTORY_LIMIT_PACKED", limit)
    assert await replay(history, unsandboxed=limit is not None) == []
