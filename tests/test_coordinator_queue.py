"""The coordinator's own activities run on a queue of their own (gpuheal.core.ids.coordinator_queue).

In a storm every slot of the incidents' queue is held by an incident's activity waiting for the
coordinator's answer. A fresh coordinator answers nothing before it has rebuilt its books, and
its rebuild is an activity: on the incidents' queue it would wait behind them, they for it, until
REBUILD_WAIT_S (10 minutes) tripped the breaker (bench/results/README.md, the storm stall)."""

from __future__ import annotations

import asyncio
import uuid

from temporalio import activity
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from gpuheal.core import ids
from gpuheal.core import messages as m
from gpuheal.core.fleet.policy import BudgetPolicy, FleetPolicy
from gpuheal.core.settings import Settings
from gpuheal.workers.main import COORDINATOR_ACTIVITY_SLOTS, Workers, deployment, make_worker
from gpuheal.workflows.domain import DomainIncidentWorkflow
from gpuheal.workflows.fleet import FleetCoordinator
from tests.holder import Holder, SlotHolder
from tests.test_coordinator_faults import Receiver, ask, coordinator, holder

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
    own = Worker(env.client, task_queue=ids.coordinator_queue(queue), activities=acts)
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
    assert configs[1].get("max_concurrent_activities") == COORDINATOR_ACTIVITY_SLOTS and not configs[1].get("workflows")
    assert configs[1].get("activities") == served


def test_a_workflow_an_activity_starts_runs_on_the_clusters_queue_whichever_queue_the_activity_ran_on() -> None:
    """A domain incident is opened by the coordinator's activity, on its own queue; it must run
    where the cluster's workflows run, or nothing ever runs it (tests/integration/test_fleet.py)."""
    assert ids.workflows_queue(ids.coordinator_queue("gpu-east")) == "gpu-east"
    assert ids.workflows_queue("gpu-east") == "gpu-east"
