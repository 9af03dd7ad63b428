"""The coordinator's own activities run on a queue of their own (gpuheal.core.ids.coordinator_queue).

In a storm every slot of the incidents' queue is held by an incident's activity waiting for the
coordinator's answer. A fresh coordinator answers nothing before it has rebuilt its books, and
its rebuild is an activity: on the incidents' queue it would wait behind them, they for it, until
REBUILD_WAIT_S (10 minutes) tripped the breaker (bench/results/README.md, the storm stall)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio import activity, workflow
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from gpuheal.core import ids
from gpuheal.core import messages as m
from gpuheal.core.fleet.policy import BudgetPolicy, FleetPolicy
from gpuheal.core.settings import Settings
from gpuheal.workers.main import COORDINATOR_ACTIVITY_SLOTS, Workers, deployment, make_worker, move_coordinator_home
from gpuheal.workflows.coordinator.versions import OWN_WORKFLOW_QUEUE
from gpuheal.workflows.domain import DomainIncidentWorkflow
from gpuheal.workflows.fleet import FleetCoordinator
from tests.holder import Holder, SlotHolder
from tests.test_coordinator_faults import Receiver, ask, coordinator, holder, worker

# The fixture: a time-skipping server of the test's own, its coordinators recorded on request.
from tests.test_coordinator_faults import env as env

SLOTS = 2  # the incidents' queue's activity slots (a worker has 100; a storm holds them all)


async def test_a_fresh_coordinator_rebuilds_while_the_incidents_hold_every_slot(env: WorkflowEnvironment) -> None:
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    holding, all_held, let_go = 0, asyncio.Event(), asyncio.Event()

    @activity.defn(name="hold_a_slot")
    async def hold_a_slot() -> None:
        nonlocal holding
        holding += 1
        if holding == SLOTS:
            all_held.set()
        await let_go.wait()

    acts = [*receiver.activities(), hold_a_slot]
    incidents = Worker(
        env.client,
        task_queue=queue,
        workflows=[FleetCoordinator, DomainIncidentWorkflow, Holder, SlotHolder],
        activities=acts,
        max_concurrent_activities=SLOTS,
    )
    own = Worker(env.client, task_queue=ids.coordinator_queue(queue), workflows=[FleetCoordinator], activities=acts)
    async with Workers(incidents, own):
        waiting = [
            await env.client.start_workflow("SlotHolder", id=f"w{i}-{queue}", task_queue=queue) for i in range(SLOTS)
        ]
        await asyncio.wait_for(all_held.wait(), 60)  # every slot of the incidents' queue taken
        policy = FleetPolicy(budget=BudgetPolicy(cluster="5", node_cooldown_s=0))
        fresh = await coordinator(env, queue, policy)  # started afresh: it rebuilds before it decides
        incident, run = await holder(env, queue, "gpu01")
        decision = await asyncio.wait_for(m.FLEET_REQUEST_CAPACITY.execute(fresh, ask(incident.id, "gpu01", run)), 60)
        assert decision.granted, decision.reason
        status = await m.FLEET_STATUS.ask(fresh)
        assert not status.breaker.tripped and [g.incident_id for g in status.out_of_service] == [incident.id]
        let_go.set()
        for w in waiting:
            await w.result()
        await fresh.terminate("test over")
        await incident.terminate("test over")


async def test_every_worker_serves_the_coordinators_queue_beside_its_own(env: WorkflowEnvironment) -> None:
    """What the product's worker process runs (make_worker): both queues, one build, slots apart."""
    s = Settings(task_queue="gpu-east", cluster="east", build_id="v7")
    served = Receiver(up=True).activities()
    workers = make_worker(env.client, s, activities=served, workflows=[FleetCoordinator])
    configs = [w.config() for w in workers.workers]
    assert [c["task_queue"] for c in configs] == ["gpu-east", "gpu-east-coordinator"]
    assert [c.get("deployment_config") for c in configs] == [deployment(s)] * 2  # the same build's pollers
    assert configs[1].get("max_concurrent_activities") == COORDINATOR_ACTIVITY_SLOTS
    assert configs[1].get("workflows") == [FleetCoordinator] and configs[1].get("activities") == served
    # Apart (GPUHEAL_WORKER_SERVES): the incidents' process, and the coordinator's own
    for serves, queues in (("incidents", ["gpu-a"]), ("coordinator", ["gpu-b-coordinator"])):  # (a queue each)
        alone = s.model_copy(update={"worker_serves": serves, "task_queue": queues[0].removesuffix("-coordinator")})
        apart = make_worker(env.client, alone, served, [FleetCoordinator])
        assert [w.config()["task_queue"] for w in apart.workers] == queues


def test_a_workflow_an_activity_starts_runs_on_the_clusters_queue_whichever_queue_the_activity_ran_on() -> None:
    """A domain incident is opened by the coordinator's activity, on its own queue; it must run
    where the cluster's workflows run, or nothing ever runs it (tests/integration/test_fleet.py)."""
    assert ids.workflows_queue(ids.coordinator_queue("gpu-east")) == "gpu-east"
    assert ids.workflows_queue("gpu-east") == "gpu-east"


async def test_a_coordinator_on_the_clusters_queue_moves_to_its_own_with_its_books(env: WorkflowEnvironment) -> None:
    """Started there by the release before (or recreated by one), it continues as new onto its
    own queue at once: a storm's incidents never share its queue again. What it granted stays
    counted across the move, and it decides on its own queue."""
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    policy = FleetPolicy(budget=BudgetPolicy(cluster="1", node_cooldown_s=0))
    async with worker(env, queue, receiver):
        started = await coordinator(env, queue, policy, on=queue)
        latest = env.client.get_workflow_handle(started.id)
        first, run1 = await holder(env, queue, "gpu01")
        assert (await m.FLEET_REQUEST_CAPACITY.execute(latest, ask(first.id, "gpu01", run1))).granted

        for _ in range(300):  # continued as new at its next task, onto its own queue
            found = (await latest.describe()).task_queue
            if found != queue:
                break
            await env.sleep(0.2)
        assert found == ids.coordinator_queue(queue)
        history = await env.client.get_workflow_handle(started.id, run_id=started.result_run_id).fetch_history()
        last = history.events[-1].workflow_execution_continued_as_new_event_attributes
        assert last.task_queue.name == ids.coordinator_queue(queue)
        second, run2 = await holder(env, queue, "gpu02")
        decision = await m.FLEET_REQUEST_CAPACITY.execute(latest, ask(second.id, "gpu02", run2))
        assert not decision.granted  # the budget of 1 is gpu01's, carried across the move
        status = await m.FLEET_STATUS.ask(latest)
        assert [g.incident_id for g in status.out_of_service] == [first.id]
        assert [h.incident_id for h in status.held] == [second.id]
        for w in (latest, first, second):
            await w.terminate("test over")


async def test_a_running_coordinator_taken_over_on_the_clusters_queue_moves_when_a_worker_starts(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of the release before, running when the workers are upgraded: replayed, it has no
    OWN_WORKFLOW_QUEUE marker, so run() keeps it on the cluster's queue. A worker of this release
    asks it to move at its start (move_coordinator_home); it moves with its books."""
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    policy = FleetPolicy(budget=BudgetPolicy(cluster="1", node_cooldown_s=0))
    real = workflow.patched
    with monkeypatch.context() as release_before:  # a run that never asked the marker
        release_before.setattr(workflow, "patched", lambda patch: False if patch == OWN_WORKFLOW_QUEUE else real(patch))
        old_build = Worker(
            env.client,
            task_queue=queue,
            workflows=[FleetCoordinator, Holder],
            activities=receiver.activities(),
            workflow_runner=UnsandboxedWorkflowRunner(),
            max_cached_workflows=0,  # no sticky queue to time out on (the test server never does)
        )
        async with Workers(
            old_build, Worker(env.client, task_queue=ids.coordinator_queue(queue), activities=receiver.activities())
        ):
            started = await coordinator(env, queue, policy, on=queue)
            first, run1 = await holder(env, queue, "gpu01")
            latest = env.client.get_workflow_handle(started.id)
            assert (await m.FLEET_REQUEST_CAPACITY.execute(latest, ask(first.id, "gpu01", run1))).granted
    cluster = started.id.removeprefix("gpuheal-").removesuffix("-fleet")
    async with worker(env, queue, receiver):  # this release's workers take it over: it stays, replayed
        assert (await latest.describe()).task_queue == queue
        await move_coordinator_home(env.client, Settings(task_queue=queue, cluster=cluster))
        for _ in range(300):
            found = (await latest.describe()).task_queue
            if found != queue:
                break
            await env.sleep(0.2)
        assert found == ids.coordinator_queue(queue)
        status = await m.FLEET_STATUS.ask(latest)
        assert [g.incident_id for g in status.out_of_service] == [first.id]
        await move_coordinator_home(env.client, Settings(task_queue=queue, cluster=cluster))  # moved: nothing sent
        for w in (latest, first):
            await w.terminate("test over")
