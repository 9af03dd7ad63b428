from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuheal.core import policy, render
from gpuheal.core.models.base import ActionClass as A
from gpuheal.core.models.report import HealthReport
from gpuheal.core.models.result import ResumedJob
from gpuheal.core.models.slurm import NodeRef, RequeueResult
from gpuheal.workflows.incident.state import IncidentState

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def report(xid: int | None = None, signal: str | None = None, gpu: int | None = 0) -> HealthReport:
    return HealthReport(node="gpu01", cluster="c1", xid=xid, signal=signal, gpu=gpu, observed_at=T0)


@pytest.mark.parametrize(
    ("xid", "action"),
    [
        (13, A.RESTART_APP),
        (31, A.RESTART_APP),
        (43, A.RESTART_APP),
        (45, A.IGNORE),
        (48, A.RESET_GPU),
        (63, A.IGNORE),
        (64, A.RESET_GPU),
        (74, A.RESET_GPU),
        (79, A.REPLACE_NODE),
        (92, A.IGNORE),
        (94, A.RESTART_APP),
        (95, A.RESET_GPU),
        (119, A.RESET_GPU),
        (120, A.RESET_GPU),
    ],
)
def test_xid_catalogue(xid: int, action: A) -> None:
    verdict = policy.triage(report(xid))
    assert verdict.action == action
    assert verdict.reason.startswith(f"XID {xid}:")


@pytest.mark.parametrize(
    ("recovery", "action"),
    [
        ("none", A.IGNORE),
        ("gpu_reset", A.RESET_GPU),
        ("drain_and_reset", A.RESET_GPU),
        ("node_reboot", A.REBOOT_NODE),
        (None, A.REBOOT_NODE),
    ],
)
def test_xid_154_follows_the_drivers_recovery_action(recovery: str | None, action: A) -> None:
    assert policy.triage(report(154, signal=recovery)).action == action


def test_unknown_xid_is_reset_not_ignored() -> None:
    verdict = policy.triage(report(999))
    assert verdict.action == A.RESET_GPU
    assert "not in the catalogue" in verdict.reason


def test_signals() -> None:
    assert policy.triage(report(signal="gpu_lost")).action == A.REPLACE_NODE
    assert policy.triage(report(signal="row_remap_pending")).action == A.IGNORE
    assert policy.triage(report(signal="made_up")).action == A.REBOOT_NODE


def test_most_severe_report_wins() -> None:
    verdict = policy.triage_all([report(94), report(79), report(48)])
    assert verdict.action == A.REPLACE_NODE
    assert "XID 79" in verdict.reason


def test_repeated_resets_on_one_gpu_escalate_to_replace() -> None:
    reports = [
        HealthReport(node="gpu01", cluster="c1", xid=48, gpu=2, observed_at=T0 + timedelta(minutes=i)) for i in range(3)
    ]
    assert policy.triage_all(reports[:2]).action == A.RESET_GPU
    verdict = policy.triage_all(reports)
    assert verdict.action == A.REPLACE_NODE
    assert "3 times" in verdict.reason


def test_plans() -> None:
    assert policy.plan_for(A.RESTART_APP) == policy.Plan(False, True, None, False)
    assert policy.plan_for(A.REPLACE_NODE).repair == A.REPLACE_NODE
    assert all(policy.plan_for(a).drain for a in (A.RESET_GPU, A.REBOOT_NODE, A.REPLACE_NODE))


def test_drain_ownership() -> None:
    reason = policy.drain_reason("gpuheal-c-gpu01", "XID 79")
    assert policy.is_our_drain(reason, "gpuheal-c-gpu01")
    assert not policy.is_our_drain("hw maintenance by bob", "gpuheal-c-gpu01")
    assert not policy.is_our_drain(reason, "gpuheal-c-gpu011")


def test_unrequeueable_reason() -> None:
    assert policy.unrequeueable_reason(True, "RUNNING") is None
    assert "--no-requeue" in (policy.unrequeueable_reason(False, "RUNNING") or "")
    assert "PENDING" in (policy.unrequeueable_reason(True, "PENDING") or "")


def test_incident_cost() -> None:
    requeued = [
        RequeueResult(
            job_id=1,
            requeued=True,
            step_at_failure=120,
            checkpoint_step=100,
            checkpoint_at=(T0 - timedelta(seconds=60)).timestamp(),
            node_count=2,
        ),
        RequeueResult(job_id=2, requeued=False, reason="--no-requeue"),
    ]
    resumed = [
        ResumedJob(
            job_id=1,
            node="gpu02",
            step=101,
            checkpoint_step=100,
            restart_count=1,
            observed_at=T0 + timedelta(seconds=30),
        )
    ]
    cost = policy.incident_cost(T0, requeued, resumed, gpus_per_node=8)
    assert cost.mttr_s == 30
    assert cost.steps_lost == 20
    # 2 nodes x 8 GPUs x (30 s down + 60 s of work since the checkpoint)
    assert cost.gpu_seconds_lost == 2 * 8 * 90


def test_incident_cost_without_jobs_measures_capacity() -> None:
    cost = policy.incident_cost(T0, [], [], 8, capacity_back_at=T0 + timedelta(seconds=12))
    assert cost.mttr_s == 12
    assert cost.steps_lost == 0


def test_the_incident_a_drain_is_in_the_name_of() -> None:
    """`gpuheal return` finds whose drain a node's is: a replacement kept out is drained in the
    name of the incident it was to replace a node for, not its own."""
    prefix = "gpuheal-prod-"
    assert policy.draining_incident("gpuheal-prod-gpu01: GPU validation gave no verdict: x", prefix) == (
        "gpuheal-prod-gpu01"
    )
    assert policy.draining_incident("gpuheal-other-gpu01: XID 79", prefix) is None  # another cluster's
    assert policy.draining_incident("hw check by ops: see gpuheal-prod-gpu01", prefix) is None  # a person's
    assert policy.draining_incident("Kill task failed", prefix) is None


@given(st.lists(st.text(alphabet="abcdefgh:()0123456789", min_size=1, max_size=30), min_size=1, max_size=40))
def test_a_drain_reason_is_cut_at_a_word_and_says_so(words: list[str]) -> None:
    """sinfo and scontrol show 200 characters: a longer reason keeps whole words, and says it was cut."""
    why = " ".join(words)
    reason, whole = policy.drain_reason("gpu-east-gpu01", why), f"gpu-east-gpu01: {why}"
    assert len(reason) <= policy.DRAIN_REASON_MAX and policy.is_our_drain(reason, "gpu-east-gpu01")
    if len(whole) <= policy.DRAIN_REASON_MAX:
        assert reason == whole
    else:
        kept = reason.removesuffix("...")
        assert reason.endswith("...") and whole.startswith(kept + " ")


DRAINING = [x for x, (action, _) in policy.XID_ACTIONS.items() if policy.plan_for(action).drain]


@given(st.sampled_from(DRAINING), st.sampled_from(DRAINING), st.sampled_from(["repeat", "burn-in", None]))
def test_a_drain_for_another_failure_reads_as_another_in_slurm(first: int, then: int, context: str | None) -> None:
    """Slurm logs nothing for a drain with the reason a node has: two failures of one incident id
    (a long one, a repeat offender named by its GPU's UUID, a burn-in's jobs) give two reasons,
    each cut at Slurm's length, each saying first why the node is out."""
    incident = "gpuheal-us-west-2-prod-a100-rack12-node-0123"
    uuid = "GPU-" + "0123456789abcdef" * 2
    why = {  # as core.fleet.breaker and render.burn_in_due write them
        "repeat": f"{policy.REPEAT_OFFENDER}: 4 incidents on GPU {uuid} within 30 days",
        "burn-in": render.burn_in_due(report(13), [4812345, 4812346, 4812399], 30 * 86400),
        None: None,
    }[context]
    reasons = []
    for xid in (first, then):
        s = IncidentState(ref=NodeRef(cluster="c1", node="gpu01", incident_id=incident), reports=[report(xid)])
        s.repeat, s.burn_in = (why, None) if context == "repeat" else (None, why)
        reasons.append(policy.drain_reason(incident, f"contained while awaiting approval: {s.drain_why()}"))
    assert (reasons[0] == reasons[1]) == (first == then)
    tag = {"repeat": "repeat offender: ", "burn-in": "burn-in: ", None: ""}[context]
    assert all(r.startswith(f"{incident}: contained while awaiting approval: {tag}XID ") for r in reasons)
    assert all(r.count(policy.REPEAT_OFFENDER) == (context == "repeat") for r in reasons)  # said once
