"""Fault injection at the workflow level (Temporal's time-skipping server): the coordinator holds
under the events it exists for.

- A notice receiver down for an hour across a breaker trip: the notices fail after their
  retries, the coordinator does not (before, it failed, and the next incident's update-with-start
  began a fresh one: breaker, grants and line gone).
- A held incident whose limit frees by time alone (its node's cooldown ends) goes then, without
  any other event.
- A run terminated while granted (it runs no code, gives nothing back): the coordinator's look
  for closed runs (the real activity, against the server) gives its grant back within
  REAP_EVERY_S, and at once when the grant notice finds the run gone; the line goes on.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from temporalio import activity
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from gpuheal.activities import interface as act
from gpuheal.activities.carrying import StatePacking
from gpuheal.activities.fleet import find_closed_runs
from gpuheal.activities.interface import implements
from gpuheal.core import ids
from gpuheal.core import messages as m
from gpuheal.core.fleet import packing, reaping
from gpuheal.core.fleet.models import (
    BATCH_MOST,
    AdmitRequest,
    AdmitRequests,
    CapacityRequest,
    CapacityRequests,
    CoordinatorInput,
    DomainDecisionFor,
    DomainIncident,
    OpenIncident,
    OpenIncidents,
    OperatorAction,
    Placement,
    RunRefs,
)
from gpuheal.core.fleet.policy import BreakerPolicy, BudgetPolicy, FleetPolicy, PolicyChange
from gpuheal.core.models.base import ActionClass, Stage
from gpuheal.core.models.kubernetes import BorrowedGiveBack
from gpuheal.core.models.result import Notification
from gpuheal.workers.main import Workers
from gpuheal.workflows.domain import DomainIncidentWorkflow
from gpuheal.workflows.fleet import FleetCoordinator
from tests.conftest import start_time_skipping
from tests.histories.recording import recording
from tests.holder import Holder


class Receiver:
    """The operators' notice endpoint, down (every delivery refused) or up."""

    def __init__(self, up: bool) -> None:
        self.up, self.attempts, self.delivered = up, 0, list[str]()
        self.open = OpenIncidents()  # what visibility shows open when a coordinator starts
        self.drained: set[str] = set()  # nodes Slurm shows drained by their incident
        self.listing_fails = 0  # the next listings of the open incidents that fail (a loaded server)

    def activities(self) -> list[object]:
        @implements(act.NOTIFY_OPERATORS)
        async def notify(note: Notification) -> None:
            self.attempts += 1
            if not self.up:
                raise ApplicationError(f"connection refused (attempt {activity.info().attempt})")
            self.delivered.append(note.event)

        @implements(act.OPEN_DOMAIN_INCIDENT)
        async def open_domain(d: DomainIncident) -> str:
            return d.incident_id

        @implements(act.DECIDE_DOMAIN)
        async def decide(d: DomainDecisionFor) -> str:
            return "decided"

        @implements(act.FIND_NODES_LEFT_DRAINED)
        async def left_drained(refs: RunRefs) -> RunRefs:
            return RunRefs(runs=tuple(r for r in refs.runs if r.node in self.drained))

        @implements(act.FIND_OPEN_INCIDENTS)
        async def find_open(cluster: str) -> OpenIncidents:
            if self.listing_fails:
                self.listing_fails -= 1
                raise ApplicationError("visibility: deadline exceeded")
            if self.open.earlier_run:
                await asyncio.sleep(1)  # a slow visibility: requests arrive before the answer
            return self.open

        @implements(act.FIND_OPEN_INCIDENTS_PACKED)
        async def find_open_packed(cluster: str) -> bytes:  # (the product's, packed as it packs)
            return packing.pack_listing(await find_open(cluster))

        @implements(act.GIVE_BACK_BORROWED_OF_ENDED_RUNS)
        async def give_back(cluster: str) -> BorrowedGiveBack:
            return BorrowedGiveBack()  # nothing borrowed: no Kubernetes here

        packs = StatePacking().pack_fleet_state  # (the product's: a big state is packed beside the task)
        listings = [find_closed_runs, left_drained, find_open, find_open_packed]
        return [notify, open_domain, decide, *listings, give_back, packs]


def placement(node: str) -> Placement:
    return Placement(node=node, cluster_size=100, pool="h100", pool_size=100)


def ask(incident_id: str, node: str, run_id: str = "") -> CapacityRequest:
    return CapacityRequest(
        cluster="c", incident_id=incident_id, placement=placement(node), action=ActionClass.REPLACE_NODE, run_id=run_id
    )


@pytest.fixture
async def env(request: pytest.FixtureRequest) -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server of the test's own: these coordinators are left running with work
    in progress when a test ends, and the test server then no longer skips time for anyone.
    With GPUHEAL_RECORD_HISTORIES, the coordinators it ran are saved as replay material."""
    async for env in recording(request.node.name, start_time_skipping):
        yield env


async def holder(env: WorkflowEnvironment, queue: str, node: str) -> tuple[WorkflowHandle[object, None], str]:
    handle = await env.client.start_workflow("Holder", id=f"gpuheal-{queue}-{node}", task_queue=queue)
    return handle, handle.first_execution_run_id or ""


def worker(env: WorkflowEnvironment, queue: str, receiver: Receiver) -> Workers:
    """As a gpuheal worker serves: the workflows on the queue (coordinators started there by the
    release before too), the coordinator and its activities on its own."""
    workflows, activities = [FleetCoordinator, DomainIncidentWorkflow, Holder], receiver.activities()
    return Workers(
        Worker(env.client, task_queue=queue, workflows=workflows, activities=activities),
        Worker(
            env.client, task_queue=ids.coordinator_queue(queue), workflows=[FleetCoordinator], activities=activities
        ),
    )


async def coordinator(
    env: WorkflowEnvironment, queue: str, policy: FleetPolicy, on: str | None = None
) -> WorkflowHandle[object, None]:
    """A coordinator started where incidents start it (its own queue), or `on` another."""
    cluster = f"c{uuid.uuid4().hex[:8]}"
    handle: WorkflowHandle[object, None] = await env.client.start_workflow(
        m.COORDINATOR.name,
        CoordinatorInput(cluster=cluster, seed=policy, on_own_queue=on is None),
        id=ids.coordinator_id(cluster),
        task_queue=on or ids.coordinator_queue(queue),
    )
    return handle


async def admit(handle: WorkflowHandle[object, None], node: str, policy: FleetPolicy) -> None:
    req = AdmitRequest(
        incident_id=f"gpuheal-c-{node}",
        run_id="r1",
        cluster="c",
        placement=placement(node),
        action=ActionClass.REPLACE_NODE,
        what="XID 79",
        seed=policy,
    )
    await m.FLEET_ADMIT.execute(handle, req)


async def test_a_notice_receiver_down_for_an_hour_across_a_trip_never_fails_the_coordinator(
    env: WorkflowEnvironment,
) -> None:
    policy = FleetPolicy(breaker=BreakerPolicy(max_incidents=2, window_s=300))
    receiver, queue = Receiver(up=False), f"tq-{uuid.uuid4()}"
    async with worker(env, queue, receiver):
        handle = await coordinator(env, queue, policy)
        for node in ("gpu01", "gpu02", "gpu03"):  # the third trips the breaker: a critical notice
            await admit(handle, node, policy)
        await env.sleep(timedelta(hours=1))  # the notice's retries run out meanwhile
        status = await m.FLEET_STATUS.ask(handle)
        assert status.breaker.tripped and "3 new incidents" in status.breaker.why
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        assert receiver.attempts > 1  # it was retried, and gave up, without failing the coordinator
        # It still answers: the next incident is held by the same breaker, nothing reset.
        req = ask("gpuheal-c-gpu04", "gpu04")
        await admit(handle, "gpu04", policy)
        decision = await m.FLEET_REQUEST_CAPACITY.execute(handle, req)
        assert not decision.granted and "circuit breaker tripped" in decision.reason
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING


async def test_a_held_incident_goes_when_its_nodes_cooldown_ends_with_no_other_event(env: WorkflowEnvironment) -> None:
    policy = FleetPolicy(budget=BudgetPolicy(cluster="10", node_cooldown_s=1800))
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    async with worker(env, queue, receiver):
        handle = await coordinator(env, queue, policy)
        run, run1 = await holder(env, queue, "gpu01")
        first = ask(run.id, "gpu01", run1)
        assert (await m.FLEET_REQUEST_CAPACITY.execute(handle, first)).granted
        await m.FLEET_RELEASE.execute(handle, first.incident_id)
        await run.terminate("closed")  # the node's next incident is a new run of the same id
        run, run2 = await holder(env, queue, "gpu01")
        held = await m.FLEET_REQUEST_CAPACITY.execute(handle, first.model_copy(update={"run_id": run2}))
        assert not held.granted and "cooling down" in held.reason
        await env.sleep(timedelta(minutes=31))  # the cooldown ends; nothing else happens
        status = await m.FLEET_STATUS.ask(handle)
        assert [(g.incident_id, g.run_id) for g in status.out_of_service] == [(run.id, run2)] and not status.held


Handle = WorkflowHandle[object, None]


async def one_granted_one_held(env: WorkflowEnvironment, queue: str) -> tuple[Handle, Handle, Handle]:
    """A coordinator with a budget of one: gpu01's run granted, gpu02's held behind it."""
    handle = await coordinator(env, queue, FleetPolicy(budget=BudgetPolicy(cluster="1", node_cooldown_s=0)))
    first, run1 = await holder(env, queue, "gpu01")
    second, run2 = await holder(env, queue, "gpu02")
    granted = await m.FLEET_REQUEST_CAPACITY.execute(handle, ask(first.id, "gpu01", run1))
    held = await m.FLEET_REQUEST_CAPACITY.execute(handle, ask(second.id, "gpu02", run2))
    assert granted.granted and not held.granted and "disruption budget" in held.reason
    return handle, first, second


async def test_a_batch_is_decided_in_its_order_as_one_request_at_a_time_would_be(env: WorkflowEnvironment) -> None:
    """A storm's requests that queued in one worker arrive as one update: the first two take the
    budget of two, the rest are held in line in their order; asked again, the same answers. A
    batch for another cluster, or past BATCH_MOST, is refused whole and changes nothing."""
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    async with worker(env, queue, receiver):
        policy = FleetPolicy(budget=BudgetPolicy(cluster="2", node_cooldown_s=0))
        handle = await coordinator(env, queue, policy)
        cluster = handle.id.removeprefix("gpuheal-").removesuffix("-fleet")
        runs = [await holder(env, queue, f"gpu{i:02d}") for i in range(1, 6)]

        def admission(h: Handle, run: str, node: str, to: str = cluster) -> AdmitRequest:
            return AdmitRequest(
                incident_id=h.id,
                run_id=run,
                cluster=to,
                placement=placement(node),
                action=ActionClass.REPLACE_NODE,
                what="XID 79",
                seed=policy,
            )

        def capacity(h: Handle, run: str, node: str, to: str = cluster) -> CapacityRequest:
            return ask(h.id, node, run).model_copy(update={"cluster": to})

        nodes = [f"gpu{i:02d}" for i in range(1, 6)]
        admits = AdmitRequests(requests=tuple(admission(h, r, n) for (h, r), n in zip(runs, nodes, strict=True)))
        admitted = await m.FLEET_ADMIT_MANY.execute(handle, admits)
        assert len(admitted.answers) == 5 and all(a.breaker is None for a in admitted.answers)
        batch = CapacityRequests(requests=tuple(capacity(h, r, n) for (h, r), n in zip(runs, nodes, strict=True)))
        answers = (await m.FLEET_REQUEST_CAPACITY_MANY.execute(handle, batch)).answers
        assert [a.granted for a in answers] == [True, True, False, False, False]
        assert [a.position for a in answers[2:]] == [1, 2, 3]
        again = (await m.FLEET_REQUEST_CAPACITY_MANY.execute(handle, batch)).answers
        assert [(a.granted, a.position) for a in again] == [(a.granted, a.position) for a in answers]

        (h, r), node = runs[2], nodes[2]
        mixed = CapacityRequests(requests=(capacity(h, r, node), capacity(h, r, node, to="other")))
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await m.FLEET_REQUEST_CAPACITY_MANY.execute(handle, mixed)
        assert "holds requests of ['other']" in str(refused.value.cause)
        too_many = CapacityRequests(requests=(capacity(h, r, node),) * (BATCH_MOST + 1))
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await m.FLEET_REQUEST_CAPACITY_MANY.execute(handle, too_many)
        assert f"1 to {BATCH_MOST} requests, not {BATCH_MOST + 1}" in str(refused.value.cause)
        status = await m.FLEET_STATUS.ask(handle)
        assert len(status.out_of_service) == 2
        assert [x.incident_id for x in status.held] == [h.id for h, _ in runs[2:]]


async def test_a_run_terminated_while_granted_has_its_grant_reaped_and_the_line_goes_on(
    env: WorkflowEnvironment,
) -> None:
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    async with worker(env, queue, receiver):
        handle, first, second = await one_granted_one_held(env, queue)
        await first.terminate("an operator, by hand")
        await env.sleep(timedelta(seconds=reaping.REAP_EVERY_S + 60))
        status = await m.FLEET_STATUS.ask(handle)
        assert [g.incident_id for g in status.out_of_service] == [second.id] and not status.held
        assert "grants_reaped" in receiver.delivered


async def test_a_grant_to_a_run_that_is_gone_is_given_back_at_once(env: WorkflowEnvironment) -> None:
    """Held, then terminated; granted when the line moves: the grant notice finds the run gone,
    and the coordinator looks at once, without waiting REAP_EVERY_S."""
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    async with worker(env, queue, receiver):
        handle, first, second = await one_granted_one_held(env, queue)
        await second.terminate("an operator, by hand")
        await m.FLEET_RELEASE.execute(handle, first.id)  # the line moves: gpu02's dead run is granted
        await env.sleep(timedelta(seconds=30))
        status = await m.FLEET_STATUS.ask(handle)
        assert not status.out_of_service and not status.held
        assert "grants_reaped" in receiver.delivered


async def test_a_recreated_coordinator_grants_nothing_before_it_has_rebuilt_and_starts_tripped(
    env: WorkflowEnvironment,
) -> None:
    """Terminated by hand while gpu01 was granted; the next incident's request is the first
    thing the fresh coordinator hears. It is answered only after the rebuild: held behind the
    tripped breaker, never granted past a budget the fresh coordinator did not know was used."""
    policy = FleetPolicy(budget=BudgetPolicy(cluster="1", node_cooldown_s=0))
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    async with worker(env, queue, receiver):
        old = await coordinator(env, queue, policy)
        cluster = old.id.removeprefix("gpuheal-").removesuffix("-fleet")
        first, run1 = await holder(env, queue, "gpu01")
        assert (await m.FLEET_REQUEST_CAPACITY.execute(old, ask(first.id, "gpu01", run1))).granted
        await old.terminate("an operator, by hand")
        receiver.open = OpenIncidents(
            incidents=(
                OpenIncident(incident_id=first.id, run_id=run1, placement=placement("gpu01"), stage=Stage.REPAIR),
            ),
            earlier_run="Terminated at 12:00:00",
        )
        fresh = await env.client.start_workflow(
            m.COORDINATOR.name,
            CoordinatorInput(cluster=cluster, seed=policy, on_own_queue=True),
            id=old.id,
            task_queue=ids.coordinator_queue(queue),
        )
        second, run2 = await holder(env, queue, "gpu02")
        decision = await m.FLEET_REQUEST_CAPACITY.execute(fresh, ask(second.id, "gpu02", run2))
        assert not decision.granted and "circuit breaker tripped (coordinator recreated" in decision.reason
        status = await m.FLEET_STATUS.ask(fresh)
        assert [g.incident_id for g in status.out_of_service] == [first.id]
        await m.FLEET_RESUME.execute(fresh, OperatorAction(operator="alice", reason="checked"))
        await m.FLEET_RELEASE.execute(fresh, first.id)  # gpu01 done: gpu02 goes, within the budget
        status = await m.FLEET_STATUS.ask(fresh)
        assert [g.incident_id for g in status.out_of_service] == [second.id] and not status.held
        assert "coordinator_rebuilt" in receiver.delivered
        await fresh.terminate("test over")


async def test_a_policy_change_made_against_an_old_version_is_refused(env: WorkflowEnvironment) -> None:
    """`gpuheal policy apply` reads, merges and sends: a change someone made meanwhile must
    not be overwritten without a word."""
    policy = FleetPolicy()
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    async with worker(env, queue, receiver):
        handle = await coordinator(env, queue, policy)
        observe = policy.model_copy(update={"mode": "observe"})
        first = PolicyChange(operator="alice", reason="trial", policy=observe, expected_version=1)
        assert await m.FLEET_SET_POLICY.execute(handle, first) == "policy version 2"
        stale = PolicyChange(operator="bob", reason="tune", policy=policy, expected_version=1)
        with pytest.raises(WorkflowUpdateFailedError) as err:
            await m.FLEET_SET_POLICY.execute(handle, stale)
        assert "at version 2 now, not 1 (changed by alice: trial)" in str(err.value.cause)
        assert (await m.FLEET_POLICY.ask(handle)).policy.mode == "observe"


async def test_the_fleet_view_is_read_from_the_server_while_no_worker_can_answer_a_query(
    env: WorkflowEnvironment,
) -> None:
    """What `gpuheal fleet` shows is in the coordinator's memo, written as it decides: it reads
    right while the coordinator cannot answer a query (here no worker runs at all; in a storm
    Temporal refuses queries to the busy coordinator for minutes)."""
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    async with worker(env, queue, receiver):
        handle, first, second = await one_granted_one_held(env, queue)
        live = await m.FLEET_STATUS.ask(handle)
        for _ in range(50):  # written within MEMO_EVERY_S of the decision
            shown = await m.FLEET_VIEW.read(handle)
            if shown is not None and (shown.out, shown.held) == (1, 1):
                break
            await env.sleep(0.2)
    with pytest.raises(Exception):  # noqa: B017 (whatever the SDK raises: no answer in time)
        await m.FLEET_STATUS.ask(handle, rpc_timeout=timedelta(seconds=2))
    view = await m.FLEET_VIEW.read(handle)
    assert view is not None and (view.out, view.held) == (1, 1)
    assert [x.incident_id for x in view.out_nodes] == [first.id]
    assert [x.incident_id for x in view.held_nodes] == [second.id]
    assert view.budget == live.budget and view.policy_version == live.policy_version
