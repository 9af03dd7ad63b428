"""Jobs first, on the real Temporal dev server and Slurm sandbox: never kill a job by asking it to
checkpoint, never lose one, confirmed checkpoints, owners told, multi-node jobs recovered once, a
retry budget, and a clear end when no spare is left."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from temporalio.client import Client

from gpuheal.activities.interface import WAIT_FOR_JOB_RESUME
from gpuheal.clients.slurm.hostlist import expand
from gpuheal.core.fleet.policy import BudgetPolicy
from gpuheal.core.models.base import ActionClass, Stage
from gpuheal.core.models.incident import ApprovalPolicy
from gpuheal.core.models.result import JobFate, RemediationResult
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import start_or_join
from gpuheal.workers.main import make_worker
from gpuheal.workflows.remediation import GpuRemediationWorkflow
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import (
    Inbox,
    gpuheal,
    max_activity_attempt,
    report,
    slurmctld_log,
    until,
    worker_env,
)
from tests.integration.test_fleet import sized, with_fleet
from tests.integration.test_loop import wait_for_recovery_stage

pytestmark = pytest.mark.integration


def tuned(settings: Settings, **remediation: Any) -> Settings:
    jobs = remediation.pop("jobs", {})
    r = settings.remediation.model_copy(update=remediation)
    r = r.model_copy(update={"jobs": r.jobs.model_copy(update=jobs)})
    return settings.model_copy(update={"remediation": r})


async def test_only_jobs_that_ask_are_signalled_and_every_job_is_accounted_for(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    """On one failing node: a plain script that does not trap SIGUSR1 (never signalled, requeued,
    runs again), a job that opted in but never confirms (the stage ends at the grace and says
    so), and a short job that ends by itself during the incident (listed as ended)."""
    settings = tuned(settings, checkpoint_grace_s=5, verify_timeout_s=90)
    # Not pinned with --nodelist (a pinned job cannot move): Slurm fills the first node (4 CPUs).
    plain = slurm.submit_script("plain", "sleep 600")
    mute = slurm.submit_training("mute", env={"TRAIN_IGNORE_CHECKPOINT_REQUEST": "1"})
    node = await asyncio.to_thread(slurm.wait_for_step, mute, 2)
    short = slurm.submit_script("short", "sleep 4")
    await until(lambda: (j := slurm.job(short)) is not None and j.state == "RUNNING", "the short job running")
    assert {slurm.job(j).nodes for j in (plain, mute, short)} == {node}  # type: ignore[union-attr]
    slurm.inject_gpu_fault(node)
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report(settings, node))
        result: RemediationResult = await asyncio.wait_for(handle.result(), 150)

    accounts = {a.job_id: a for a in result.jobs}
    assert set(accounts) == {plain, mute, short}  # every job that was on the node, accounted for
    assert accounts[plain].checkpoint is not None and accounts[plain].checkpoint.signal is None
    assert "not signalled" in accounts[plain].checkpoint.detail
    assert accounts[plain].fate == JobFate.REQUEUED and accounts[plain].resumed is not None
    assert accounts[mute].checkpoint is not None and not accounts[mute].checkpoint.confirmed
    assert "no confirmation after 5." in accounts[mute].checkpoint.detail
    assert accounts[short].fate == JobFate.ENDED and accounts[short].slurm_state == "COMPLETED"
    assert not accounts[short].caused_by_gpuheal
    protect = next(s for s in result.stages if s.stage == Stage.PROTECT)
    assert protect.duration_s is not None and 5 <= protect.duration_s < 10
    # What Slurm says: the plain job was not killed by a signal; it runs again, elsewhere.
    j = slurm.job(plain)
    assert j is not None and j.state == "RUNNING" and j.restart_count == 1 and node not in expand(j.nodes)


async def test_a_confirmed_checkpoint_ends_the_wait_at_once(slurm: Sandbox, settings: Settings, client: Client) -> None:
    settings = tuned(settings, checkpoint_grace_s=30)
    job = slurm.submit_training("confirm", step_s=0.3)
    node = await asyncio.to_thread(slurm.wait_for_step, job, 3)
    slurm.inject_gpu_fault(node)
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report(settings, node))
        result = await asyncio.wait_for(handle.result(), 120)
    protect = next(s for s in result.stages if s.stage == Stage.PROTECT)
    assert protect.duration_s is not None and protect.duration_s < 3  # not the 30 s grace
    (account,) = result.jobs
    assert account.checkpoint is not None and account.checkpoint.confirmed
    assert account.checkpoint.after_s < 1.5
    assert f"checkpoint confirmed at step {account.checkpoint.step} after" in protect.outcome
    assert result.steps_lost == 0  # it checkpointed where it stopped


async def test_owners_hear_once_per_job_per_stage_across_a_worker_kill(
    slurm: Sandbox, settings: Settings, client: Client, receiver: tuple[str, Inbox]
) -> None:
    url, received = receiver
    with worker_env(slurm, settings, GPUHEAL_CHECKPOINT_GRACE_S="5", GPUHEAL_OWNER_ROUTES=json.dumps({"*": url})):
        job = slurm.submit_training("owned", step_s=1.5, env={"TRAIN_NOTIFY": "alice@example.com"})
        node = await asyncio.to_thread(slurm.wait_for_step, job, 2)
        worker = slurm.start_worker()
        slurm.inject_gpu_fault(node)
        handle = await start_or_join(client, settings, report(settings, node))
        recovery = await wait_for_recovery_stage(client, handle, "verifying", running=WAIT_FOR_JOB_RESUME.name)
        worker.send_signal(9)
        worker.wait()
        worker = slurm.start_worker()
        try:
            result = await asyncio.wait_for(handle.result(), 150)
        finally:
            Sandbox.stop_process(worker)
    events = [body["event"] for _, body in received]
    assert events == ["job_hit", "job_running_again"]  # once each, across the kill
    assert len({key for key, _ in received}) == len(received)
    assert all(key.startswith(f"{recovery}/") and f":{job}:" in key for key, _ in received)
    hit, back = (body for _, body in received)
    assert hit["job_id"] == job and hit["user"] == "root" and node in hit["nodes"]
    assert hit["recipients"] == ["root", "alice@example.com"]
    assert "XID 79" in hit["message"] and hit["steps_at_risk"] is not None
    assert back["step"] is not None and back["gpu_seconds_lost"] is not None
    assert result.jobs[0].resumed is not None
    assert await max_activity_attempt(client.get_workflow_handle(recovery)) >= 2


async def test_a_job_hit_on_two_nodes_is_requeued_once_and_verified_once(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    job = slurm.submit_training("wide", nodes=2)
    first, second = expand(await asyncio.to_thread(slurm.wait_for_step, job, 3))
    for node in (first, second):
        slurm.inject_gpu_fault(node)
    async with make_worker(client, settings):
        a = await start_or_join(client, settings, report(settings, first, 79))
        b = await start_or_join(client, settings, report(settings, second, 79))
        results = await asyncio.wait_for(asyncio.gather(a.result(), b.result()), 180)
    (ja,), (jb,) = (r.jobs for r in results)
    assert ja.recovery_id == jb.recovery_id and ja.recovery_id is not None  # one recovery
    assert {ja.joined, jb.joined} == {False, True}  # one started it, the other joined it
    assert ja.resumed is not None and jb.resumed is not None
    assert slurmctld_log(slurm).count(f"Requeuing JobId={job}") == 1  # requeued once
    j = slurm.job(job)
    assert j is not None and j.restart_count == 1
    assert not {first, second} & set(expand(j.nodes))
    history = await client.get_workflow_handle(ja.recovery_id).fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert scheduled.count("requeue_slurm_job") == 1 and scheduled.count("wait_for_job_resume") == 1


async def test_the_fourth_failure_within_the_window_holds_the_job(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    job = slurm.submit_training("flaky", step_s=0.3)
    results = []
    async with make_worker(client, settings):
        for _ in range(4):
            node = await asyncio.to_thread(slurm.wait_for_step, job, 3, 90)
            slurm.inject_gpu_fault(node)
            handle = await start_or_join(client, settings, report(settings, node, 48))  # reset_gpu
            results.append(await asyncio.wait_for(handle.result(), 120))
            if results[-1].jobs[0].fate == JobFate.HELD:
                break
    fates = [r.jobs[0].fate for r in results]
    assert fates == [JobFate.REQUEUED, JobFate.REQUEUED, JobFate.REQUEUED, JobFate.HELD]
    held = results[-1].jobs[0]
    assert "retry budget spent: requeued by gpuheal 3 times" in held.detail
    assert all(r.node in held.detail for r in results)  # every node it failed on is a suspect
    j = slurm.job(job)
    assert j is not None and j.state == "PENDING" and "Held" in j.state_reason


async def test_no_spare_ends_in_a_clear_state_within_its_bound(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    settings = tuned(
        settings,
        capacity_wait_s=8,
        capacity_retry_s=2,
        verify_timeout_s=15,
        jobs={"verify_timeout_s": 15, "start_wait_s": 10},  # it never runs again: silent after both
    )
    slurm.spares_out_of_stock(True)
    job = slurm.submit_training("stuck")
    node = await asyncio.to_thread(slurm.wait_for_step, job, 3)
    for other in {"gpu01", "gpu02", "gpu03"} - {node}:  # nowhere else for it to run
        slurm.submit_script(f"fill-{other}", "sleep 600", nodelist=other, exclusive=True)
    slurm.inject_gpu_fault(node)
    started = asyncio.get_running_loop().time()
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report(settings, node, 79))
        result = await asyncio.wait_for(handle.result(), 60)
        took = asyncio.get_running_loop().time() - started
        # The job's recovery goes on after the incident closed, and ends at its own bound: silent.
        (account,) = result.jobs
        assert account.recovery_id is not None
        recovered = await asyncio.wait_for(client.get_workflow_handle(account.recovery_id).result(), 60)
    assert result.outcome == "no_capacity" and took < 40  # a named end, within its bound
    assert f"{node} drained and out; replacement pending" in result.node_detail
    assert f"pending on the cluster without {node}" in result.node_detail
    waiting = next(s for s in result.stages if s.stage == Stage.AWAITING_CAPACITY)
    assert waiting.duration_s is not None and 8 <= waiting.duration_s < 15
    history = await handle.fetch_history()
    replaces = [
        e
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == "replace_node"
    ]
    assert 3 <= len(replaces) <= 7  # once, then every 2 s for 8 s: nothing loops
    j = slurm.job(job)
    assert j is not None and j.state == "PENDING" and node in j.excluded_nodes
    assert recovered["verify"]["outcome"] == "silent" and "PENDING" in recovered["detail"]


async def test_a_restart_that_dies_is_seen_at_once_and_a_silent_one_at_its_deadline(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    settings = tuned(settings, jobs={"verify_timeout_s": 20})
    dies = slurm.submit_training("dies", env={"TRAIN_ON_RESTART": "fail"})
    hangs = slurm.submit_training("hangs", env={"TRAIN_ON_RESTART": "hang"})
    node = await asyncio.to_thread(slurm.wait_for_step, dies, 3)
    await asyncio.to_thread(slurm.wait_for_step, hangs, 3)
    assert slurm.job(hangs).nodes == node  # type: ignore[union-attr]
    slurm.inject_gpu_fault(node)
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report(settings, node))
        result = await asyncio.wait_for(handle.result(), 120)
    accounts = {a.job_id: a for a in result.jobs}
    assert accounts[dies].resumed is None and "did not resume: it FAILED" in accounts[dies].detail
    assert accounts[hangs].resumed is None and "did not resume by its deadline" in accounts[hangs].detail
    assert result.outcome == "resolved"  # the node's part is done; the jobs' part says what failed
    by_job = {}
    for account in (accounts[dies], accounts[hangs]):
        assert account.recovery_id is not None
        history = await client.get_workflow_handle(account.recovery_id).fetch_history()
        verify = [e for e in history.events if e.HasField("activity_task_completed_event_attributes")]
        by_job[account.job_id] = (
            history.events[-1].event_time.ToDatetime() - history.events[0].event_time.ToDatetime()
        ).total_seconds()
        assert verify
    assert by_job[dies] < 15 <= by_job[hangs]  # dead at once; silent at its 20 s deadline


async def test_a_requeued_job_never_lands_on_a_node_whose_incident_has_not_drained_it_yet(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    """Two nodes in service, a budget of one, nothing drained while held, replacements approved
    by a person. The node under a training job loses its GPU (XID 79): granted, it waits for
    approval. The idle node reports XID 48: held by the budget, its incident open, its node in
    service. Once approved, the job is requeued excluding both, so it waits for the replacement
    instead of starting on the failing idle node (and being requeued from there again): one
    restart, on the replacement."""
    sized(slurm, 2, 2)
    settings = with_fleet(
        settings,
        budget=BudgetPolicy(cluster="1", node_cooldown_s=0),
        containment_while_held="none",
        approval=ApprovalPolicy(required_for=(ActionClass.REPLACE_NODE,), timeout_s=600),
    )
    job = slurm.submit_training("storm", sbatch_args=("--exclusive",))
    first = await asyncio.to_thread(slurm.wait_for_step, job, 3)
    (other,) = {"gpu01", "gpu02"} - {first}
    async with make_worker(client, settings):
        slurm.inject_gpu_fault(first)
        lost = await start_or_join(client, settings, report(settings, first, 79))
        await until(lambda: _awaiting(lost), f"{first}'s replacement waiting for approval")
        failing = await start_or_join(client, settings, report(settings, other, 48))

        async def held() -> bool:
            return (await failing.query(GpuRemediationWorkflow.status)).stage == Stage.HELD

        await until(held, f"{other}'s reset held by the budget")
        assert not slurm.nodes()[other].drained  # failing, its incident open, and still in service
        approved = await gpuheal(slurm, settings, "approve", first, "--operator", "t", "--reason", "go")
        assert approved.returncode == 0, approved.stderr
        result: RemediationResult = await asyncio.wait_for(lost.result(), 240)
        reset = await asyncio.wait_for(failing.result(), 120)  # granted once the replacement freed the budget
    assert result.outcome == "resolved" and result.replacement_node is not None, result.reason
    assert reset.outcome == "resolved", reset.reason
    (account,) = result.jobs
    assert account.resumed is not None and account.resumed.node == result.replacement_node
    said = [line for line in slurmctld_log(slurm).splitlines() if re.search(rf"JobId={job}\b", line)]
    assert not any(other in line for line in said if "Allocate" in line or "Started" in line), "\n".join(said)
    j = slurm.job(job)
    assert j is not None and j.restart_count == 1 and j.nodes == result.replacement_node


async def _awaiting(handle: Any) -> bool:
    return bool((await handle.query(GpuRemediationWorkflow.status)).awaiting_approval)
