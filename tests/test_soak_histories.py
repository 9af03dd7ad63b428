"""The soak reads incident runs from Temporal's histories as the server gives them (recorded
histories of real runs, tests/histories), not through gpuheal's models."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpuheal.core.models.base import Stage
from gpuheal.core.models.result import StageRecord
from infra.soak import histories, report
from infra.soak import invariants as inv
from infra.soak.records import Run

HERE = Path(__file__).parent / "histories"


def recorded(name: str) -> dict[str, Any]:
    return dict(json.loads((HERE / name).read_text()))


def run(history: dict[str, Any], bound_s: float = 0.0) -> Run:
    return histories.incident_run(
        history, cluster="c", workflow_id="gpuheal-c-gpu01", run_id="r1", node="gpu01", bound_s=bound_s
    )


def test_a_closed_run_its_outcome_and_its_jobs_fates() -> None:
    r = run(recorded("paths/held_incident_ends_not_granted_at_its_bound.json"))
    assert (r.status, r.outcome, r.job_fates, r.waiting_for) == ("COMPLETED", "not_granted", {7: "untouched"}, "")
    assert r.closed is not None and r.closed > r.started
    assert r.node_state == ""  # recorded before the node states were named: words, not held to account
    assert inv.endings([r], end=r.closed) == []


def test_a_run_still_waiting_for_approval_names_whom_it_waits_for() -> None:
    whole = recorded("xid48_abort_during_approval.json")
    events = whole["events"]
    waiting = next(i for i, e in enumerate(events) if histories.last_stage(events[: i + 1]) == "approval")
    r = run({"events": events[: waiting + 1]})
    assert (r.status, r.closed, r.waiting_for) == ("RUNNING", None, "an operator's approval")
    assert inv.endings([r], end=r.started + 60) == []
    gone = run({"events": events[:waiting]}, bound_s=30.0)  # before it asked anyone: it waits for nobody
    assert inv.endings([gone], end=gone.started + 20) == []  # within its bound: on its way
    found = inv.endings([gone], end=gone.started + 60)
    assert [v.detail for v in found] == [f"still open past its bound, at {gone.stage}"] and gone.stage


def test_a_run_past_its_bound_and_a_failed_run_are_endings_broken() -> None:
    events = recorded("paths/held_incident_ends_not_granted_at_its_bound.json")["events"]
    r = run({"events": events}, bound_s=60.0)  # it was held an hour (the time-skipping server's)
    assert [v.detail.split(",")[1] for v in inv.endings([r], end=0.0)] == [" past its 60 s"]
    failed = {**events[-1], "eventType": "EVENT_TYPE_WORKFLOW_EXECUTION_FAILED"}
    assert run({"events": [*events[:-1], failed]}).status == "FAILED"


def test_a_history_that_does_not_begin_with_its_start_or_a_payload_not_json_is_refused() -> None:
    events = recorded("paths/approve_by_signal.json")["events"]
    with pytest.raises(ValueError, match="must begin with the run's start"):
        run({"events": events[1:]})
    binary = {"metadata": {"encoding": base64.b64encode(b"binary/plain").decode()}, "data": ""}
    with pytest.raises(ValueError, match="json/plain only"):
        histories.payload(binary)
    assert histories.event_time("2026-11-30T17:24:38.663785619Z") == pytest.approx(1796059478.663785)


def test_the_breaker_read_from_a_coordinators_history_and_a_reset_with_no_resume_caught() -> None:
    name = (
        "coordinator/issue-33-look-until-seen/"
        "a_recreation_tripped_already_does_not_trip_again_over_a_resume.0a.fleet.json"
    )
    events = recorded(name)["events"]
    changes = histories.breaker_changes([{"events": events}], "c")
    assert [(c.tripped, c.operator) for c in changes] == [(True, ""), (False, "alice")]
    assert inv.breaker_reset_alone(changes) == []
    # The same history with the operator's resume taken out: the breaker reset by itself.
    alone = [e for e in events if not _is_resume(e)]
    found = inv.breaker_reset_alone(histories.breaker_changes([{"events": alone}], "c"))
    assert [v.detail for v in found] == ["the breaker reset without an operator"]


def _is_resume(event: dict[str, Any]) -> bool:
    accepted = event.get("workflowExecutionUpdateAcceptedEventAttributes", {})
    return bool(accepted.get("acceptedRequest", {}).get("input", {}).get("name") == "resume")


def test_what_each_borrow_said_is_read_and_counted_in_the_report() -> None:
    """A run's borrow_node stages, in the result's own words (the hour's report says why none took)."""
    whole = recorded("paths/held_incident_ends_not_granted_at_its_bound.json")
    attributes = whole["events"][-1]["workflowExecutionCompletedEventAttributes"]
    encoded = attributes["result"]["payloads"][0]
    result = json.loads(base64.b64decode(encoded["data"]))
    said = ["nothing to borrow from pool inference: no Ready node in pool inference", "borrowed inf02 from pool a"]
    at = datetime(2026, 12, 6, tzinfo=UTC)
    result["stages"] += [
        StageRecord(stage=Stage.BORROW, started_at=at, outcome=s).model_dump(mode="json") for s in said
    ]
    encoded["data"] = base64.b64encode(json.dumps(result).encode()).decode()
    r = run(whole)
    assert r.borrows == tuple(said)
    lines = report.borrowing([r, run(recorded("paths/held_incident_ends_not_granted_at_its_bound.json"))])
    assert lines[0] == "Borrowing from the inference pool: 2 tries, 1 took a node."
    assert f"- 1: {said[0]}" in lines
    assert report.borrowing([]) == ["Borrowing from the inference pool: not tried by a run that completed.", ""]
