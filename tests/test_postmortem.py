"""The postmortem's rendering (gpuheal/core/postmortem.py): one record, Markdown, HTML and an SVG."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

from gpuheal.core import postmortem
from gpuheal.core.models.base import ActionClass, NodeState, Stage
from gpuheal.core.models.incident import RecordedDecision
from gpuheal.core.models.report import HealthReport
from gpuheal.core.models.result import RemediationResult, StageRecord

T0 = datetime(2026, 11, 30, 1, 0, tzinfo=UTC)


def record() -> postmortem.Record:
    stages = [
        StageRecord(stage=Stage.TRIAGE, started_at=T0 + timedelta(seconds=1), ended_at=T0 + timedelta(seconds=2)),
        StageRecord(stage=Stage.APPROVAL, started_at=T0 + timedelta(seconds=2), ended_at=T0 + timedelta(seconds=62)),
        StageRecord(
            stage=Stage.REPAIR, started_at=T0 + timedelta(seconds=62), ended_at=T0 + timedelta(seconds=70), outcome="ok"
        ),
    ]
    result = RemediationResult(
        incident_id="gpuheal-c1-gpu17",
        cluster="c1",
        node="gpu17",
        action=ActionClass.REPLACE_NODE,
        outcome="resolved",
        reason="XID 79: <GPU> fell off the bus",
        node_state=NodeState.REPLACED,
        node_detail="replaced by gpu20",
        failure_observed_at=T0,
        closed_at=T0 + timedelta(seconds=80),
        stages=stages,
        reports=[HealthReport(node="gpu17", cluster="c1", xid=79, source="alertmanager", observed_at=T0)],
        decision=RecordedDecision(
            verdict="approve", operator="alice", reason="RMA 4711", at=T0 + timedelta(seconds=62)
        ),
        replacement_node="gpu20",
        mttr_s=75.0,
        gpu_seconds_lost=7200.0,
    )
    actions = [
        postmortem.ActionRecord("drain_slurm_node", "drain gpu17", 2, "completed", ["slurmctld did not answer"]),
    ]
    steering = [postmortem.Steering(T0 + timedelta(seconds=62), "update approve", "alice: RMA 4711")]
    return postmortem.Record(result, actions, steering, ["Warning GpuFailed: XID 79"], "http://ui/x", 120)


def test_the_record_says_who_decided_what_was_done_and_what_it_cost() -> None:
    md = postmortem.markdown(record(), "t.svg")
    assert md.startswith("# Postmortem: gpuheal-c1-gpu17") and "![timeline of gpuheal-c1-gpu17](t.svg)" in md
    assert "approve by alice: RMA 4711" in md and "update approve: alice: RMA 4711" in md
    assert "drain_slurm_node — drain gpu17: completed after 2 attempts; attempt error: slurmctld did not answer" in md
    assert "MTTR: 75.0 s" in md and "2.00 GPU-hours" in md and "Replaced by: gpu20" in md
    assert "Warning GpuFailed: XID 79" in md and "Temporal UI: http://ui/x" in md
    assert "| approval | 2.0 | 60.0 |" in md


def test_the_html_is_self_contained_and_escaped() -> None:
    page = postmortem.html_page(record())
    assert "&lt;GPU&gt;" in page and "<GPU>" not in page  # a reason is text, never markup
    assert "<script" not in page and "http" not in page.split("<body>")[0]  # nothing fetched
    assert "<strong>gpu17</strong>" in page


def test_the_timeline_is_one_bar_per_stage_to_scale() -> None:
    svg = ET.fromstring(postmortem.timeline_svg(record().result.stages, T0))
    bars = [e for e in svg.iter("{http://www.w3.org/2000/svg}rect") if e.get("class") == "stage"]
    assert len(bars) == 3
    widths = [float(b.get("width", 0)) for b in bars]
    assert abs(widths[1] / widths[2] - 60 / 8) < 0.01  # approval 60 s, repair 8 s
