"""Fault injection at the workflow level (Temporal's time-skipping server): the coordinator holds
under the events it exists for.

- A notice receiver down for an hour across a breaker trip: the notices fail after their
  retries, the coordinator does not (before, it failed, and the next incident's update-with-start
  began a fresh one: breaker, grants and line gone).
- A held incident whose limit frees by time alone (its node's cooldown ends) goes then, without
  any other event.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from gpuheal.activities import interface as act
from gpuheal.activities.interface import implements
from gpuheal.core import ids
from gpuheal.core import messages as m
from gpuheal.core.fleet import (
    AdmitRequest,
    CapacityRequest,
    CoordinatorInput,
    DomainDecisionFor,
    DomainIncident,
    Placement,
)
from gpuheal.core.fleet_policy import BreakerPolicy, BudgetPolicy, FleetPolicy
from gpuheal.core.models import ActionClass, Notification
from gpuheal.workflows.domain import DomainIncidentWorkflow
from gpuheal.workflows.fleet import FleetCoordinator


class Receiver:
    """The operators' notice endpoint, down (every delivery refused) or up."""

    def __init__(self, up: bool) -> None:
        self.up, self.attempts, self.delivered = up, 0, list[str]()

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

        return [notify, open_domain, decide]


def placement(node: str) -> Placement:
    return Placement(node=node, cluster_size=100, pool="h100", pool_size=100)


def ask(incident_id: str, node: str) -> CapacityRequest:
    return CapacityRequest(
        cluster="c", incident_id=incident_id, placement=placement(node), action=ActionClass.REPLACE_NODE
    )


def worker(env: WorkflowEnvironment, queue: str, receiver: Receiver) -> Worker:
    workflows = [FleetCoordinator, DomainIncidentWorkflow]
    return Worker(env.client, task_queue=queue, workflows=workflows, activities=receiver.activities())


async def coordinator(env: WorkflowEnvironment, queue: str, policy: FleetPolicy) -> WorkflowHandle[object, None]:
    cluster = f"c{uuid.uuid4().hex[:8]}"
    return await env.client.start_workflow(
        m.COORDINATOR.name,
        CoordinatorInput(cluster=cluster, seed=policy),
        id=ids.coordinator_id(cluster),
        task_queue=queue,
    )


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
        first = ask("gpuheal-c-gpu01", "gpu01")
        assert (await m.FLEET_REQUEST_CAPACITY.execute(handle, first)).granted
        await m.FLEET_RELEASE.execute(handle, first.incident_id)
        again = first.model_copy(update={"incident_id": "gpuheal-c-gpu01#2"})
        held = await m.FLEET_REQUEST_CAPACITY.execute(handle, again)
        assert not held.granted and "cooling down" in held.reason
        await env.sleep(timedelta(minutes=31))  # the cooldown ends; nothing else happens
        status = await m.FLEET_STATUS.ask(handle)
        assert [g.incident_id for g in status.out_of_service] == ["gpuheal-c-gpu01#2"] and not status.held
