"""One decision per incident (gpuheal.core.fleet.admitting), on Temporal's time-skipping server
with the real coordinator and the worker's real admission line (activities/admitting.py): a
batch of incidents admitted and decided in one update; no policy sent back to a worker that holds
it; a coordinator of the release before admitted as that release asks."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from gpuheal.activities.fleet import FleetActivities
from gpuheal.core import ids
from gpuheal.core import messages as m
from gpuheal.core.fleet.models import (
    Admission,
    Admissions,
    AdmitAsk,
    AdmitBatch,
    AdmitItem,
    Admitting,
    Placement,
    ReleaseRequest,
)
from gpuheal.core.fleet.policy import BudgetPolicy, FleetPolicy, policy_key
from gpuheal.core.models.base import ActionClass
from gpuheal.core.models.incident import KubernetesPolicy, RemediationSettings
from gpuheal.core.models.slurm import NodeInfo
from tests.conftest import start_time_skipping
from tests.test_coordinator_faults import Receiver, coordinator, env, holder, placement, worker

__all__ = ["env"]  # the fixture, shared with tests/test_coordinator_faults.py (it records histories)
POLICY = FleetPolicy(budget=BudgetPolicy(cluster="1", node_cooldown_s=0), containment_limit="2")
ACCEPTED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
COMPLETED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED


async def rebuilt(handle: WorkflowHandle[Any, Any], cluster: str) -> None:
    """A release waits for a fresh coordinator's rebuild: the moment it can decide capacity."""
    await m.FLEET_RELEASE_RUN.execute(handle, ReleaseRequest(cluster=cluster, incident_id="nobody", run_id="r"))


async def test_a_batch_is_admitted_and_decided_in_one_update(env: WorkflowEnvironment) -> None:
    """Budget 1, containment bound 2: five incidents in one update. The first granted; the next
    three held, two contained; an application restart decided nothing (it takes no capacity).
    Asked again naming the policy it holds: the same answers, the policy not sent back."""
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    async with worker(env, queue, receiver):
        handle = await coordinator(env, queue, POLICY)
        cluster = handle.id.removeprefix("gpuheal-").removesuffix("-fleet")
        await rebuilt(handle, cluster)
        items = []
        for i, action in enumerate([ActionClass.REPLACE_NODE] * 4 + [ActionClass.RESTART_APP], 1):
            h, run = await holder(env, queue, f"gpu{i:02d}")
            admit = Admitting(
                incident_id=h.id,
                run_id=run,
                cluster=cluster,
                placement=placement(f"gpu{i:02d}"),
                action=action,
                what="x",
            )
            items.append(AdmitItem(admit=admit, ask_capacity=True, contain_if_held=True))
        answers = (await m.FLEET_ADMIT_AND_REQUEST_MANY.execute(handle, AdmitBatch(requests=tuple(items)))).answers
        decided = [(d.granted, d.position, d.contained) if (d := a.decision) else None for a in answers]
        assert decided == [(True, None, None), (False, 1, True), (False, 2, True), (False, 3, False), None]
        assert all(a.policy is not None and a.policy.policy == POLICY for a in answers)
        key = policy_key(answers[0].policy)  # type: ignore[arg-type]
        again_items = tuple(i.model_copy(update={"known_policy": key}) for i in items)
        again = (await m.FLEET_ADMIT_AND_REQUEST_MANY.execute(handle, AdmitBatch(requests=again_items))).answers
        assert [(d.granted, d.position, d.contained) if (d := a.decision) else None for a in again] == decided  # noqa: RUF018
        assert all(a.policy is None for a in again)  # the worker holds it: not sent again
        status = await m.FLEET_STATUS.ask(handle)
        assert [g.node for g in status.out_of_service] == ["gpu01"] and len(status.held) == 3
        events = (await handle.fetch_history()).events
    names = [
        e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
        for e in events
        if e.event_type == ACCEPTED
    ]
    assert names == [m.FLEET_RELEASE_RUN.name] + [m.FLEET_ADMIT_AND_REQUEST_MANY.name] * 2
    outcomes = [
        e.workflow_execution_update_completed_event_attributes.outcome for e in events if e.event_type == COMPLETED
    ]
    second = json.loads(outcomes[-1].success.payloads[0].data)
    assert all("policy" not in a for a in second["answers"])  # (nor on the wire, nor in the history)


class Slurm:
    """Slurm's node listing, as the worker's placement reads it."""

    async def nodes(self) -> dict[str, NodeInfo]:
        return {f"gpu{i:02d}": NodeInfo(name=f"gpu{i:02d}", state="idle", partitions=("gpu",)) for i in range(1, 9)}


def activities_on(env: WorkflowEnvironment, queue: str | None = None) -> ActivityEnvironment:
    activities = ActivityEnvironment(client=env.client)
    if queue is not None:
        activities.info = dataclasses.replace(activities.info, task_queue=queue)
    return activities


def asking(cluster: str, node: str, run: str) -> AdmitAsk:
    return AdmitAsk(
        incident_id=ids.incident_id(cluster, node),
        run_id=run,
        cluster=cluster,
        node=node,
        action=ActionClass.REPLACE_NODE,
        what="XID 79",
        ask_capacity=True,
    )


async def test_the_worker_is_sent_its_policy_once(env: WorkflowEnvironment) -> None:
    """Through the worker's admission line: the first incident starts the coordinator, which is
    still rebuilding its books (so it decides no capacity: that incident will ask); the second,
    once it has rebuilt, is granted with its admission, its answer without the policy (the
    worker fills in the one it holds). Both incidents see the cluster's policy."""
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    cluster = f"c{uuid.uuid4().hex[:8]}"
    fleet = FleetActivities(Slurm(), None, POLICY, RemediationSettings(), (), 2, cluster=cluster)  # type: ignore[arg-type]
    activities = activities_on(env, queue)
    async with worker(env, queue, receiver):
        first = await activities.run(fleet.admit_incident, asking(cluster, "gpu01", "r1"))
        handle = env.client.get_workflow_handle(ids.coordinator_id(cluster))
        await rebuilt(handle, cluster)
        second = await activities.run(fleet.admit_incident, asking(cluster, "gpu02", "r2"))
        events = (await handle.fetch_history()).events
        await handle.terminate("test over")
    assert first.admission == second.admission and first.admission.policy.policy == POLICY
    assert first.decision is None
    assert second.decision is not None and second.decision.granted
    outcomes = [
        e.workflow_execution_update_completed_event_attributes.outcome for e in events if e.event_type == COMPLETED
    ]
    answers = [json.loads(o.success.payloads[0].data) for o in outcomes]
    admitted = [a["answers"][0] for a in answers if isinstance(a, dict) and "answers" in a]
    assert len(admitted) == 2 and "policy" in admitted[0] and "policy" not in admitted[1]


async def test_where_the_incident_maps_its_kubernetes_node_it_asks_for_capacity_after(
    env: WorkflowEnvironment,
) -> None:
    """A worker with the Kubernetes half: its incidents map their node after the admission, and a
    grant held that long in `triage` is one a recreated coordinator would not count. So the
    admission goes alone; the incident asks for capacity once mapped, as before."""
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    cluster = f"c{uuid.uuid4().hex[:8]}"
    settings = RemediationSettings(kubernetes=KubernetesPolicy())
    fleet = FleetActivities(Slurm(), None, POLICY, settings, (), 2, cluster=cluster)  # type: ignore[arg-type]
    activities = activities_on(env, queue)
    async with worker(env, queue, receiver):
        await activities.run(fleet.admit_incident, asking(cluster, "gpu01", "r1"))
        handle = env.client.get_workflow_handle(ids.coordinator_id(cluster))
        await rebuilt(handle, cluster)
        second = await activities.run(fleet.admit_incident, asking(cluster, "gpu02", "r2"))
        status = await m.FLEET_STATUS.ask(handle)
        await handle.terminate("test over")
    assert second.decision is None and not status.out_of_service and not status.held


class OldAdmitRequest(BaseModel):
    """AdmitRequest as the releases before declared it: the seed required, unknown fields refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    incident_id: str
    run_id: str = ""
    cluster: str
    placement: Placement
    action: ActionClass
    what: str
    gpu_uuids: tuple[str, ...] = ()
    gpu_serials: tuple[str, ...] = ()
    seed: FleetPolicy
    application_fault: bool = False


class OldAdmitRequests(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    requests: tuple[OldAdmitRequest, ...]


@workflow.defn(name=m.COORDINATOR.name)
class OldCoordinator:
    """The coordinator of the release before, as far as an admission goes: `admit` only."""

    @workflow.run
    async def run(self, inp: dict[str, Any]) -> None:
        await workflow.wait_condition(lambda: False)

    def __init__(self) -> None:
        self.batches: list[int] = []  # the size of each update it answered

    @workflow.update(name=m.FLEET_ADMIT_MANY.name)
    def admit_many(self, reqs: OldAdmitRequests) -> Admissions:
        self.batches.append(len(reqs.requests))
        return Admissions(answers=tuple(self._admit(r) for r in reqs.requests))

    @workflow.query(name="batches")
    def sizes(self) -> list[int]:
        return self.batches

    @workflow.update(name=m.FLEET_ADMIT.name)
    def admit(self, req: OldAdmitRequest) -> Admission:
        self.batches.append(1)
        return self._admit(req)

    def _admit(self, req: OldAdmitRequest) -> Admission:
        from datetime import UTC, datetime

        from gpuheal.core.fleet.policy import VersionedPolicy

        return Admission(
            policy=VersionedPolicy(
                version=7, policy=req.seed, changed_by="old", reason="old", at=datetime(2026, 1, 1, tzinfo=UTC)
            )
        )


async def test_a_coordinator_of_the_release_before_is_admitted_as_that_release_asks() -> None:
    """During a rollout: the coordinator lacks admit_and_request_many; the worker admits as the
    release before did (`admit_many` batches, `admit` alone, with the seed), and nothing is
    decided with it (the incident asks for capacity after, as before). (A server of its own: no
    history to record.)"""
    env = await start_time_skipping()
    try:
        cluster = "east"
        fleet = FleetActivities(Slurm(), None, POLICY, RemediationSettings(), (), 1, cluster=cluster)  # type: ignore[arg-type]
        activities = activities_on(env)
        queue = ids.coordinator_queue(activities.info.task_queue)
        async with Worker(
            env.client, task_queue=queue, workflows=[OldCoordinator], workflow_runner=UnsandboxedWorkflowRunner()
        ):
            # All at once, before the worker knows: those in line when it finds out go as that release's
            # batches too, not one `admit` each.
            first, *many = await asyncio.gather(
                *(activities.run(fleet.admit_incident, asking(cluster, f"gpu{i:02d}", f"r{i}")) for i in range(1, 13))
            )
            more = await asyncio.gather(
                *(activities.run(fleet.admit_incident, asking(cluster, f"gpu{i:02d}", f"r{i}")) for i in range(13, 19))
            )
            handle = env.client.get_workflow_handle(ids.coordinator_id(cluster))
            batches = await handle.query("batches", result_type=list[int])
            await handle.terminate("test over")
    finally:
        await env.shutdown()
    for a in (first, *many, *more):
        assert a.decision is None and a.admission.policy.version == 7 and a.admission.policy.policy == POLICY
    assert sum(batches) == 18 and len(batches) <= 6, batches  # in batches, not one update each
