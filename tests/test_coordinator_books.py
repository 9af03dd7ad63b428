"""The coordinator's books under the faults issue 32 found (Temporal's time-skipping server, the
real coordinator workflow): a recreation within visibility's lag, a rebuild that fails for a
while, a node an operator returns, a held incident waiting on a node left drained."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError
from temporalio.testing import WorkflowEnvironment

from gpuheal.core import ids
from gpuheal.core import messages as m
from gpuheal.core.fleet import reaping
from gpuheal.core.fleet.models import (
    AdmitRequest,
    CoordinatorInput,
    FleetStatus,
    NodeReturn,
    OpenIncident,
    OpenIncidents,
    OperatorAction,
    ReleaseRequest,
)
from gpuheal.core.fleet.policy import BudgetPolicy, FleetPolicy
from gpuheal.core.models.base import ActionClass, Stage
from gpuheal.workflows.coordinator.reconcile import VISIBILITY_LAG_S
from tests.test_coordinator_faults import Receiver, ask, coordinator, env, holder, placement, worker

__all__ = ["env"]  # the fixture, shared with tests/test_coordinator_faults.py

POLICY = FleetPolicy(budget=BudgetPolicy(cluster="1", node_cooldown_s=0))


async def test_a_coordinator_recreated_before_its_earlier_run_shows_still_rebuilds(env: WorkflowEnvironment) -> None:
    """Terminated by hand, recreated within a second: visibility does not show the earlier run
    closed yet, but gpu01's incident is open and granted. The fresh coordinator counts it and
    starts tripped; the next incident is held, not granted past the budget of one."""
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    async with worker(env, queue, receiver):
        old = await coordinator(env, queue, POLICY)
        cluster = old.id.removeprefix("gpuheal-").removesuffix("-fleet")
        first, run1 = await holder(env, queue, "gpu01")
        assert (await m.FLEET_REQUEST_CAPACITY.execute(old, ask(first.id, "gpu01", run1))).granted
        await old.terminate("an operator, by hand")
        opened = OpenIncident(incident_id=first.id, run_id=run1, placement=placement("gpu01"), stage=Stage.REPAIR)
        receiver.open = OpenIncidents(incidents=(opened,), earlier_run="")  # not visible yet
        fresh = await env.client.start_workflow(
            m.COORDINATOR.name,
            CoordinatorInput(cluster=cluster, seed=POLICY, on_own_queue=True),
            id=old.id,
            task_queue=ids.coordinator_queue(queue),
        )
        second, run2 = await holder(env, queue, "gpu02")
        decision = await m.FLEET_REQUEST_CAPACITY.execute(fresh, ask(second.id, "gpu02", run2))
        assert not decision.granted and "not visible yet" in decision.reason
        status = await m.FLEET_STATUS.ask(fresh)
        assert [g.incident_id for g in status.out_of_service] == [first.id]
        await fresh.terminate("test over")


async def test_a_recreation_that_finds_only_incidents_holding_nothing_looks_again(env: WorkflowEnvironment) -> None:
    """Recreated within visibility's lag with one open incident that holds nothing (an
    application restart verifying): nothing is out, so the next grant goes; the rebuild looks
    again after VISIBILITY_LAG_S, sees the earlier run, and trips, saying it was recreated
    (before LOOK_UNTIL_SEEN it never looked again and the recreation went unsaid)."""
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    async with worker(env, queue, receiver):
        old = await coordinator(env, queue, POLICY)
        cluster = old.id.removeprefix("gpuheal-").removesuffix("-fleet")
        await old.terminate("an operator, by hand")
        restarting = OpenIncident(
            incident_id="gpuheal-c-gpu01",
            run_id="r1",
            placement=placement("gpu01"),
            stage=Stage.VERIFY,
            takes_capacity=False,
        )
        receiver.open = OpenIncidents(incidents=(restarting,), earlier_run="")  # not visible yet
        fresh = await env.client.start_workflow(
            m.COORDINATOR.name,
            CoordinatorInput(cluster=cluster, seed=POLICY, on_own_queue=True),
            id=old.id,
            task_queue=ids.coordinator_queue(queue),
        )
        second, run2 = await holder(env, queue, "gpu02")
        assert (await m.FLEET_REQUEST_CAPACITY.execute(fresh, ask(second.id, "gpu02", run2))).granted
        assert not (await m.FLEET_STATUS.ask(fresh)).breaker.tripped
        receiver.open = OpenIncidents(incidents=(restarting,), earlier_run="Terminated at 12:00:00")
        await env.sleep(VISIBILITY_LAG_S + 5)
        status = await until(fresh, lambda s: s.breaker.tripped)
        assert "coordinator recreated (its earlier run: Terminated at 12:00:00)" in status.breaker.why
        assert [g.incident_id for g in status.out_of_service] == [second.id], "the grant kept"
        await fresh.terminate("test over")


async def test_a_recreation_tripped_already_does_not_trip_again_over_a_resume(env: WorkflowEnvironment) -> None:
    """Recreated within visibility's lag with gpu01's incident granted: the rebuild counts it and
    trips, saying so once. An operator resumes within VISIBILITY_LAG_S; once the earlier run
    shows, nothing trips the breaker again or says the recreation a second time."""
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    async with worker(env, queue, receiver):
        old = await coordinator(env, queue, POLICY)
        cluster = old.id.removeprefix("gpuheal-").removesuffix("-fleet")
        await old.terminate("an operator, by hand")
        repairing = OpenIncident(
            incident_id="gpuheal-c-gpu01", run_id="r1", placement=placement("gpu01"), stage=Stage.REPAIR
        )
        receiver.open = OpenIncidents(incidents=(repairing,), earlier_run="")  # not visible yet
        fresh = await env.client.start_workflow(
            m.COORDINATOR.name,
            CoordinatorInput(cluster=cluster, seed=POLICY, on_own_queue=True),
            id=old.id,
            task_queue=ids.coordinator_queue(queue),
        )
        second, run2 = await holder(env, queue, "gpu02")
        held = await m.FLEET_REQUEST_CAPACITY.execute(fresh, ask(second.id, "gpu02", run2))
        assert not held.granted and "not visible yet" in held.reason
        await m.FLEET_RESUME.execute(fresh, OperatorAction(operator="alice", reason="gpu01 is being repaired"))
        receiver.open = OpenIncidents(incidents=(repairing,), earlier_run="Terminated at 12:00:00")
        await env.sleep(VISIBILITY_LAG_S + 5)
        status = await m.FLEET_STATUS.ask(fresh)
        assert not status.breaker.tripped, "a resume undone by a second look"
        assert receiver.delivered.count("coordinator_rebuilt") == 1
        await fresh.terminate("test over")


async def test_a_first_coordinator_does_not_take_its_own_closed_run_for_a_recreation(env: WorkflowEnvironment) -> None:
    """A cluster's first coordinator: its first look finds nothing, so it looks again after
    VISIBILITY_LAG_S. Meanwhile it admits gpu01's incident, grants it, and the incident ends and
    gives it back. The second look's listing was taken before that and still shows the run open
    and granted. That run asked this coordinator, so its books are true for it: nothing trips
    (before REBUILD_KNOWS_ITS_OWN, the breaker tripped as "coordinator recreated", issue 36's
    10,000-report storm 85 s in). A run it never saw still trips it."""
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    async with worker(env, queue, receiver):
        handle = await coordinator(env, queue, POLICY)
        first, run1 = await holder(env, queue, "gpu01")
        await m.FLEET_ADMIT.execute(handle, admitting(first.id, run1, "gpu01"))
        assert (await m.FLEET_REQUEST_CAPACITY.execute(handle, ask(first.id, "gpu01", run1))).granted
        await m.FLEET_RELEASE_RUN.execute(handle, ReleaseRequest(cluster="c", incident_id=first.id, run_id=run1))
        stale = OpenIncident(incident_id=first.id, run_id=run1, placement=placement("gpu01"), stage=Stage.REPAIR)
        receiver.open = OpenIncidents(incidents=(stale,), earlier_run="")  # (there is none)
        await env.sleep(VISIBILITY_LAG_S + 5)
        status = await m.FLEET_STATUS.ask(handle)
        assert not status.breaker.tripped, status.breaker.why
        assert status.out_of_service == ()
        assert "coordinator_rebuilt" not in receiver.delivered
        await handle.terminate("test over")


async def test_a_second_look_that_finds_a_run_it_never_saw_still_trips(env: WorkflowEnvironment) -> None:
    """The same second look, showing gpu03's run granted, which never asked this coordinator: a
    coordinator lost before this one may have granted it. It is counted, and the breaker trips."""
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    async with worker(env, queue, receiver):
        handle = await coordinator(env, queue, POLICY)
        first, run1 = await holder(env, queue, "gpu01")
        await m.FLEET_ADMIT.execute(handle, admitting(first.id, run1, "gpu01"))
        unknown = OpenIncident(
            incident_id="gpuheal-c-gpu03", run_id="r9", placement=placement("gpu03"), stage=Stage.REPAIR
        )
        receiver.open = OpenIncidents(incidents=(unknown,), earlier_run="")
        await env.sleep(VISIBILITY_LAG_S + 5)
        status = await until(handle, lambda s: s.breaker.tripped)
        assert "coordinator recreated (its earlier run: not visible yet) with 1 open incidents" in status.breaker.why
        assert "gpu03" in status.breaker.nodes
        await handle.terminate("test over")


def admitting(incident_id: str, run_id: str, node: str) -> AdmitRequest:
    return AdmitRequest(
        incident_id=incident_id,
        run_id=run_id,
        cluster="c",
        placement=placement(node),
        action=ActionClass.REPLACE_NODE,
        what="XID 79",
        seed=POLICY,
    )


async def test_a_rebuild_that_fails_grants_nothing_and_wedges_nothing_until_it_succeeds(
    env: WorkflowEnvironment,
) -> None:
    """The listing fails for a while (a storm's load): the coordinator trips and says so, answers
    the waiting request at once (held behind the breaker: waiting updates would fill Temporal's
    in-flight slots), refuses a resume meanwhile, and rebuilds once the listing answers."""
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    async with worker(env, queue, receiver):
        old = await coordinator(env, queue, POLICY)
        cluster = old.id.removeprefix("gpuheal-").removesuffix("-fleet")
        first, run1 = await holder(env, queue, "gpu01")
        assert (await m.FLEET_REQUEST_CAPACITY.execute(old, ask(first.id, "gpu01", run1))).granted
        await old.terminate("an operator, by hand")
        opened = OpenIncident(incident_id=first.id, run_id=run1, placement=placement("gpu01"), stage=Stage.REPAIR)
        receiver.open = OpenIncidents(incidents=(opened,), earlier_run="Terminated at 12:00:00")
        receiver.listing_fails = 3  # a round of three attempts
        fresh = await env.client.start_workflow(
            m.COORDINATOR.name,
            CoordinatorInput(cluster=cluster, seed=POLICY, on_own_queue=True),
            id=old.id,
            task_queue=ids.coordinator_queue(queue),
        )
        second, run2 = await holder(env, queue, "gpu02")
        asking = asyncio.ensure_future(m.FLEET_REQUEST_CAPACITY.execute(fresh, ask(second.id, "gpu02", run2)))
        # (Real time: the test server does not skip time while a call is in flight.)
        status = await until(fresh, lambda s: s.breaker.tripped)
        assert "rebuilding from the open incidents failed" in status.breaker.why
        decision = await asyncio.wait_for(asking, timeout=30)  # no longer waiting: held behind the breaker
        assert not decision.granted and "circuit breaker tripped" in decision.reason
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await m.FLEET_RESUME.execute(fresh, OperatorAction(operator="alice", reason="looks fine"))
        assert "not rebuilt its books" in str(refused.value.cause)
        status = await until(fresh, lambda s: bool(s.out_of_service))  # the next round (REBUILD_AGAIN_S)
        assert [g.incident_id for g in status.out_of_service] == [first.id], "gpu01's grant rebuilt"
        assert [h.incident_id for h in status.held] == [second.id] and "coordinator recreated" in status.breaker.why
        await fresh.terminate("test over")


async def until(handle: WorkflowHandle[object, None], ok: Callable[[FleetStatus], bool]) -> FleetStatus:
    """The coordinator's status once `ok`, asked every second for up to a minute."""
    for _ in range(60):
        status = await m.FLEET_STATUS.ask(handle)
        if ok(status):
            return status
        await asyncio.sleep(1)
    raise AssertionError(f"not within a minute: {status}")


async def left_and_held(
    env: WorkflowEnvironment, queue: str, receiver: Receiver
) -> tuple[WorkflowHandle[object, None], str]:
    """Budget one: gpu01's incident ended with its node still drained (left); gpu02's is held."""
    handle = await coordinator(env, queue, POLICY)
    first, run1 = await holder(env, queue, "gpu01")
    assert (await m.FLEET_REQUEST_CAPACITY.execute(handle, ask(first.id, "gpu01", run1))).granted
    receiver.drained.add("gpu01")
    done = ReleaseRequest(cluster="c", incident_id=first.id, run_id=run1, left_drained=True)
    await m.FLEET_RELEASE_RUN.execute(handle, done)
    second, run2 = await holder(env, queue, "gpu02")
    held = await m.FLEET_REQUEST_CAPACITY.execute(handle, ask(second.id, "gpu02", run2))
    assert not held.granted and "disruption budget" in held.reason
    return handle, second.id


async def test_a_node_returned_with_gpuheal_return_lets_the_next_incident_go_at_once(env: WorkflowEnvironment) -> None:
    """`gpuheal return` tells the coordinator, then resumes the node in Slurm: the coordinator
    counts it until its look RETURN_LOOK_S later sees it back, then the next in line goes."""
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    async with worker(env, queue, receiver):
        handle, second = await left_and_held(env, queue, receiver)
        await env.sleep(timedelta(seconds=1))  # the held incident's first check of gpu01 (still drained)
        answer = await m.FLEET_RETURN_NODE.execute(handle, NodeReturn(node="gpu01", operator="olga", reason="ok"))
        assert "gpu01 counted until Slurm shows it back" in answer
        assert [g.node for g in (await m.FLEET_STATUS.ask(handle)).left] == ["gpu01"]
        receiver.drained.discard("gpu01")  # the command's resume
        await env.sleep(timedelta(seconds=reaping.RETURN_LOOK_S + 2))
        status = await m.FLEET_STATUS.ask(handle)
        assert [g.incident_id for g in status.out_of_service] == [second] and not status.left


async def test_a_returned_node_whose_resume_failed_stays_counted(env: WorkflowEnvironment) -> None:
    """The command's resume failed (slurmctld stopped, issue 37's hour): still drained, still counted."""
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    async with worker(env, queue, receiver):
        handle, second = await left_and_held(env, queue, receiver)
        await m.FLEET_RETURN_NODE.execute(handle, NodeReturn(node="gpu01", operator="olga", reason="ok"))
        await env.sleep(timedelta(seconds=reaping.LEFT_CHECK_EVERY_S + reaping.RETURN_LOOK_S))
        status = await m.FLEET_STATUS.ask(handle)
        assert [g.node for g in status.left] == ["gpu01"] and not status.out_of_service, "the budget of 1 holds"
        assert [h.incident_id for h in status.held] == [second]


async def test_a_held_incident_has_the_left_nodes_checked_within_seconds(env: WorkflowEnvironment) -> None:
    """An operator resumes gpu01 with a bare scontrol: the held incident's check sees it back
    within LEFT_CHECK_EVERY_S, not at the next look for closed runs (300 s)."""
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    async with worker(env, queue, receiver):
        handle, second = await left_and_held(env, queue, receiver)
        await env.sleep(timedelta(seconds=5))
        assert [g.node for g in (await m.FLEET_STATUS.ask(handle)).left] == ["gpu01"], "still drained: counted"
        receiver.drained.discard("gpu01")
        await env.sleep(timedelta(seconds=40))
        status = await m.FLEET_STATUS.ask(handle)
        assert not status.left and [g.incident_id for g in status.out_of_service] == [second]
