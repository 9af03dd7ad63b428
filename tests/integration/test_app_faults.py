"""Application faults condemn no hardware, on the real Temporal dev server and Slurm sandbox
(issue 34, items 1-2): XID 31, then 43, then 13 on one node within a minute, under a repeat rule
of three incidents and a breaker that trips past two. Each restarts the application; none drains
the node, none is a repeat offender, the breaker stays closed, and `gpuheal fleet` says what it
counts. A hardware fault on the node afterwards is the first the coordinator counts. And the
ladder: the same GPU failing a third different job is burned in, and returned when it passes."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import Client

from gpuheal.core.fleet.policy import BreakerPolicy, RepeatPolicy
from gpuheal.core.models.base import ActionClass, NodeState
from gpuheal.core.models.result import RemediationResult
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import start_or_join
from gpuheal.workers.main import make_worker
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import gpuheal, report, until
from tests.integration.test_fleet import fleet_status, with_fleet
from tests.integration.test_validation import burn_ins, validating

pytestmark = pytest.mark.integration


async def test_application_faults_on_one_node_restart_and_condemn_nothing(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    settings = with_fleet(
        settings, repeat=RepeatPolicy(incidents=3), breaker=BreakerPolicy(max_incidents=2, window_s=600)
    )
    results: list[RemediationResult] = []
    async with make_worker(client, settings):
        for xid in (31, 43, 13):
            handle = await start_or_join(client, settings, report(settings, "gpu02", xid, gpu=1))
            results.append(await asyncio.wait_for(handle.result(), 120))
        status = await fleet_status(client, settings)
        shown = await gpuheal(slurm, settings, "fleet")
        # A hardware fault now: the first the coordinator counts (no repeat verdict from the three).
        reset = await start_or_join(client, settings, report(settings, "gpu02", 48, gpu=1))
        after: RemediationResult = await asyncio.wait_for(reset.result(), 120)
    for r in results:
        assert r.outcome == "resolved" and r.action == ActionClass.RESTART_APP, (r.action, r.reason)
        assert r.node_state == NodeState.IN_SERVICE and r.drain is None and r.replacement_node is None
        assert "repeat offender" not in r.reason
    assert not slurm.nodes()["gpu02"].drained
    assert not status.breaker.tripped, status.breaker.why
    assert shown.returncode == 0 and "application faults (XID 13, 31, 43 alone)" in shown.stdout, shown.stdout
    assert after.action == ActionClass.RESET_GPU and "repeat offender" not in after.reason, after.reason


async def test_the_same_gpu_failing_three_different_jobs_is_burned_in_and_returned(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    """XID 13 on GPU 1 of gpu02 under job A, then under job B (each restarted in place, and each
    cancelled by its owner meanwhile), then under job C: the third different job. C is requeued
    off the node, the node drained and burned in (the validation job); it passes, and the node
    is back in service. The jobs hit are named in the reason."""
    settings = validating(with_fleet(settings, repeat=RepeatPolicy(incidents=3)), slurm)
    fill = slurm.submit_script("fill-gpu01", "sleep 600", nodelist="gpu01", exclusive=True)
    slurm.submit_script("fill-gpu03", "sleep 600", nodelist="gpu03", exclusive=True)
    jobs: list[int] = []
    async with make_worker(client, settings):
        for name in ("a", "b", "c"):
            job = slurm.submit_training(f"app-{name}")
            assert await asyncio.to_thread(slurm.wait_for_step, job, 3) == "gpu02"
            jobs.append(job)
            handle = await start_or_join(client, settings, report(settings, "gpu02", 13, gpu=1))
            if name == "c":
                break

            def requeued(j: int = job) -> bool:  # restarted in place: its owner cancels it meanwhile
                snapshot = slurm.job(j)
                return snapshot is not None and snapshot.restart_count == 1

            await until(requeued, f"job {job} requeued by its application restart")
            slurm.slurm("scancel", str(job))
            done: RemediationResult = await asyncio.wait_for(handle.result(), 120)
            assert done.action == ActionClass.RESTART_APP and done.burn_in is None and done.drain is None

        def drained() -> bool:
            return slurm.nodes()["gpu02"].drained

        await until(drained, "gpu02 drained for its burn-in")
        slurm.slurm("scancel", str(fill))  # room for job C elsewhere
        result: RemediationResult = await asyncio.wait_for(handle.result(), 180)
    assert result.outcome == "resolved" and result.burn_in == "passed", result.reason
    assert result.node_state == NodeState.RETURNED and not slurm.nodes()["gpu02"].drained
    assert "3 different jobs" in result.reason and all(str(j) in result.reason for j in jobs), result.reason
    (account,) = result.jobs
    assert account.job_id == jobs[2] and account.resumed is not None and account.resumed.node != "gpu02"
    (burn_in,) = burn_ins(slurm)
    assert burn_in.endswith("COMPLETED gpu02")
