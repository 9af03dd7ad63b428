"""The workflow's own logic on Temporal's time-skipping test server, with stand-in activities
(tests/fakes.py): approve, abort and timeout paths, ignore, escalation after a failed repair."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from gpuheal.core import ids, policy
from gpuheal.core.fleet.models import GrantNotice
from gpuheal.core.fleet.policy import FleetPolicy
from gpuheal.core.messages import INCIDENT_APPROVE_SIGNAL, INCIDENT_CAPACITY
from gpuheal.core.models.base import ActionClass, NodeState, Stage
from gpuheal.core.models.incident import POLICY_OPERATOR, ApprovalPolicy, Decision
from gpuheal.core.models.replacement import EarlierReplacement
from gpuheal.core.models.report import HealthReport
from gpuheal.core.models.result import JobFate, RemediationResult
from gpuheal.core.search_attributes import ALERT_KEYS
from gpuheal.core.settings import Settings
from gpuheal.triggers import start
from gpuheal.workflows.job_recovery import JobRecoveryWorkflow
from gpuheal.workflows.remediation import GpuRemediationWorkflow
from tests.conftest import start_time_skipping
from tests.fakes import FakeCluster

Handle = WorkflowHandle[GpuRemediationWorkflow, RemediationResult]
NODE_SIDE = {
    "look_up",
    "gather_rma",
    "file_rma",
    "notify:remediating",
    "list_jobs",
    "checkpoint",
    "confirm",
    "drain",
    "replace",
    "decommission",
    "notify:closed_resolved",
    "metrics",
    "health",
    "resume",
    "find_jobs",
    "admit",
    "request_capacity",
    "confirm_capacity",
    "release_capacity",
}


async def start_or_join(client: Any, s: Settings, report: HealthReport) -> Any:
    """Each test's reports name a cluster of their own (unique workflow ids on the shared test
    server): the settings are that cluster's, as a real worker's are its own."""
    return await start.start_or_join(client, s.model_copy(update={"cluster": report.cluster}), report)


def settings() -> Settings:
    return Settings(task_queue=f"tq-{uuid.uuid4()}", cluster="test")


def approving(approval: ApprovalPolicy) -> FakeCluster:
    """A cluster whose policy makes these action classes wait for a human."""
    return FakeCluster(policy=FleetPolicy(approval=approval))


def report(xid: int = 79) -> HealthReport:
    return HealthReport(node="gpu01", cluster=f"c{uuid.uuid4().hex[:8]}", xid=xid, gpu=0, observed_at=datetime.now(UTC))


@pytest.fixture
async def env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server of the test's own (not the session's, tests/conftest.py): a test
    that fails leaves its incident waiting, and the server then no longer skips time for the
    next ones (seen: one failure beside a loaded machine, then every later approval timeout in
    the module waiting out pytest's 300 s in real time)."""
    env = await start_time_skipping()
    yield env
    await env.shutdown()


# How long a test waits for what a workflow does next: generous, for a loaded machine (a wait
# of 10 s failed beside a full suite run and a storm benchmark).
WAIT_S = 60.0
XID_79 = f"XID 79: {policy.XID_ACTIONS[79][1]}"  # the failure, as a drain reason names it


async def until_true(check: Callable[[], Awaitable[bool]] | Callable[[], bool], what: str) -> None:
    """Poll `check` every 50 ms until it is true; fail naming `what` after WAIT_S."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while asyncio.get_running_loop().time() < deadline:
        found = check()
        if found if isinstance(found, bool) else await found:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {WAIT_S:g} s: {what}")


async def wait_for_stage(handle: Handle, stage: Stage) -> None:
    async def reached() -> bool:
        status = await handle.query(GpuRemediationWorkflow.status)
        return status.stage == stage and (stage != Stage.APPROVAL or status.awaiting_approval)

    await until_true(reached, f"the workflow reaching {stage}")


def worker(env: WorkflowEnvironment, s: Settings, fake: FakeCluster) -> Worker:
    return Worker(
        env.client,
        task_queue=s.task_queue,
        workflows=[GpuRemediationWorkflow, JobRecoveryWorkflow],
        activities=fake.activities(),
    )


async def test_xid79_replaces_the_node_without_a_human(env: WorkflowEnvironment) -> None:
    fake, s = FakeCluster(), settings()
    async with worker(env, s, fake):
        handle = await start_or_join(env.client, s, report(79))
        result = await handle.result()
        first_run = (await handle.describe()).run_id
    assert result.outcome == "resolved" and result.action == ActionClass.REPLACE_NODE
    assert [(bool(r.run_id), r.left_drained) for r in fake.releases] == [(True, False)]  # its run's; replaced
    # the provider is asked under the incident's first run (a reset run finds the same spare)
    assert [r.run_id for r in fake.replace_requests] == [first_run]
    node_calls = [c for c in fake.calls if c in NODE_SIDE]
    # The notice, the drain and the checkpoint ask go side by side (their order among themselves
    # is the worker's); the drain is in before the checkpoint is confirmed, not after it.
    early = node_calls[3:8]
    assert sorted(early) == sorted(["notify:remediating", "drain", "list_jobs", "checkpoint", "confirm"]), node_calls
    assert early.index("list_jobs") < early.index("checkpoint") < early.index("confirm")
    assert node_calls[:3] + node_calls[8:] == [
        "look_up",
        "admit",
        "request_capacity",
        "list_jobs",
        "confirm_capacity",
        "replace",
        "decommission",
        "gather_rma",  # a replaced board: its evidence goes to the vendor
        "file_rma",
        "notify:closed_resolved",
        "release_capacity",
        "metrics",
    ]
    # the job went to its recovery: requeued once, verified, its owner told twice
    job_calls = [c for c in fake.calls if c not in NODE_SIDE]
    assert job_calls == ["history", "requeue:7", "owner:job_hit", "verify", "owner:job_running_again"]
    (account,) = result.jobs
    assert account.fate == JobFate.REQUEUED and account.resumed is not None and account.user == "alice"
    assert account.checkpoint is not None and account.checkpoint.confirmed
    assert [st.stage for st in result.stages] == [
        Stage.TRIAGE,
        Stage.NOTIFY,  # (started in this order, side by side)
        Stage.DRAIN,
        Stage.PROTECT,
        Stage.REQUEUE,
        Stage.REPAIR,
        Stage.VERIFY,
        Stage.RETURN,
        Stage.CLOSE,
    ]
    # the checkpoint was confirmed: the stage did not wait out the 30 s grace
    protect = next(st for st in result.stages if st.stage == Stage.PROTECT)
    assert protect.duration_s is not None and protect.duration_s < 30
    assert "checkpoint" in protect.outcome or "ok" in protect.outcome
    assert result.replacement_node == "gpu09" and result.steps_lost == 2
    assert result.mttr_s is not None


async def test_approve_by_update(env: WorkflowEnvironment) -> None:
    fake, s = approving(ApprovalPolicy(required_for=(ActionClass.REPLACE_NODE,))), settings()
    async with worker(env, s, fake):
        handle = await start_or_join(env.client, s, report(79))
        await wait_for_stage(handle, Stage.APPROVAL)
        # contained while waiting: drained, nothing requeued yet
        assert fake.calls[-2:] == ["drain", "notify:approval_needed"]
        assert "requeue:7" not in fake.calls
        # the failure named: a later run's drain for another failure reads as a change in Slurm
        assert fake.drain_reasons_sent == [f"{handle.id}: contained while awaiting approval: {XID_79}"]
        answer = await handle.execute_update(
            GpuRemediationWorkflow.approve, Decision(operator="alice", reason="RMA ticket 42")
        )
        assert "approve recorded" in answer
        result = await handle.result()
    assert result.outcome == "resolved"
    assert result.decision is not None and result.decision.operator == "alice"
    assert fake.calls.count("drain") == 1  # the containment drain is the drain
    assert "replace" in fake.calls


async def test_abort_by_update_leaves_node_drained_not_replaced(env: WorkflowEnvironment) -> None:
    fake, s = approving(ApprovalPolicy(required_for=(ActionClass.REPLACE_NODE,))), settings()
    async with worker(env, s, fake):
        handle = await start_or_join(env.client, s, report(79))
        await wait_for_stage(handle, Stage.APPROVAL)
        await handle.execute_update(GpuRemediationWorkflow.abort, Decision(operator="bob", reason="false alarm"))
        result = await handle.result()
    assert result.outcome == "aborted" and result.reason == "false alarm"
    assert result.node_state == NodeState.DRAINED
    assert "drained by this incident; not replaced" in result.node_detail
    assert "gpuheal return " in result.node_detail
    assert not {"replace", "requeue:7", "checkpoint"} & set(fake.calls)
    assert [a.fate for a in result.jobs] == [JobFate.UNTOUCHED]  # accounted for, left running
    assert "notify:aborted" in fake.calls


async def test_decision_outside_the_approval_wait_is_rejected(env: WorkflowEnvironment) -> None:
    fake, s = approving(ApprovalPolicy(required_for=(ActionClass.REPLACE_NODE,))), settings()
    async with worker(env, s, fake):
        handle = await start_or_join(env.client, s, report(79))
        await wait_for_stage(handle, Stage.APPROVAL)
        await handle.execute_update(GpuRemediationWorkflow.approve, Decision(operator="alice", reason="go"))
        with pytest.raises(WorkflowUpdateFailedError) as err:
            await handle.execute_update(GpuRemediationWorkflow.abort, Decision(operator="bob", reason="stop"))
        assert "not awaiting approval" in str(err.value.cause)
        result = await handle.result()
    assert result.outcome == "resolved" and result.decision is not None
    assert result.decision.operator == "alice"


@pytest.mark.parametrize(("default", "outcome"), [("abort", "aborted"), ("approve", "resolved")])
async def test_approval_timeout_falls_back_to_the_default(env: WorkflowEnvironment, default: str, outcome: str) -> None:
    approval = ApprovalPolicy(required_for=(ActionClass.REPLACE_NODE,), timeout_s=900, default_on_timeout=default)  # type: ignore[arg-type]
    fake, s = approving(approval), settings()
    async with worker(env, s, fake):
        result = await (await start_or_join(env.client, s, report(79))).result()
    assert result.outcome == outcome
    assert result.decision is not None and result.decision.by_timeout
    assert result.decision.operator == POLICY_OPERATOR
    approval_stage = next(st for st in result.stages if st.stage == Stage.APPROVAL)
    assert approval_stage.duration_s is not None and approval_stage.duration_s >= 900


async def test_approve_by_signal(env: WorkflowEnvironment) -> None:
    fake, s = approving(ApprovalPolicy(required_for=(ActionClass.REPLACE_NODE,))), settings()
    async with worker(env, s, fake):
        handle = await start_or_join(env.client, s, report(79))
        await wait_for_stage(handle, Stage.APPROVAL)
        await INCIDENT_APPROVE_SIGNAL.send(handle, Decision(operator="carol", reason="ok"))
        result = await handle.result()
    assert result.outcome == "resolved" and result.decision is not None
    assert result.decision.operator == "carol"


async def test_informational_xid_is_ignored_with_reason(env: WorkflowEnvironment) -> None:
    fake, s = FakeCluster(), settings()
    async with worker(env, s, fake):
        result = await (await start_or_join(env.client, s, report(63))).result()
    assert result.outcome == "ignored" and "informational" in result.reason
    assert fake.calls == ["look_up", "notify:closed_ignored", "metrics"]
    assert result.jobs == []


async def test_failed_health_check_after_reset_replaces_the_node(env: WorkflowEnvironment) -> None:
    fake, s = FakeCluster(healthy_after_repair=False), settings()
    async with worker(env, s, fake):
        result = await (await start_or_join(env.client, s, report(48))).result()
    assert "repair:reset_gpu" in fake.calls
    assert fake.calls.index("health") < fake.calls.index("replace") < fake.calls.index("decommission")
    assert "resume" not in fake.calls
    assert result.action == ActionClass.REPLACE_NODE and result.replacement_node == "gpu09"


async def test_reset_then_resume_after_health_check(env: WorkflowEnvironment) -> None:
    fake, s = FakeCluster(), settings()
    async with worker(env, s, fake):
        result = await (await start_or_join(env.client, s, report(95))).result()
    assert fake.calls.index("health") < fake.calls.index("resume")
    assert result.node_state == NodeState.RETURNED
    assert "health check passed" in result.node_detail and result.replacement_node is None


async def test_a_provider_that_cannot_repair_replaces_instead(env: WorkflowEnvironment) -> None:
    fake, s = FakeCluster(can_repair=False), settings()
    async with worker(env, s, fake):
        result = await (await start_or_join(env.client, s, report(48))).result()
    assert fake.calls.index("repair:reset_gpu") < fake.calls.index("replace") < fake.calls.index("decommission")
    assert "health" not in fake.calls and "resume" not in fake.calls
    assert result.action == ActionClass.REPLACE_NODE and result.replacement_node == "gpu09"
    repair = next(st for st in result.stages if st.stage == Stage.REPAIR)
    assert repair.outcome == "gpu09 joined in place of gpu01"


async def test_no_spare_waits_for_capacity_within_its_bound_then_closes_no_capacity(env: WorkflowEnvironment) -> None:
    fake, s = FakeCluster(spares=0), settings()
    fake.settings = fake.settings.model_copy(update={"capacity_wait_s": 600, "capacity_retry_s": 120})
    async with worker(env, s, fake):
        result = await (await start_or_join(env.client, s, report(79))).result()
    assert result.outcome == "no_capacity"  # a named end, not a failed workflow
    assert fake.calls.count("replace") == 1 + 5  # once, then every 120 s for 600 s: nothing loops
    assert fake.calls.count("notify:awaiting_capacity") == 1  # told once
    waiting = next(st for st in result.stages if st.stage == Stage.AWAITING_CAPACITY)
    assert waiting.duration_s is not None and 600 <= waiting.duration_s < 800
    assert result.node_state == NodeState.AWAITING_REPLACEMENT
    assert "drained and out; replacement pending" in result.node_detail
    assert [r.left_drained for r in fake.releases] == [True]  # still out: the coordinator keeps counting it
    assert "decommission" not in fake.calls


@pytest.mark.parametrize(
    ("run", "line", "why"),
    [
        (0, {"signal": None}, "did not say it traps a signal"),
        # Just requeued onto this node: the comment is its run 0's, run 1 may not trap USR1 yet.
        (1, {"restart": 0}, "has not said yet that it traps a signal"),
    ],
)
async def test_a_job_that_asks_for_no_signal_is_not_signalled(
    env: WorkflowEnvironment, run: int, line: dict[str, object], why: str
) -> None:
    fake, s = FakeCluster(), settings()
    assert fake.job.progress is not None
    fake.job = fake.job.model_copy(update={"restart_count": run, "progress": fake.job.progress.model_copy(update=line)})
    async with worker(env, s, fake):
        result = await (await start_or_join(env.client, s, report(79))).result()
    assert "checkpoint" not in fake.calls and "confirm" not in fake.calls
    (account,) = result.jobs
    assert account.checkpoint is not None and account.checkpoint.signal is None
    assert why in account.checkpoint.detail
    assert account.fate == JobFate.REQUEUED  # still recovered: requeued and verified


async def test_observe_mode_records_the_plan_and_touches_nothing(env: WorkflowEnvironment) -> None:
    fake, s = FakeCluster(policy=FleetPolicy(mode="observe")), settings()
    async with worker(env, s, fake):
        result = await (await start_or_join(env.client, s, report(79))).result()
    assert result.outcome == "observed" and result.mode == "observe"
    assert fake.calls == ["look_up", "admit", "list_jobs", "notify:closed_observed", "metrics"]
    observe = next(st for st in result.stages if st.stage == Stage.OBSERVE)
    assert "would drain gpu01" in observe.outcome and "would requeue job 7" in observe.outcome
    assert result.node_state == NodeState.UNTOUCHED and result.node_detail == "untouched (observe mode)"
    assert [a.fate for a in result.jobs] == [JobFate.UNTOUCHED]


async def test_held_incident_is_contained_then_goes_when_granted(env: WorkflowEnvironment) -> None:
    fake, s = FakeCluster(grant=False), settings()
    async with worker(env, s, fake):
        handle = await start_or_join(env.client, s, report(79))
        await wait_for_stage(handle, Stage.HELD)
        await until_true(lambda: "notify:held" in fake.calls and "drain" in fake.calls, "contained: drained")
        assert "replace" not in fake.calls and "checkpoint" not in fake.calls
        assert fake.drain_reasons_sent == [f"{handle.id}: contained while held (nothing new lands on it): {XID_79}"]
        status = await handle.query(GpuRemediationWorkflow.status)
        assert status.held is not None and "test: held" in status.held
        await INCIDENT_CAPACITY.send(handle, GrantNotice(granted=True, reason="granted: a grant was released"))
        result = await handle.result()
    assert result.outcome == "resolved" and fake.calls.count("drain") == 1
    held = next(st for st in result.stages if st.stage == Stage.HELD)
    assert held.outcome == "granted: a grant was released"


@pytest.mark.parametrize("refused", [None, "not contained: 2 of 2 held nodes contained (the containment bound)"])
async def test_a_held_incident_hears_its_containment_with_its_request(
    env: WorkflowEnvironment, refused: str | None
) -> None:
    """One decision per incident: asked with the request (the policy drains held nodes), the
    answer says whether the node may be contained; no contain update of its own follows."""
    fake, s = FakeCluster(grant=False), settings()
    fake.contains_with_request, fake.contain = True, refused
    async with worker(env, s, fake):
        handle = await start_or_join(env.client, s, report(79))
        await wait_for_stage(handle, Stage.HELD)
        await until_true(lambda: "notify:held" in fake.calls, "the held notice")
        await until_true(lambda: ("drain" in fake.calls) == (refused is None), "contained as answered")
        assert "contain_while_held" not in fake.calls
        assert [r.contain_if_held for r in fake.requests] == [True]
        if refused is not None:
            status = await handle.query(GpuRemediationWorkflow.status)
            assert status.held is not None and refused in status.held
        await INCIDENT_CAPACITY.send(handle, GrantNotice(granted=True, reason="granted: a grant was released"))
        result = await handle.result()
    assert result.outcome == "resolved" and fake.calls.count("drain") == 1


async def test_a_held_incident_touches_nothing_while_the_breaker_is_tripped(env: WorkflowEnvironment) -> None:
    """A storm of false alerts must not drain the fleet: the coordinator refuses containment
    while its breaker is tripped, and the held incident drains nothing and says why (in its
    status and in its held notice), then goes on when granted."""
    fake, s = FakeCluster(grant=False), settings()
    fake.contain = "not contained: circuit breaker tripped (11 new incidents within 300 s); nothing new is drained"
    async with worker(env, s, fake):
        handle = await start_or_join(env.client, s, report(79))
        await wait_for_stage(handle, Stage.HELD)
        await until_true(lambda: "notify:held" in fake.calls, "the held notice")
        assert "contain_while_held" in fake.calls and "drain" not in fake.calls
        status = await handle.query(GpuRemediationWorkflow.status)
        assert status.held is not None and "not contained: circuit breaker tripped" in status.held
        held_note = next(n for n in fake.notes if n.event == "held")
        assert "not contained: circuit breaker tripped" in held_note.message
        await INCIDENT_CAPACITY.send(handle, GrantNotice(granted=True, reason="granted: breaker reset by alice"))
        result = await handle.result()
    assert result.outcome == "resolved" and fake.calls.count("drain") == 1  # drained only once granted


async def test_a_grant_that_comes_while_the_held_node_is_being_drained_is_not_lost(env: WorkflowEnvironment) -> None:
    """Fault injection: the coordinator grants while the containment drain is still running.
    The incident must go on at once, not wait out its bound (6 h) while its grant is counted."""
    fake, s = FakeCluster(grant=False), settings()
    fake.drain_gate = asyncio.Event()
    async with worker(env, s, fake):
        handle = await start_or_join(env.client, s, report(79))
        await asyncio.wait_for(fake.draining.wait(), 10)
        await INCIDENT_CAPACITY.send(handle, GrantNotice(granted=True, reason="granted: the line moved"))
        await asyncio.sleep(0.2)
        fake.drain_gate.set()
        result = await handle.result()
    held = next(st for st in result.stages if st.stage == Stage.HELD)
    assert held.outcome == "granted: the line moved"
    assert result.outcome == "resolved" and fake.calls.count("drain") == 1
    assert held.ended_at is not None and (held.ended_at - held.started_at).total_seconds() < 600


async def test_a_notice_receiver_down_never_fails_the_incident(env: WorkflowEnvironment) -> None:
    """Fault injection: every notice fails after its retries; the node is still remediated, and
    the incident's timeline says which notices were lost."""
    fake, s = FakeCluster(), settings()
    fake.notices_down = True
    async with worker(env, s, fake):
        handle = await start_or_join(env.client, s, report(79))
        result = await handle.result()
        status = await handle.query(GpuRemediationWorkflow.status)
    assert result.outcome == "resolved" and result.replacement_node is not None
    assert fake.calls.count("notify:remediating") > 1  # retried, then given up
    assert any(d.startswith("notice remediating undelivered") for d in status.done)


async def test_held_incident_ends_not_granted_at_its_bound(env: WorkflowEnvironment) -> None:
    fake, s = FakeCluster(grant=False, policy=FleetPolicy(max_hold_s=3600)), settings()
    async with worker(env, s, fake):
        result = await (await start_or_join(env.client, s, report(79))).result()
    assert result.outcome == "not_granted" and "not granted within 3600 s" in result.reason
    assert "replace" not in fake.calls and "requeue:7" not in fake.calls
    assert result.node_state == NodeState.DRAINED
    assert "drained by this incident" in result.node_detail
    assert [a.fate for a in result.jobs] == [JobFate.UNTOUCHED]
    assert "release_capacity" in fake.calls  # its place in line is given back
    assert [r.left_drained for r in fake.releases] == [True]  # not its contained node: still counted


async def test_late_report_for_a_node_gpuheal_replaced_names_the_replacement(env: WorkflowEnvironment) -> None:
    """22.05 answers "not found" for a FUTURE node: not a failed workflow but a named outcome
    that says by which node and in which incident it was replaced; nothing is touched."""
    earlier = EarlierReplacement(
        node="gpu01",
        replacement_node="gpu04",
        incident_id="gpuheal-test-gpu01",
        run_id="run-1",
        closed_at=datetime(2026, 11, 30, 3, 4, 5, tzinfo=UTC),
    )
    fake, s = FakeCluster(gone=frozenset({"gpu01"}), replaced=earlier), settings()
    async with worker(env, s, fake):
        result = await (await start_or_join(env.client, s, report(79))).result()
    assert result.outcome == "already_replaced"
    assert "replaced it by gpu04 in incident gpuheal-test-gpu01 (run run-1, closed 2026-11-30 03:04:05 UTC)" in (
        result.reason
    )
    assert result.node_state == NodeState.ALREADY_REPLACED and result.node_detail == "replaced earlier by gpu04"
    assert fake.calls == ["look_up", "find_earlier_replacement", "notify:closed_already_replaced", "metrics"]
    assert fake.notes[-1].severity == "warning" and "gpu04" in fake.notes[-1].message
    assert result.mttr_s is None and result.jobs == []


async def test_report_for_a_node_slurm_has_not_and_gpuheal_never_replaced_fails_fast(
    env: WorkflowEnvironment,
) -> None:
    fake, s = FakeCluster(gone=frozenset({"gpu01"})), settings()
    async with worker(env, s, fake):
        handle = await start_or_join(env.client, s, report(79))
        with pytest.raises(WorkflowFailureError) as err:
            await handle.result()
    assert "gpu01" in str(err.value.cause) and "not in service" in str(err.value.cause)
    assert fake.calls == ["look_up", "find_earlier_replacement"]


async def test_a_report_from_a_node_not_yet_in_service_ends_named_and_touches_nothing(
    env: WorkflowEnvironment,
) -> None:
    """A spare gpuheal claimed for a replacement whose join an outage stopped is in Slurm as
    FUTURE; its agent may report from it. Not a failed run (the issue 37 hour: two FAILED on
    one alert and its duplicate): a named ending, said, nothing held or touched, and news again
    once the node is in service."""
    fake, s = FakeCluster(), settings()
    fake.joining = frozenset({"gpu01"})
    async with worker(env, s, fake):
        result = await (await start_or_join(env.client, s, report(79))).result()
    assert result.outcome == "not_in_service" and "State=FUTURE" in result.reason
    assert fake.calls == ["look_up", "find_earlier_replacement", "notify:closed_not_in_service", "metrics"]
    assert result.node_state == NodeState.UNTOUCHED and result.jobs == []


async def test_an_escalation_to_a_drain_asks_the_coordinator_before_draining(env: WorkflowEnvironment) -> None:
    """An application-class failure takes no capacity; when a second, more severe report comes
    while the incident protects its jobs, it is admitted again as the hardware failure it now is
    (the coordinator counted no arrival for the application fault), and the drain it now needs
    asks for a grant first (it drained without one, past the budget and the breaker)."""
    fake, s = FakeCluster(), settings()
    fake.checkpoint_gate = asyncio.Event()
    first = report(13)
    async with worker(env, s, fake):
        handle = await start_or_join(env.client, s, first)
        await wait_for_stage(handle, Stage.PROTECT)
        assert "request_capacity" not in fake.calls
        await report_late(env, s, first)
        fake.checkpoint_gate.set()
        result = await handle.result()
    assert result.action == ActionClass.REPLACE_NODE
    assert fake.calls.count("admit") == 2, fake.calls
    readmitted = len(fake.calls) - 1 - fake.calls[::-1].index("admit")
    assert readmitted < fake.calls.index("request_capacity") < fake.calls.index("drain")


async def test_a_hardware_report_joining_an_application_fault_is_admitted_again_as_hardware(
    env: WorkflowEnvironment,
) -> None:
    """XID 13 (the application: counted towards no hardware verdict), then XID 94 on the same
    node while its jobs are asked to checkpoint: still a restart, but the board's memory. The
    incident is admitted again, as no application fault, so the coordinator counts it; a restart
    takes no capacity, so nothing is asked or drained."""
    fake, s = FakeCluster(), settings()
    fake.checkpoint_gate = asyncio.Event()
    first = report(13)
    async with worker(env, s, fake):
        handle = await start_or_join(env.client, s, first)
        await wait_for_stage(handle, Stage.PROTECT)
        await start_or_join(env.client, s, first.model_copy(update={"xid": 94, "observed_at": datetime.now(UTC)}))
        fake.checkpoint_gate.set()
        result = await handle.result()
    assert result.action == ActionClass.RESTART_APP
    assert fake.admitted == [True, False], fake.calls
    assert "request_capacity" not in fake.calls and "drain" not in fake.calls


@pytest.mark.parametrize(
    ("drained_by", "state", "says"),
    [
        (None, NodeState.IN_SERVICE, "in service (not drained)"),
        ("mine", NodeState.UNTOUCHED, "still drained by an earlier run of its incident"),
        ("ops: fan swap", NodeState.UNTOUCHED, "drained by someone else ('ops: fan swap')"),
    ],
)
async def test_an_application_restart_says_how_slurm_shows_its_node_at_the_close(
    env: WorkflowEnvironment, drained_by: str | None, state: NodeState, says: str
) -> None:
    """A restart drains nothing; its node's state at the close is read, not assumed: an earlier
    run of its incident (aborted) may have left it drained (issue 37's soak closed one "resolved:
    in service" on such a node), or someone else drained it. Untouched then, not drained: the
    earlier incident's state stands for the dedupe (dedupe.AS_FOUND)."""
    fake, s = FakeCluster(), settings()
    first = report(13)
    incident = ids.incident_id(first.cluster, first.node)
    if drained_by is not None:
        reason = policy.drain_reason(incident, "XID 79") if drained_by == "mine" else drained_by
        fake.drain_reasons[first.node] = reason
    async with worker(env, s, fake):
        result = await (await start_or_join(env.client, s, first)).result()
    assert result.action == ActionClass.RESTART_APP and "drain" not in fake.calls
    assert result.node_state == state and says in result.node_detail, result.node_detail
    if drained_by == "mine":
        assert f"gpuheal return {first.node}" in result.node_detail


# --- a more severe report after the plan (issue 34, item 3) -----------------------------------


async def report_late(env: WorkflowEnvironment, s: Settings, first: HealthReport, **more: Any) -> None:
    """An XID 79 on the first report's node and GPU, now (after the incident's plan was set)."""
    late = first.model_copy(update={"xid": 79, "observed_at": datetime.now(UTC), **more})
    await start_or_join(env.client, s, late)


async def _first_run_of(handle: Handle) -> tuple[str, list[str]]:
    """The incident's first run: how it closed, and its event types (a follow-up runs on after it)."""
    first = handle.result_run_id
    assert first is not None
    history = await handle._client.get_workflow_handle(handle.id, run_id=first).fetch_history()
    kinds = [e.WhichOneof("attributes") or "" for e in history.events]
    return kinds[-1], kinds


async def followed_up_from_verify(env: WorkflowEnvironment, xid: int) -> tuple[FakeCluster, Handle, RemediationResult]:
    """An incident for `xid` waits in verify_resume for its job's recovery; XID 79 comes. The
    follow-up run replaces the node while that recovery is still verifying (the test then lets
    it end), so the incident acted at once."""
    fake, s = FakeCluster(), settings()
    fake.verify_gate = asyncio.Event()
    first = report(xid)
    async with worker(env, s, fake):
        handle = await start_or_join(env.client, s, first)
        await wait_for_stage(handle, Stage.VERIFY)
        await report_late(env, s, first)
        await until_true(lambda: "replace" in fake.calls, "the follow-up replacing the node")
        assert not fake.verify_gate.is_set()  # acted on at once: the first run's verify never ended
        fake.verify_gate.set()
        result: RemediationResult = await handle.result()  # (follows the incident's runs)
    assert result.action == ActionClass.REPLACE_NODE and [r.xid for r in result.reports] == [79], result.reason
    assert result.outcome == "resolved" and "notify:closed_followed_up" in fake.calls
    return fake, handle, result


async def test_a_severe_report_while_an_application_restart_verifies_is_acted_on_at_once(
    env: WorkflowEnvironment,
) -> None:
    """XID 13: the job restarts where it ran, and the incident waits for its recovery's answer.
    XID 79 then: the GPU is gone. The incident stops waiting at once, closes `followed_up`, and a
    follow-up run of the same incident drains and replaces the node (the job requeued off it)."""
    fake, handle, _ = await followed_up_from_verify(env, 13)
    closed, _ = await _first_run_of(handle)
    assert closed == "workflow_execution_continued_as_new_event_attributes"
    assert fake.calls.index("notify:closed_followed_up") < fake.calls.index("drain")
    assert fake.admitted == [True, False], fake.calls  # the follow-up was admitted as hardware
    # each run gave back what it held, under the incident's key (its chain from the first run)
    assert [r.run_id for r in fake.releases] == [handle.result_run_id] * 2
    told = [n.key for n in fake.notes if n.event == "remediating"]
    assert len(told) == len(set(told)) == 2  # the follow-up's notices are news, not a repeat


async def test_a_severe_report_while_an_ignored_incident_closes_starts_a_follow_up(env: WorkflowEnvironment) -> None:
    """XID 63 (informational) is ignored; XID 79 on the same node arrives while that incident
    closes. It is not swallowed: a follow-up run replaces the node."""
    fake, s = FakeCluster(), settings()
    fake.close_gate = asyncio.Event()
    first = report(63).model_copy(update={"alert_key": "remap@1"})
    async with worker(env, s, fake):
        handle = await start_or_join(env.client, s, first)
        await wait_for_stage(handle, Stage.CLOSE)
        await report_late(env, s, first, alert_key="gone@1")
        fake.close_gate.set()
        result: RemediationResult = await handle.result()
    assert result.outcome == "resolved" and result.action == ActionClass.REPLACE_NODE, result.reason
    assert "notify:closed_ignored" in fake.calls and "decommission" in fake.calls
    # Each run names the alerts it acted on (a re-send is the same alert only for that run).
    assert handle.result_run_id is not None
    ignored = await env.client.get_workflow_handle(handle.id, run_id=handle.result_run_id).describe()
    assert ignored.typed_search_attributes.get(ALERT_KEYS) == ["remap@1"]
    assert (await handle.describe()).typed_search_attributes.get(ALERT_KEYS) == ["gone@1"]


async def test_a_severe_report_while_a_reset_verifies_keeps_the_node_drained_for_the_follow_up(
    env: WorkflowEnvironment,
) -> None:
    """XID 48 (reset), then XID 79 while the reset node's jobs are verified: the node is never
    resumed (a health check that says "Ready" says nothing of a GPU gone). The run stops waiting,
    closes `followed_up` with the node kept drained, and the follow-up replaces it at once."""
    fake, _, _ = await followed_up_from_verify(env, 48)
    assert "resume" not in fake.calls and "health" not in fake.calls, fake.calls
    assert [r.left_drained for r in fake.releases] == [True, False]  # counted until the follow-up took it


async def test_a_severe_report_while_a_reset_drains_escalates_the_run_itself(env: WorkflowEnvironment) -> None:
    """XID 48 (reset) is draining its node, its jobs checkpointing beside the drain, when XID 79
    comes: before the plan is set, so the run itself escalates to a replacement (no reset, no
    follow-up, never resumed). Incidents before the early steps went side by side drained after
    the plan and followed up instead (tests/histories replay that path)."""
    fake, s = FakeCluster(), settings()
    fake.drain_gate = asyncio.Event()
    first = report(48)
    async with worker(env, s, fake):
        handle = await start_or_join(env.client, s, first)
        await until_true(fake.draining.is_set, "the reset's drain")
        await report_late(env, s, first)
        await until_true(lambda: handle_reports(handle, 2), "the late report received")
        fake.drain_gate.set()
        result: RemediationResult = await handle.result()
    assert result.action == ActionClass.REPLACE_NODE and [r.xid for r in result.reports] == [48, 79], result.reason
    assert result.outcome == "resolved" and "replace" in fake.calls, result.reason
    assert "repair:reset_gpu" not in fake.calls and "resume" not in fake.calls
    assert "notify:closed_followed_up" not in fake.calls and fake.calls.count("drain") == 1


async def handle_reports(handle: Handle, n: int) -> bool:
    return (await handle.query(GpuRemediationWorkflow.status)).reports_received >= n


@pytest.mark.parametrize(("xid", "avoided"), [(79, ("gpu01",)), (13, ())])
async def test_a_requeued_jobs_deadline_counts_from_when_it_runs_again(
    env: WorkflowEnvironment, xid: int, avoided: tuple[str, ...]
) -> None:
    """Its recovery gives the job its whole verify timeout from when it runs again, within an
    outer bound that leaves room to wait in Slurm first (a replacement, its burn-in); only a node
    it was requeued away from is a wrong place to run (an application restart avoids none)."""
    fake, s = FakeCluster(), settings()
    async with worker(env, s, fake):
        await (await start_or_join(env.client, s, report(xid))).result()
    ((asked_at, req),) = fake.verify_requests
    jobs = fake.settings.jobs
    assert req.run_for_s == jobs.verify_timeout_s and req.avoid_nodes == avoided
    assert req.deadline_at - asked_at >= jobs.start_wait_s + jobs.verify_timeout_s - 5


async def test_an_incident_granted_with_its_admission_asks_no_more(env: WorkflowEnvironment) -> None:
    """One decision per incident (a coordinator with admit_and_request_many): the admission at
    triage asks for capacity too, the grant comes with it, and no request of its own follows."""
    fake, s = FakeCluster(), settings()
    fake.decides_with_admission = True
    async with worker(env, s, fake):
        handle = await start_or_join(env.client, s, report(79))
        result = await handle.result()
    assert result.outcome == "resolved"
    assert [(a.ask_capacity, a.contain_if_held) for a in fake.admit_asks] == [(True, True)]
    assert "request_capacity" not in fake.calls
    node_calls = [c for c in fake.calls if c in NODE_SIDE]
    assert node_calls[:2] == ["look_up", "admit"]  # then straight to the early steps
    assert node_calls[2] in {"notify:remediating", "drain", "list_jobs"}, node_calls
    assert fake.calls.count("drain") == 1 and len(fake.releases) == 1


async def test_an_incident_held_with_its_admission_is_contained_as_answered(env: WorkflowEnvironment) -> None:
    """Held in the admission's answer, with its containment: drained as containment, asking
    neither a request nor a contain of its own; granted later by a notice, it goes on."""
    fake, s = FakeCluster(grant=False), settings()
    fake.decides_with_admission = True
    async with worker(env, s, fake):
        handle = await start_or_join(env.client, s, report(79))
        await wait_for_stage(handle, Stage.HELD)
        await until_true(lambda: "drain" in fake.calls, "contained as answered")
        assert "request_capacity" not in fake.calls and "contain_while_held" not in fake.calls
        await INCIDENT_CAPACITY.send(handle, GrantNotice(granted=True, reason="granted: a grant was released"))
        result = await handle.result()
    assert result.outcome == "resolved" and fake.calls.count("drain") == 1


async def test_a_triage_that_fails_after_its_admission_asked_for_capacity_gives_it_back(
    env: WorkflowEnvironment,
) -> None:
    """The admission asked for capacity and did not come back (its attempts spent: the coordinator
    may have granted it all the same): the run fails in triage, its release sent first, so no
    grant waits for the look for closed runs."""
    fake, s = FakeCluster(), settings()
    fake.decides_with_admission, fake.admit_fails = True, True
    async with worker(env, s, fake):
        handle = await start_or_join(env.client, s, report(79))
        with pytest.raises(WorkflowFailureError):
            await handle.result()
    assert [a.ask_capacity for a in fake.admit_asks] == [True]
    assert [bool(r.run_id) for r in fake.releases] == [True] and "drain" not in fake.calls
