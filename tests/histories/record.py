"""Record the replay histories in tests/histories from real runs (`make histories`).

Each scenario runs on the real stack (Temporal dev server, Slurm sandbox, and the Kubernetes
sandbox for the *_kubernetes one) with an in-process worker, and its history is saved as JSON,
with the histories of its job recoveries (NAME.job_recovery.json).
Record anew when a change is meant to be incompatible with running incidents (and say so in the
change); tests/test_replay.py then replays every saved history through the current code.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

from temporalio.client import Client, WorkflowHandle

from gpuheal.clients.temporal import connect
from gpuheal.core import ids
from gpuheal.core.models.base import ActionClass
from gpuheal.core.models.incident import ApprovalPolicy, Decision, KubernetesPolicy, RemediationSettings
from gpuheal.core.models.report import HealthReport
from gpuheal.core.models.result import RemediationResult
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import start_or_join
from gpuheal.workers.main import make_worker
from gpuheal.workflows.remediation import GpuRemediationWorkflow
from infra.sandbox import RUN
from infra.sandbox.kube import KubeSandbox
from infra.sandbox.stack import Sandbox

HERE = Path(__file__).parent
Handle = WorkflowHandle[GpuRemediationWorkflow, RemediationResult]


async def decide_when_asked(handle: Handle, verdict: str) -> None:
    for _ in range(300):
        if (await handle.query(GpuRemediationWorkflow.status)).awaiting_approval:
            update = GpuRemediationWorkflow.approve if verdict == "approve" else GpuRemediationWorkflow.abort
            await handle.execute_update(update, Decision(operator="recorder", reason=f"{verdict} for the record"))
            return
        await asyncio.sleep(0.1)
    raise TimeoutError("never asked for approval")


async def scenario(
    sb: Sandbox,
    client: Client,
    name: str,
    xid: int,
    remediation: RemediationSettings,
    steer: Callable[[Handle], Awaitable[None]] | None = None,
    kube: KubeSandbox | None = None,
    approval: ApprovalPolicy | None = None,
) -> None:
    sb.start_slurm(clean=True)
    settings = Settings.from_env(sb.env()).model_copy(
        update={"cluster": f"rec{uuid.uuid4().hex[:6]}", "task_queue": f"rec-{uuid.uuid4().hex[:6]}"}
    )
    if kube is not None:
        kube.reset_nodes(["gpu01", "gpu02", "gpu03"])
        platform = settings.provider.model_copy(update={"sandbox_kubeconfig": str(kube.admin_kubeconfig)})
        settings = settings.model_copy(update={"kubeconfig": str(kube.worker_kubeconfig), "provider": platform})
    fleet = settings.fleet.model_copy(update={"approval": approval or ApprovalPolicy()})
    settings = settings.model_copy(update={"remediation": remediation, "fleet": fleet})
    job = sb.submit_training(name)
    node = sb.wait_for_step(job, 3)
    sb.inject_gpu_fault(node)
    report = HealthReport(
        node=node, cluster=settings.cluster or "", xid=xid, gpu=0, source="recorder", observed_at=datetime.now(UTC)
    )
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report)
        if steer is not None:
            await steer(handle)
        result = await asyncio.wait_for(handle.result(), 300)
        history = await handle.fetch_history()
        recoveries = [a.recovery_id for a in result.jobs if a.recovery_id]
        for i, recovery in enumerate(recoveries):
            await client.get_workflow_handle(recovery).result()
            saved = await client.get_workflow_handle(recovery).fetch_history()
            (HERE / f"{name}.job_recovery{i or ''}.json").write_text(saved.to_json())
        coordinator = await client.get_workflow_handle(ids.coordinator_id(settings.require_cluster())).fetch_history()
    (HERE / f"{name}.json").write_text(history.to_json())
    (HERE / f"{name}.fleet.json").write_text(coordinator.to_json())
    print(
        f"recorded {name}: {result.outcome}, {len(history.events)} events, {len(recoveries)} job recoveries", flush=True
    )


async def main() -> int:
    sb = Sandbox.named("bench", RUN / "record")
    sb.start_temporal(fresh=True)
    client = await connect(Settings.from_env(sb.env()).temporal)
    quick = RemediationSettings(checkpoint_grace_s=1, verify_timeout_s=120)
    approval = ApprovalPolicy(required_for=(ActionClass.RESET_GPU,), timeout_s=600)
    try:
        await scenario(sb, client, "xid79_replace_node", 79, quick)
        approve, abort = (lambda h: decide_when_asked(h, "approve")), (lambda h: decide_when_asked(h, "abort"))
        await scenario(sb, client, "xid95_approved_reset", 95, quick, approve, approval=approval)
        await scenario(sb, client, "xid48_abort_during_approval", 48, quick, abort, approval=approval)
        kube = KubeSandbox(sb.root / "k8s", port=20443)
        kube.start()
        try:
            k8s = quick.model_copy(update={"kubernetes": KubernetesPolicy(drain_deadline_s=60)})
            await scenario(sb, client, "xid79_replace_node_kubernetes", 79, k8s, kube=kube)
        finally:
            kube.stop()
    finally:
        sb.stop_slurm()
        sb.stop_temporal()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
