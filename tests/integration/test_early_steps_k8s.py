"""The early steps side by side with the Kubernetes half (design 012), on the real kube-apiserver
and kwok with the Slurm sandbox: the drain and its cordon go beside the checkpoint wait, and
neither a report that comes meanwhile nor a NoExecute taint can undo what the checkpoint is for."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from gpuheal.core.models.base import ActionClass, Stage
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import start_or_join
from gpuheal.workers.main import make_worker
from gpuheal.workflows.remediation import GpuRemediationWorkflow
from infra.sandbox.kube import KubeSandbox
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import report, stage_ended, until

pytestmark = pytest.mark.integration

# Long enough never to end first, also for a job whose progress reports lag on a loaded machine:
# the test's gate, not the grace, ends each checkpoint wait.
GRACE = {"checkpoint_grace_s": 300, "checkpoint_unconfirmed_wait_s": 300}


def held_open(slurm: Sandbox, name: str) -> tuple[int, Path]:
    """A training job that confirms gpuheal's checkpoint request only once its gate file exists."""
    gate = slurm.slurm_dir / "jobs" / f"{name}-{time.time_ns()}.may-checkpoint"
    job = slurm.submit_training(name, ckpt_every=1_000_000, env={"TRAIN_CHECKPOINT_WHEN": str(gate)})
    return job, gate


def tuned(settings: Settings, **kubernetes: Any) -> Settings:
    r = settings.remediation
    k8s = r.kubernetes.model_copy(update=kubernetes) if r.kubernetes is not None else None
    return settings.model_copy(update={"remediation": r.model_copy(update={**GRACE, "kubernetes": k8s})})


async def stage_records(handle: Any) -> dict[Stage, Any]:
    status = await handle.query(GpuRemediationWorkflow.status)
    return {r.stage: r for r in status.stages}


async def test_a_severe_report_after_the_cordon_beside_the_checkpoint_escalates_the_run(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings, client: Client
) -> None:
    """XID 48 (reset): the drain and the cordon are done while the job has not checkpointed yet,
    and the incident's last stage started is the cordon. An XID 79 then still escalates the run
    itself (its plan is not set): the node is replaced in this run, never reset, no follow-up."""
    settings = tuned(k8s_settings)
    job, gate = held_open(slurm, "escalate")
    target = await asyncio.to_thread(slurm.wait_for_step, job, 3)
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report(settings, target, 48, gpu=None))
        await stage_ended(handle, Stage.CORDON)  # beside the checkpoint wait
        assert (await stage_records(handle))[Stage.PROTECT].ended_at is None
        await start_or_join(client, settings, report(settings, target, 79, gpu=None))

        async def escalated() -> bool:
            return (await handle.query(GpuRemediationWorkflow.status)).action == ActionClass.REPLACE_NODE

        await until(escalated, "the run escalated to a replacement")
        gate.touch()
        result = await asyncio.wait_for(handle.result(), 180)
    assert result.outcome == "resolved" and result.action == ActionClass.REPLACE_NODE, result.reason
    assert [r.xid for r in result.reports] == [48, 79] and result.replacement_node is not None
    assert not any(r.stage == Stage.REPAIR and "reset" in r.outcome for r in result.stages)


async def test_a_no_execute_cordon_waits_for_the_checkpoint(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings, client: Client
) -> None:
    """With GPUHEAL_K8S_NO_EXECUTE the cordon's NoExecute taint would evict the node's pods at
    once (slurmd's among them, on Slurm on Kubernetes): the Slurm drain goes beside the
    checkpoint wait, the cordon only after it, and the pods stay until then."""
    settings = tuned(k8s_settings, no_execute=True)
    job, gate = held_open(slurm, "noexec")
    target = await asyncio.to_thread(slurm.wait_for_step, job, 3)
    await asyncio.to_thread(kube.add_pod, f"slurmd-{target}", target, labels={"app": "slurmd"})
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report(settings, target, 48, gpu=None))
        await stage_ended(handle, Stage.DRAIN)  # beside the checkpoint wait
        await asyncio.sleep(3)  # time enough for a cordon beside it to have come
        assert Stage.CORDON not in await stage_records(handle)
        core: Any = kube.core()
        assert not core.read_node(target).spec.unschedulable
        pod = core.read_namespaced_pod(f"slurmd-{target}", "default")
        assert pod.metadata.deletion_timestamp is None  # not evicted while its job checkpoints
        gate.touch()
        result = await asyncio.wait_for(handle.result(), 180)
    assert result.outcome == "resolved", result.reason
    stages = {r.stage: r for r in result.stages}
    checkpointed = stages[Stage.PROTECT].ended_at
    assert checkpointed is not None and stages[Stage.CORDON].started_at >= checkpointed
    # What it waited for: the taint manager removes the pod by itself once the taint is on.
    names = [
        p.metadata.name for p in core.list_namespaced_pod("default").items if p.metadata.deletion_timestamp is None
    ]
    assert f"slurmd-{target}" not in names
