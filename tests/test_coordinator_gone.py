"""An incident whose coordinator is gone (unreachable, or recreated without it), on Temporal's
time-skipping test server with stand-in activities (tests/fakes.py).

Every ending is named: a run that failed instead is taken by dedupe for one that handled nothing,
and its node is remediated again. A request or a confirmation unanswered after its attempts ends
the incident `not_granted`, its jobs accounted for; a release unanswered at the close leaves the
result as it was and says the coordinator's look for closed runs gives back what the run held.
A held incident asks again every REASK_S, so a coordinator that lost its place in line still
grants it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from gpuheal.activities import interface as act
from gpuheal.activities.interface import implements
from gpuheal.clients.temporal import DATA_CONVERTER
from gpuheal.core.fleet.models import CapacityDecision, CapacityRequest, ReleaseRequest
from gpuheal.core.fleet.policy import FleetPolicy
from gpuheal.core.fleet.reaping import REAP_EVERY_S
from gpuheal.core.models.base import NodeState, Stage
from gpuheal.core.models.report import HealthReport
from gpuheal.core.models.result import JobFate, RemediationResult
from gpuheal.core.settings import Settings
from gpuheal.triggers import start
from gpuheal.workflows.incident.capacity import REASK_S
from gpuheal.workflows.job_recovery import JobRecoveryWorkflow
from gpuheal.workflows.remediation import GpuRemediationWorkflow
from tests.fakes import FakeCluster

Handle = WorkflowHandle[GpuRemediationWorkflow, RemediationResult]
COORDINATOR_CALLS = {act.REQUEST_CAPACITY.name, act.CONFIRM_CAPACITY.name, act.RELEASE_CAPACITY.name}


async def start_or_join(client: Any, s: Settings, report: HealthReport) -> Any:
    """Each test's reports name a cluster of their own (unique workflow ids on the shared test
    server): the settings are that cluster's, as a real worker's are its own."""
    return await start.start_or_join(client, s.model_copy(update={"cluster": report.cluster}), report)


class GoneCoordinator(FakeCluster):
    """A coordinator that admitted the incident, then: the calls in `down` fail at every attempt
    (gone, or unreachable); a request is answered `answers` in turn (the last one again after)."""

    def __init__(self, down: Sequence[str] = (), answers: Sequence[bool] = (True,), **kw: Any) -> None:
        super().__init__(**kw)
        self.down, self.answers = set(down), list(answers)

    def fleet_activities(self) -> list[Callable[..., Any]]:
        c = self

        def refuse(call: str) -> None:
            c.calls.append(call)
            if call in c.down:
                raise ApplicationError("workflow not found: the cluster's coordinator is gone")

        @implements(act.REQUEST_CAPACITY)
        async def request(req: CapacityRequest) -> CapacityDecision:
            refuse("request_capacity")
            granted = c.answers.pop(0) if len(c.answers) > 1 else c.answers[0]
            return CapacityDecision(granted=granted, reason="granted" if granted else "test: held", position=1)

        @implements(act.CONFIRM_CAPACITY)
        async def confirm(req: CapacityRequest) -> CapacityDecision:
            refuse("confirm_capacity")
            return CapacityDecision(granted=True, reason="still granted", already=True)

        @implements(act.RELEASE_CAPACITY)
        async def release(req: ReleaseRequest) -> str:
            c.releases.append(req)
            refuse("release_capacity")
            return "released"

        kept = [f for f in super().fleet_activities() if _name(f) not in COORDINATOR_CALLS]
        return [*kept, request, confirm, release]


def _name(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__temporal_activity_definition").name)


def report() -> HealthReport:
    return HealthReport(node="gpu01", cluster=f"c{uuid.uuid4().hex[:8]}", xid=79, gpu=0, observed_at=datetime.now(UTC))


async def remediate(env: WorkflowEnvironment, fake: FakeCluster) -> tuple[RemediationResult, list[str], Handle]:
    """The incident run to its end: its result (a failed run raises), its `done` list, its handle.
    Its history then replays through the workflow (the new paths and their patch markers)."""
    s = Settings(task_queue=f"tq-{uuid.uuid4()}", cluster="test")
    workflows = [GpuRemediationWorkflow, JobRecoveryWorkflow]
    async with Worker(env.client, task_queue=s.task_queue, workflows=workflows, activities=fake.activities()):
        handle = await start_or_join(env.client, s, report())
        result = await handle.result()
        status = await handle.query(GpuRemediationWorkflow.status)
    replayer = Replayer(workflows=[GpuRemediationWorkflow], data_converter=DATA_CONVERTER)
    await replayer.replay_workflow(await handle.fetch_history())
    return result, status.done, handle


async def test_a_request_no_coordinator_answers_ends_not_granted_with_nothing_touched(
    env: WorkflowEnvironment,
) -> None:
    fake = GoneCoordinator(down=("request_capacity", "release_capacity"))
    result, done, handle = await remediate(env, fake)
    assert (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED  # not failed
    assert result.outcome == "not_granted"
    assert "the cluster's coordinator did not answer the request for capacity (" in result.reason
    assert "coordinator is gone" in result.reason
    assert "the node is untouched" in result.reason and "`gpuheal fleet`" in result.reason
    assert f"gpuheal report --cluster {result.cluster} --node gpu01 --xid 79 --gpu 0" in result.reason
    assert result.node_state == NodeState.UNTOUCHED
    assert [(a.job_id, a.fate) for a in result.jobs] == [(7, JobFate.UNTOUCHED)]  # accounted for, left running
    assert fake.calls.count("request_capacity") > 1  # retried, then given up
    assert not {"drain", "checkpoint", "requeue:7", "replace"} & set(fake.calls)
    assert any(d.startswith("release did not land") for d in done)


async def test_a_confirmation_no_coordinator_answers_is_a_grant_that_does_not_stand(env: WorkflowEnvironment) -> None:
    fake = GoneCoordinator(down=("confirm_capacity",))
    result, _, handle = await remediate(env, fake)
    assert (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED
    assert result.outcome == "not_granted"
    assert "did not answer the confirmation of its grant" in result.reason
    assert "gpu01 is drained by this incident; not replaced" in result.reason
    assert "gpuheal return gpu01" in result.reason and "the coordinator counts it as left" in result.reason
    assert result.node_state == NodeState.DRAINED  # drained by us, not replaced
    assert "replace" not in fake.calls and fake.calls.count("confirm_capacity") > 1
    assert [(a.job_id, a.fate) for a in result.jobs] == [(7, JobFate.REQUEUED)]  # went to its recovery
    (release,) = fake.releases
    assert release.left_drained and release.placement is not None and release.placement.node == "gpu01"


async def test_a_release_no_coordinator_answers_leaves_the_result_and_says_the_reaper_gives_it_back(
    env: WorkflowEnvironment,
) -> None:
    fake = GoneCoordinator(down=("release_capacity",))
    result, done, handle = await remediate(env, fake)
    assert (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED
    assert result.outcome == "resolved" and result.replacement_node == "gpu09"
    assert fake.calls.count("release_capacity") > 1 and "metrics" in fake.calls
    assert all(r.placement is not None for r in fake.releases)  # a release the books lost still counts its node
    (line,) = [d for d in done if d.startswith("release did not land")]
    assert "coordinator is gone" in line
    assert f"the coordinator's look for closed runs (every {REAP_EVERY_S:g} s) gives back what this run held" in line
    assert "counted as left" not in line  # replaced: nothing of it is left drained


async def test_a_release_unanswered_for_a_node_left_drained_says_it_stays_counted(env: WorkflowEnvironment) -> None:
    fake = GoneCoordinator(down=("release_capacity",), spares=0)
    fake.settings = fake.settings.model_copy(update={"capacity_wait_s": 600, "capacity_retry_s": 300})
    result, done, _ = await remediate(env, fake)
    assert result.outcome == "no_capacity" and result.node_state == NodeState.AWAITING_REPLACEMENT
    (line,) = [d for d in done if d.startswith("release did not land")]
    assert "gpu01, still drained by it, stays counted as left until it is back" in line


async def test_a_held_incident_whose_coordinator_lost_its_place_is_granted_when_it_asks_again(
    env: WorkflowEnvironment,
) -> None:
    """Held; the coordinator is recreated without it in its line: no grant notice ever comes. The
    second time it asks again, the coordinator grants it; the wait ends then, not at the bound."""
    fake = GoneCoordinator(answers=(False, False, True), policy=FleetPolicy(max_hold_s=6 * 3600))
    result, _, _ = await remediate(env, fake)
    assert result.outcome == "resolved" and result.replacement_node == "gpu09"
    assert fake.calls.count("request_capacity") == 3  # asked, then again at REASK_S and 2 x REASK_S
    held = next(st for st in result.stages if st.stage == Stage.HELD)
    assert held.outcome == "granted when asked again: granted"
    assert held.duration_s is not None and 2 * REASK_S <= held.duration_s < 3 * REASK_S


async def test_a_held_incident_asks_again_only_until_its_bound(env: WorkflowEnvironment) -> None:
    fake = GoneCoordinator(answers=(False,), policy=FleetPolicy(max_hold_s=1000))
    result, _, _ = await remediate(env, fake)
    assert result.outcome == "not_granted" and "not granted within 1000 s" in result.reason
    assert fake.calls.count("request_capacity") == 1 + 3  # again at 300, 600 and 900 s; not past 1000
    held = next(st for st in result.stages if st.stage == Stage.HELD)
    assert held.duration_s is not None and 1000 <= held.duration_s < 1000 + REASK_S
