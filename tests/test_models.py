from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpuheal.core import progress
from gpuheal.core.models.base import NodeState
from gpuheal.core.models.incident import Decision
from gpuheal.core.models.report import HealthReport
from gpuheal.core.models.result import RemediationResult
from gpuheal.core.progress import format_progress, parse_progress

NOW = datetime.now(UTC)


@pytest.mark.parametrize("node", ["gpu01; rm -rf /", "-gpu", "", "a" * 64, "gpu 01", "$(reboot)"])
def test_node_names_that_could_reach_a_command_line_are_refused(node: str) -> None:
    with pytest.raises(ValidationError, match="node"):
        HealthReport(node=node, cluster="c1", xid=79, observed_at=NOW)


def test_report_needs_xid_or_signal() -> None:
    with pytest.raises(ValidationError, match="needs an XID or a signal"):
        HealthReport(node="gpu01", cluster="c1", observed_at=NOW)


def test_report_needs_aware_timestamp() -> None:
    with pytest.raises(ValidationError, match="time zone"):
        HealthReport(node="gpu01", cluster="c1", xid=79, observed_at=datetime(2026, 1, 1))


def test_report_rejects_unknown_fields() -> None:
    with pytest.raises(ValidationError, match="extra"):
        HealthReport.model_validate({"node": "gpu01", "xid": 79, "observed_at": NOW, "color": "red"})


def test_decision_needs_operator_and_reason() -> None:
    with pytest.raises(ValidationError):
        Decision(operator="", reason="x")
    with pytest.raises(ValidationError):
        Decision(operator="alice", reason="")
    assert Decision(operator="alice@example.com", reason="ok").operator == "alice@example.com"


def test_progress_round_trip() -> None:
    line = format_progress(120, 100, 1796000000.25, 1)
    assert line == "gpuheal step=120 ckpt=100 ckpt_at=1796000000.250 restart=1"
    p = parse_progress(line)
    assert p is not None
    assert (p.step, p.checkpoint_step, p.checkpoint_at, p.restart) == (120, 100, 1796000000.25, 1)
    assert p.signal is None and p.notify is None  # a job that says nothing is never signalled


def test_progress_carries_the_jobs_opt_in_signal_and_where_to_tell_its_owner() -> None:
    line = format_progress(5, 0, 1.0, 0, signal="USR1", notify="alice@example.com")
    assert line.endswith("signal=USR1 notify=alice@example.com")
    p = parse_progress(line)
    assert p is not None and (p.signal, p.notify) == ("USR1", "alice@example.com")
    assert parse_progress("gpuheal step=1 ckpt=0 signal=SIGUSR2") == parse_progress("gpuheal step=1 ckpt=0 signal=USR2")
    odd = parse_progress("gpuheal step=1 ckpt=0 signal=kill;reboot")
    assert odd is not None and odd.signal is None  # not a signal name: ignored, never sent


@pytest.mark.parametrize("comment", [None, "", "user comment", "gpuheal step=x ckpt=1", "gpuheal ckpt=3"])
def test_progress_that_does_not_follow_the_contract_is_none(comment: str | None) -> None:
    assert parse_progress(comment) is None


def test_a_result_closed_before_node_states_were_named_still_reads() -> None:
    """`gpuheal incidents` and `postmortem` read results recorded by the release before: their
    node_state held the words, which become the detail."""
    closed = {
        "incident_id": "gpuheal-c-gpu01",
        "cluster": "c",
        "node": "gpu01",
        "action": "replace_node",
        "outcome": "resolved",
        "reason": "XID 79",
        "node_state": "replaced by gpu04; gpu01 left the cluster (State=FUTURE)",
        "failure_observed_at": "2026-11-30T01:00:00Z",
        "closed_at": "2026-11-30T01:00:09Z",
        "stages": [],
        "reports": [],
    }
    old = RemediationResult.model_validate(closed)
    assert old.node_state == NodeState.UNKNOWN
    assert old.node_detail == "replaced by gpu04; gpu01 left the cluster (State=FUTURE)"
    new = RemediationResult.model_validate({**closed, "node_state": "replaced", "node_detail": "replaced by gpu04"})
    assert new.node_state == NodeState.REPLACED and new.node_detail == "replaced by gpu04"


@pytest.mark.parametrize("scontrol", ["exit 1", "sleep 30"])  # refused; a controller that does not answer
def test_progress_not_published_never_ends_the_training(
    scontrol: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = tmp_path / "scontrol"
    fake.write_text(f"#!/bin/sh\n{scontrol}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setattr(progress, "PUBLISH_TIMEOUT_S", 0.5)
    assert progress.report_progress(5, 0) is False
    assert "progress at step 5 not published" in capsys.readouterr().err
