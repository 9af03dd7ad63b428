"""Several workers on the Temporal cluster: two gpuheal worker processes on one task queue, a
storm of incidents, and in its middle a worker SIGKILLed, the Temporal server's process
restarted and PostgreSQL restarted. Every incident ends in its named state; Slurm's log shows one
drain per node and one requeue per job; each incident took one spare; no grant is left."""

from __future__ import annotations

import asyncio
import json
import re
import signal

import pytest
from temporalio.client import Client

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
        workers = [prod.start_worker(0), prod.start_worker(1)]
    try:
        handles = [await start_or_join(prod_client, settings, report(settings, n, 79)) for n in failing]

        async def some_drained_none_done() -> bool:
            stages = [(await h.query(GpuRemediationWorkflow.status)).stage for h in handles]
            drained = sum(1 for n in prod.nodes().values() if n.drained)
            return drained >= 2 and Stage.DONE not in stages

        await until(some_drained_none_done, "the storm under way", timeout=120)
        workers[0].send_signal(signal.SIGKILL)  # mid-activity, no graceful shutdown
        workers[0].wait()
        await asyncio.to_thread(prod.restart_temporal_server)
        await asyncio.to_thread(prod.restart_postgres)
        with worker_env(prod, settings):
            workers[0] = prod.start_worker(0)
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
        assert log.count(f"Requeuing JobId={job}") == 1, job
        snapshot = prod.job(job)
        assert snapshot is not None and snapshot.state == "RUNNING" and snapshot.restart_count == 1
    resumed = sorted(r.job_id for result in results for r in result.jobs_resumed)
    assert resumed == sorted(jobs)  # each job accounted for by the incident of its node
    # One spare per incident run, each a different one, each now in service.
    taken = json.loads((prod.slurm_dir / "provider" / "replacements.json").read_text())
    assert len(taken) == ACTIVE and len(set(taken.values())) == ACTIVE
    assert sorted(r.replacement_node or "" for r in results) == sorted(taken.values())
    # Both workers ran incidents' steps (the killed one before its kill or after its restart).
    served = [(prod.root / name).read_text() for name in ("worker.log", "worker-1.log")]
    assert all(text.count(f"'task_queue': '{settings.task_queue}'") >= 5 for text in served)
    # No grant left behind, nothing held.
    assert fleet.out_of_service == () and fleet.held == ()
