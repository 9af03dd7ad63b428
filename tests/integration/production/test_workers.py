"""Several workers on the Temporal cluster: two gpuheal worker processes on one task queue, a
storm of incidents, and in its middle a worker SIGKILLed while it acts on Slurm or a node, the
Temporal server's process restarted and PostgreSQL restarted. Every incident ends in its named
state; Slurm's log shows one drain per node and one requeue per job by each incident that found
it; each incident took one spare; no grant is left."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
from typing import Any

import pytest
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.enums.v1.workflow_pb2 import PendingActivityState
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowHandle

from gpuheal.activities import interface as act
from gpuheal.core.models import ActionClass, Stage
from gpuheal.triggers.start import start_or_join
from gpuheal.workflows.remediation import GpuRemediationWorkflow
from infra.sandbox import HOST_SLURM
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import report, slurmctld_log, until, worker_env
from tests.integration.production.conftest import cluster_settings
from tests.integration.test_fleet import fleet_status, sized

pytestmark = pytest.mark.integration

ACTIVE, SPARES, JOBS = 8, 8, 4
STARTED = PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
WAITS_FOR_GRANT = {act.ADMIT_INCIDENT.name, act.REQUEST_CAPACITY.name}


async def test_a_storm_survives_a_killed_worker_a_server_restart_and_a_database_restart(
    prod: Sandbox, prod_client: Client
) -> None:
    prod.use_slurm(HOST_SLURM)
    sized(prod, ACTIVE, SPARES)
    settings = cluster_settings(prod, "storm")
    jobs = [prod.submit_training(f"storm{i}", sbatch_args=("--exclusive",)) for i in range(JOBS)]
    for job in jobs:
        await asyncio.to_thread(prod.wait_for_step, job, 3)
    failing = [f"gpu{i:02d}" for i in range(1, ACTIVE + 1)]
    with worker_env(prod, settings):
        workers = [prod.start_worker(0)]
    try:
        handles = [await start_or_join(prod_client, settings, report(settings, n, 79)) for n in failing]
        # The first worker takes the storm (a workflow stays with the worker that has it cached,
        # and its activities run there eagerly); the second joins once the first is acting on
        # Slurm or a node, and takes over what the first had when it is killed.
        pids_0 = [workers[0].pid]

        async def worker_0_mid_step_none_done() -> bool:
            stages = [(await h.query(GpuRemediationWorkflow.status)).stage for h in handles]
            return Stage.DONE not in stages and await acting_on(handles, identity(pids_0[0]))

        await until(worker_0_mid_step_none_done, "the first worker acting on Slurm or a node", timeout=120)
        with worker_env(prod, settings):
            workers.append(prod.start_worker(1))
        await until(lambda: polls(prod_client, settings.task_queue, identity(workers[1].pid)), "the second worker")
        workers[0].send_signal(signal.SIGKILL)  # mid-activity, no graceful shutdown
        workers[0].wait()
        await asyncio.to_thread(prod.restart_temporal_server)
        await asyncio.to_thread(prod.restart_postgres)

        async def second_worker_took_over() -> bool:
            return identity(workers[1].pid) in await served_by(handles)

        await until(second_worker_took_over, "the second worker taking over the storm", timeout=120)
        with worker_env(prod, settings):  # the killed one comes back
            workers[0] = prod.start_worker(0)
        pids_0.append(workers[0].pid)
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 400)
        fleet = await fleet_status(prod_client, settings)
    finally:
        for w in workers:
            Sandbox.stop_process(w)

    assert [(r.outcome, r.action) for r in results] == [("resolved", ActionClass.REPLACE_NODE)] * ACTIVE, [
        (r.node, r.outcome, r.reason) for r in results
    ]
    log = slurmctld_log(prod)
    for node in failing:  # drained once (DRAINING with a job on it, DRAINED without)
        assert len(re.findall(rf"node {node} state set to DRAIN", log)) == 1, node
    for job in jobs:
        said = [line for line in log.splitlines() if re.search(rf"JobId={job}\b", line)]
        started_on = [m[1] for line in said if (m := re.search(r"Allocate JobId=\d+ NodeList=(\S+)", line))]
        # Requeued once per incident that found it. A storm can have more than one: the job may
        # start again on a failing node whose incident has not drained it yet (its grant or its
        # retried drain still to come), and that incident requeues it again from there.
        requeued_by = sorted(r.node for r in results for j in r.jobs_resumed if j.job_id == job)
        assert requeued_by == sorted(started_on[:-1]) and started_on[-1] not in failing, "\n".join(said)
        assert sum("Requeuing" in line for line in said) == len(requeued_by), "\n".join(said)
        snapshot = prod.job(job)
        assert snapshot is not None and snapshot.state == "RUNNING", snapshot
        assert snapshot.restart_count == len(requeued_by), snapshot
    # One spare per incident run, each a different one, each now in service.
    taken = json.loads((prod.slurm_dir / "provider" / "replacements.json").read_text())
    assert len(taken) == ACTIVE and len(set(taken.values())) == ACTIVE
    assert sorted(r.replacement_node or "" for r in results) == sorted(taken.values())
    # Only the two workers' processes ran the incidents' tasks: each task's started event names
    # the worker that took it.
    worker_0 = {identity(pid) for pid in pids_0}
    worker_1 = identity(workers[1].pid)
    served = await served_by(handles)
    assert served <= worker_0 | {worker_1} and identity(pids_0[0]) in served and worker_1 in served, served
    # No grant left behind, nothing held.
    assert fleet.out_of_service == () and fleet.held == ()


async def served_by(handles: list[WorkflowHandle[Any, Any]]) -> set[str]:
    """The identities of the workers that took the incidents' workflow and activity tasks."""
    who: set[str] = set()
    for handle in handles:
        async for event in handle.fetch_history_events():
            if event.HasField("workflow_task_started_event_attributes"):
                who.add(event.workflow_task_started_event_attributes.identity)
            elif event.HasField("activity_task_started_event_attributes"):
                who.add(event.activity_task_started_event_attributes.identity)
    return who


def identity(pid: int) -> str:
    return f"{pid}@{socket.gethostname()}"  # the SDK's default worker identity


async def acting_on(handles: list[WorkflowHandle[Any, Any]], worker: str) -> bool:
    """Whether `worker` runs one of the incidents' steps on Slurm or the nodes now: not one of the
    calls that wait on the coordinator for a grant, which have no heartbeat (the README's
    Production says why) and so are retried only after their 180 s timeout."""
    for handle in handles:
        for pending in (await handle.describe()).raw_description.pending_activities:
            waits = pending.activity_type.name in WAITS_FOR_GRANT
            if pending.state == STARTED and pending.last_worker_identity == worker and not waits:
                return True
    return False


async def polls(client: Client, task_queue: str, worker: str) -> bool:
    """Whether `worker` polls `task_queue` for workflow tasks (what `temporal task-queue describe`
    lists)."""
    described = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    return any(p.identity == worker for p in described.pollers)
