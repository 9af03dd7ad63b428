"""The coordinator apart (docs/design/010-the-coordinator-apart.md), on Temporal's time-skipping
server with the real coordinator: a held incident hears its containment in the answer to its
request, within the bound; the memo is written at most once a second however fast it decides."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from gpuheal.activities.fleet import FleetActivities
from gpuheal.core import ids
from gpuheal.core import messages as m
from gpuheal.core.fleet.models import CapacityDecision, CapacityRequests, Placement
from gpuheal.core.fleet.policy import BudgetPolicy, FleetPolicy
from gpuheal.core.models.base import ActionClass
from gpuheal.core.models.incident import RemediationSettings
from gpuheal.workflows.coordinator.versions import MEMO_EVERY_S
from tests.conftest import start_time_skipping
from tests.test_coordinator_faults import Receiver, ask, coordinator, env, holder, worker

__all__ = ["env"]  # the fixture, shared with tests/test_coordinator_faults.py
POLICY = FleetPolicy(budget=BudgetPolicy(cluster="1", node_cooldown_s=0), containment_limit="2")
UPSERTED = EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED


async def test_held_incidents_hear_their_containment_with_their_requests_within_the_bound(
    env: WorkflowEnvironment,
) -> None:
    """Budget 1, bound 2: gpu01 granted; gpu02-05 held in one batch, asking their containment
    with it. The first two are contained, the others told why not, in the same answers; no
    `contain` update reaches the coordinator."""
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    async with worker(env, queue, receiver):
        handle = await coordinator(env, queue, POLICY)
        cluster = handle.id.removeprefix("gpuheal-").removesuffix("-fleet")
        first, run1 = await holder(env, queue, "gpu01")
        assert (await m.FLEET_REQUEST_CAPACITY.execute(handle, ask(first.id, "gpu01", run1))).granted
        held = [await holder(env, queue, f"gpu{i:02d}") for i in range(2, 6)]
        reqs = tuple(
            ask(h.id, f"gpu{i:02d}", run).model_copy(update={"contain_if_held": True, "cluster": cluster})
            for i, (h, run) in enumerate(held, 2)
        )
        answers = (await m.FLEET_REQUEST_CAPACITY_MANY.execute(handle, CapacityRequests(requests=reqs))).answers
        assert [(a.granted, a.position, a.contained) for a in answers] == [
            (False, 1, True),
            (False, 2, True),
            (False, 3, False),
            (False, 4, False),
        ]
        assert "containment bound" in answers[2].containment, answers[2].containment
        again = await m.FLEET_REQUEST_CAPACITY.execute(handle, reqs[0])  # asked again: the same answer
        assert (again.granted, again.contained, again.position) == (False, True, 1)
        status = await m.FLEET_STATUS.ask(handle)
        assert [g.incident_id for g in status.out_of_service] == [first.id]
        updates = [
            e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
            for e in (await handle.fetch_history()).events
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
        ]
        assert m.FLEET_CONTAIN.name not in updates  # (none asked: the answers above were all it took)
        for _ in range(50):  # the memo follows within MEMO_EVERY_S
            view = await m.FLEET_VIEW.read(handle)
            if view is not None and view.containing == 2:
                break
            await env.sleep(0.2)
        assert view is not None and view.containment is not None and view.containment.used == 2


async def test_the_memo_is_written_at_most_once_a_second(env: WorkflowEnvironment) -> None:
    """Twenty requests, each its own update and workflow task, each changing a figure: the view
    is written anew at most every MEMO_EVERY_S (of workflow time), and ends up true."""
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    async with worker(env, queue, receiver):
        handle = await coordinator(env, queue, POLICY)
        for i in range(1, 21):
            h, run = await holder(env, queue, f"gpu{i:02d}")
            await m.FLEET_REQUEST_CAPACITY.execute(handle, ask(h.id, f"gpu{i:02d}", run))
        for _ in range(100):  # the last write comes at most a second after the last change
            view = await m.FLEET_VIEW.read(handle)
            if view is not None and view.held == 19:
                break
            await env.sleep(0.2)
        assert view is not None and (view.out, view.held) == (1, 19)
        events = (await handle.fetch_history()).events
    # The pace counts in workflow time: a task's now is its start (WORKFLOW_TASK_STARTED), not its
    # completion, which a loaded machine delays. One task may write the view and the levers' keys.
    writes, started = set(), None
    for e in events:
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            started = e.event_time.ToDatetime()
        elif e.event_type == UPSERTED and started is not None:
            writes.add(started)
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(sorted(writes))]
    assert writes and all(g >= MEMO_EVERY_S - 0.01 for g in gaps), gaps
    assert len(writes) < 20, f"{len(writes)} memo writes for 20 decisions"


class OldCapacityRequest(BaseModel):
    """CapacityRequest as the release before declared it: no contain_if_held, unknown fields refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    cluster: str
    incident_id: str
    placement: Placement
    action: ActionClass
    run_id: str = ""


@workflow.defn(name=m.COORDINATOR.name)
class OldCoordinator:
    """The coordinator of the release before, as far as a capacity request goes."""

    def __init__(self) -> None:
        self.asked: list[OldCapacityRequest] = []

    @workflow.run
    async def run(self, inp: dict[str, Any]) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.update(name=m.FLEET_REQUEST_CAPACITY.name)
    def request(self, req: OldCapacityRequest) -> CapacityDecision:
        self.asked.append(req)
        return CapacityDecision(granted=False, reason="held by the release before", position=1)


async def test_a_coordinator_of_the_release_before_is_asked_as_that_release_asks() -> None:
    """During a rollout an incident of this release may ask a coordinator still on the release
    before, which refuses the new field: the worker asks again without it (the incident then asks
    `contain` after, as that release's incidents did). (A server of its own: this stand-in for the
    old coordinator is no history to record.)"""
    env = await start_time_skipping()
    try:
        await _ask_the_release_before(env)
    finally:
        await env.shutdown()


async def _ask_the_release_before(env: WorkflowEnvironment) -> None:
    fleet = FleetActivities(None, None, FleetPolicy(), RemediationSettings(), (), 1, cluster="east")  # type: ignore[arg-type]
    req = ask("gpuheal-east-gpu01", "gpu01", "r1").model_copy(update={"cluster": "east", "contain_if_held": True})
    activities = ActivityEnvironment(client=env.client)
    queue = ids.coordinator_queue(activities.info.task_queue)
    async with Worker(
        env.client, task_queue=queue, workflows=[OldCoordinator], workflow_runner=UnsandboxedWorkflowRunner()
    ):
        answer = await activities.run(fleet.request_capacity, req)
        # and for a while, asked so at once (a storm's batches stay batches meanwhile)
        assert "east" in fleet._contain_apart_until
        again = await activities.run(fleet.request_capacity, req.model_copy(update={"run_id": "r2"}))
        await env.client.get_workflow_handle(ids.coordinator_id("east")).terminate("test over")
    for a in (answer, again):
        assert (a.granted, a.reason, a.contained) == (False, "held by the release before", None)
