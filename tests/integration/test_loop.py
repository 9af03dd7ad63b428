"""The whole loop on the real Temporal dev server and the real Slurm sandbox."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from typing import Any

import pytest
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import Client, WorkflowFailureError

from gpuheal.activities.interface import WAIT_FOR_JOB_RESUME
from gpuheal.core import ids, queries
from gpuheal.core import search_attributes as sa
from gpuheal.core.messages import INCIDENT, RECOVERY_STATUS
from gpuheal.core.models.base import ActionClass, Stage
from gpuheal.core.models.incident import ApprovalPolicy
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import start_or_join
from gpuheal.workflows.remediation import GpuRemediationWorkflow
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import (
    across_slurm,
    max_activity_attempt,
    nodes_in_service,
    report,
    slurmctld_log,
    worker_env,
)

pytestmark = pytest.mark.integration


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def alert_for(sb: Sandbox, settings: Settings, node: str, xid: int) -> dict[str, object]:
    return sb.alertmanager_payload(node, xid, cluster=settings.cluster)


async def wait_for_recovery_stage(
    client: Client, incident: Any, stage: str, timeout: float = 60, running: str | None = None
) -> str:
    """The id of the incident's (first) job recovery, once that recovery is at `stage` and, with
    `running`, that activity has started on a worker (not only been scheduled: a worker killed
    before it picks the activity up interrupts nothing, and the next one runs its first attempt)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        history = await incident.fetch_history()
        for e in history.events:
            if e.HasField("activity_task_completed_event_attributes"):
                text = e.activity_task_completed_event_attributes.result.payloads[0].data.decode()
                if '"recovery_id"' in text:
                    recovery = client.get_workflow_handle(json.loads(text)["recovery_id"])
                    status = await RECOVERY_STATUS.ask(recovery)
                    if status.stage == stage and (running is None or await started(recovery, running)):
                        return str(recovery.id)
        await asyncio.sleep(0.1)
    raise AssertionError(f"no job recovery reached {stage}" + (f" with {running} started" if running else ""))


async def started(handle: Any, activity: str) -> bool:
    """Whether `activity` of the workflow is started on a worker now."""
    pending = (await handle.describe()).raw_description.pending_activities
    return any(
        a.activity_type.name == activity and a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
        for a in pending
    )


async def count_incidents(client: Client, settings: Settings) -> int:
    incidents = queries.where(queries.of_type(INCIDENT), queries.eq(sa.CLUSTER, settings.cluster or ""))
    return (await client.count_workflows(incidents)).count


@across_slurm
async def test_whole_loop_from_alert_to_resumed_training(
    webhook: Sandbox, settings: Settings, client: Client, worker: None
) -> None:
    sb = webhook
    job = sb.submit_training("loop")
    node = await asyncio.to_thread(sb.wait_for_step, job, 12)
    sb.inject_gpu_fault(node)
    status, body = await asyncio.to_thread(sb.post_alert, alert_for(sb, settings, node, 79))
    assert status == 200, body
    handle = client.get_workflow_handle_for(GpuRemediationWorkflow.run, ids.incident_id(settings.cluster, node))
    result = await asyncio.wait_for(handle.result(), 120)

    assert result.outcome == "resolved" and result.action == ActionClass.REPLACE_NODE
    (resumed,) = result.jobs_resumed
    assert resumed.job_id == job and node not in resumed.node
    assert resumed.step > resumed.checkpoint_step >= 10
    # What Slurm itself says: the job runs elsewhere, restarted once, past its checkpoint.
    j = sb.job(job)
    assert j is not None and j.state == "RUNNING" and j.restart_count == 1
    progress = sb.job_progress(job)
    assert progress is not None and progress.step > resumed.checkpoint_step
    # The failed node left the cluster; a spare joined.
    assert result.replacement_node in nodes_in_service(sb)
    assert node not in nodes_in_service(sb)
    log = slurmctld_log(sb)
    assert f"node {node} reason set to: {result.incident_id}:" in log
    assert result.mttr_s is not None and 0 < result.mttr_s < 60
    assert [s.stage for s in result.stages][-1] == Stage.CLOSE

    # A late report for the node it replaced (an agent that lagged): a named outcome that says
    # by which node and in which incident, not "no node named"; nothing is touched.
    late = await start_or_join(client, settings, report(settings, node, 79))
    again = await asyncio.wait_for(late.result(), 60)
    assert again.outcome == "already_replaced", again.reason
    assert f"replaced it by {result.replacement_node} in incident {result.incident_id}" in again.reason
    assert slurmctld_log(sb).count(f"node {node} state set to DRAINING") == 1
    assert result.replacement_node in nodes_in_service(sb)


@across_slurm
async def test_two_reports_for_one_node_make_one_workflow_and_one_drain(
    slurm: Sandbox, settings: Settings, client: Client, worker: None
) -> None:
    job = slurm.submit_training("dup")
    node = await asyncio.to_thread(slurm.wait_for_step, job, 3)
    first = await start_or_join(client, settings, report(settings, node, 79, gpu=0))
    second = await start_or_join(client, settings, report(settings, node, 79, gpu=1))
    assert first.id == second.id
    result = await asyncio.wait_for(first.result(), 120)
    assert await count_incidents(client, settings) == 1
    assert len(result.reports) == 2
    assert slurmctld_log(slurm).count(f"node {node} state set to DRAINING") == 1
    assert slurmctld_log(slurm).count(f"Requeuing JobId={job}") == 1


@across_slurm
async def test_job_submitted_with_no_requeue_is_reported_not_dropped(
    slurm: Sandbox, settings: Settings, client: Client, worker: None
) -> None:
    keep = slurm.submit_training("keep")
    node = await asyncio.to_thread(slurm.wait_for_step, keep, 1)
    stuck = slurm.submit_training("stuck", requeue=False, nodelist=node)
    await asyncio.to_thread(slurm.wait_for_step, stuck, 3)
    slurm.inject_gpu_fault(node)
    handle = await start_or_join(client, settings, report(settings, node))
    result = await asyncio.wait_for(handle.result(), 120)
    unrequeued = {u.job_id: u.reason for u in result.jobs_not_requeued}
    assert "--no-requeue" in unrequeued[stuck]
    if (slurm.slurm_backend, slurm.slurm_version) == ("rest", "24.11"):
        # slurmrestd 24.11 has no requeue call; requeueing through the node would end `stuck`:
        # gpuheal refuses, and says so, rather than kill it.
        assert result.jobs_requeued == [] and set(unrequeued) == {keep, stuck}
        assert "has no requeue call" in unrequeued[keep] and f"{stuck} (stuck)" in unrequeued[keep]
        return
    assert [r.job_id for r in result.jobs_requeued] == [keep]
    assert list(unrequeued) == [stuck]
    assert [r.job_id for r in result.jobs_resumed] == [keep]


async def test_abort_during_approval_leaves_the_node_drained_not_replaced(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    approval = ApprovalPolicy(required_for=(ActionClass.REPLACE_NODE,), timeout_s=600)
    settings = settings.model_copy(update={"fleet": settings.fleet.model_copy(update={"approval": approval})})
    from gpuheal.workers.main import make_worker

    job = slurm.submit_training("abort")
    node = await asyncio.to_thread(slurm.wait_for_step, job, 3)
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report(settings, node))
        for _ in range(100):
            status = await handle.query(GpuRemediationWorkflow.status)
            if status.awaiting_approval:
                break
            await asyncio.sleep(0.1)
        assert status.awaiting_approval
        env = {**slurm.env(), "GPUHEAL_CLUSTER": settings.cluster}
        cli = await asyncio.to_thread(
            subprocess.run,
            [
                os.path.join(os.path.dirname(sys.executable), "gpuheal"),
                "abort",
                node,
                "--operator",
                "oncall-bob",
                "--reason",
                "vendor says firmware bug, not the GPU",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 0, cli.stderr
        assert "abort recorded" in cli.stdout
        result = await asyncio.wait_for(handle.result(), 60)
    assert result.outcome == "aborted"
    assert "gpuheal return " in result.node_detail
    state = slurm.nodes()[node]
    assert state.drained and state.reason.startswith(result.incident_id)
    assert nodes_in_service(slurm) == {"gpu01", "gpu02", "gpu03"}  # no spare started
    j = slurm.job(job)
    assert j is not None and j.state == "RUNNING" and j.restart_count == 0  # untouched


@across_slurm
async def test_worker_killed_mid_remediation_finishes_without_repeating_actions(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    with worker_env(slurm, settings):
        # Steps 5 s apart: the verification lasts at least one step after the job runs again
        # (it sees the restarted job within 0.1 s), a window wide enough on a loaded machine.
        job = slurm.submit_training("crash", step_s=5.0)
        node = await asyncio.to_thread(slurm.wait_for_step, job, 2)
        worker = slurm.start_worker()
        slurm.inject_gpu_fault(node)
        handle = await start_or_join(client, settings, report(settings, node))
        # Kill the worker while the job's recovery verifies its resume (an activity in flight).
        recovery = await wait_for_recovery_stage(client, handle, "verifying", running=WAIT_FOR_JOB_RESUME.name)
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        worker = slurm.start_worker()
        try:
            result = await asyncio.wait_for(handle.result(), 120)
            # the restarted worker serves the project's metrics and the SDK's
            ours = await asyncio.to_thread(scrape, slurm.metrics_port)
            sdk = await asyncio.to_thread(scrape, slurm.metrics_port + 1)
        finally:
            Sandbox.stop_process(worker)
        assert worker.returncode == 0  # SIGTERM: a graceful shutdown
    assert result.outcome == "resolved"
    log = slurmctld_log(slurm)
    assert log.count(f"node {node} state set to DRAINING") == 1
    assert log.count(f"Requeuing JobId={job}") == 1
    j = slurm.job(job)
    assert j is not None and j.restart_count == 1
    spares = {"gpu04", "gpu05", "gpu06"} & nodes_in_service(slurm)
    assert spares == {result.replacement_node}  # one spare, not two
    assert 'gpuheal_mttr_seconds_count{action="replace_node"} 1.0' in ours
    assert 'gpuheal_incidents_closed_total{action="replace_node",outcome="resolved"} 1.0' in ours
    assert 'gpuheal_stage_duration_seconds_count{stage="verify_resume"} 1.0' in ours
    assert "temporal_" in sdk and "activity" in sdk
    # the verify activity (in the job's recovery) really was retried on the new worker
    (account,) = result.jobs
    assert account.recovery_id is not None
    assert account.recovery_id == recovery
    assert await max_activity_attempt(client.get_workflow_handle(account.recovery_id)) >= 2


@across_slurm
async def test_report_for_an_unknown_node_fails_fast_and_names_it(
    slurm: Sandbox, settings: Settings, client: Client, worker: None
) -> None:
    handle = await start_or_join(client, settings, report(settings, "gpu99"))
    with pytest.raises(WorkflowFailureError) as err:
        await asyncio.wait_for(handle.result(), 30)
    assert "gpu99" in str(err.value.cause)
    assert "no node named" in str(err.value.cause)
    assert "DRAINING" not in slurmctld_log(slurm)


async def test_malformed_webhook_bodies_are_refused_and_start_nothing(
    webhook: Sandbox, settings: Settings, client: Client
) -> None:
    sb = webhook
    good = alert_for(sb, settings, "gpu01", 79)
    no_node = alert_for(sb, settings, "gpu01", 79)
    for a in no_node["alerts"]:  # type: ignore[attr-defined]
        del a["labels"]["node"]
    cases: list[tuple[dict[str, object] | bytes, str | None, int, str]] = [
        (b"{not json", None, 400, "not JSON"),
        (json.dumps({"version": "3", "alerts": []}).encode(), None, 400, "Alertmanager v4"),
        (no_node, None, 400, "no node label"),
        (good, "wrong-token", 401, "bearer token"),
        (good, "", 401, "bearer token"),
        (b"x" * (300 * 1024), None, 413, "larger than"),
    ]
    for body, token, code, reason in cases:
        status, answer = await asyncio.to_thread(sb.post_alert, body, token)
        assert status == code, (reason, answer)
        assert reason in json.dumps(answer), answer
    await asyncio.sleep(0.5)
    assert await count_incidents(client, settings) == 0
    assert "DRAINING" not in slurmctld_log(sb)
