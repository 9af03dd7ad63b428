"""The demo: a GPU falls off the bus under a training job, and gpuheal brings training back.

Starts the Slurm sandbox and Temporal (the dev server with its Web UI, or with --temporal cluster
the Temporal cluster on PostgreSQL with mTLS), the worker and the webhook; submits a
small checkpointing training job; injects XID 79 on the job's node through the same path a real
alert takes (an Alertmanager webhook POST); follows the incident a line per stage; prints the
timeline and MTTR. Exits 0 only when the job has resumed past its checkpoint on another node.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError

from gpuheal.clients.temporal import connect
from gpuheal.core import ids
from gpuheal.core.models.result import RemediationResult, RemediationStatus
from gpuheal.core.render import render_result, render_timeline
from gpuheal.core.settings import Settings
from gpuheal.workflows.remediation import GpuRemediationWorkflow
from infra.sandbox import NEWEST_SLURM, RUN, SLURM_VERSIONS
from infra.sandbox.kube import KubeSandbox, binaries_built
from infra.sandbox.stack import PORTS, Sandbox
from infra.sandbox.temporal import KINDS, TemporalKind

XID = 79


def say(msg: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {msg}", flush=True)


async def follow(
    handle: WorkflowHandle[GpuRemediationWorkflow, RemediationResult], echo: bool = True
) -> RemediationResult:
    """Print a line as each stage finishes, until the workflow returns."""
    seen = 0
    while True:
        try:
            status: RemediationStatus = await handle.query(GpuRemediationWorkflow.status)
        except RPCError:
            # A query fails while a workflow task is failing or the workflow has closed badly.
            desc = await handle.describe()
            if desc.status is not None and desc.status != WorkflowExecutionStatus.RUNNING:
                return await handle.result()  # raises WorkflowFailureError with the cause
            await asyncio.sleep(1)
            continue
        finished = [s for s in status.stages if s.ended_at is not None]
        for s in finished[seen:]:
            if echo:
                say(f"  {s.stage.value:<18} {s.duration_s or 0:6.1f} s  {s.outcome}")
        seen = len(finished)
        if status.result is not None:
            return await handle.result()
        await asyncio.sleep(0.25)


def start_kubernetes(sb: Sandbox) -> KubeSandbox | None:
    """The Kubernetes half joins the demo once infra/k8s/build.sh has built its binaries."""
    if not binaries_built():
        say("Kubernetes sandbox not built yet: running Slurm only (build it with infra/k8s/build.sh, ~12 min)")
        return None
    ks = KubeSandbox(sb.root / "k8s", port=PORTS["demo"].kube)
    say("starting the Kubernetes sandbox (etcd, kube-apiserver, kube-controller-manager, kwok) on 127.0.0.1:16443")
    ks.start()
    ks.reset_nodes(["gpu01", "gpu02", "gpu03"])
    for n in ("gpu01", "gpu02", "gpu03"):
        ks.add_pod(f"slurmd-{n}", n, labels={"app": "slurmd"})
    sb.extra_env.update(
        {
            "GPUHEAL_KUBECONFIG": str(ks.worker_kubeconfig),  # the worker's ServiceAccount (infra/k8s/rbac.yaml)
            "GPUHEAL_SANDBOX_KUBECONFIG": str(ks.admin_kubeconfig),  # the sandbox's node group
        }
    )
    return ks


def print_node_events(ks: KubeSandbox, node: str) -> None:
    core: Any = ks.core()
    events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
    print(f"Kubernetes events on node {node} (kubectl describe node {node}):")
    for e in sorted(events, key=lambda e: int(e.metadata.resource_version)):  # creation order
        print(f"  {e.type:<8} {e.reason:<28} {e.message[:110]}")


class OwnerInbox:
    """The job owner's side of the demo: a local webhook that prints each owner notice."""

    def __init__(self) -> None:
        def answer(handler: BaseHTTPRequestHandler) -> None:
            body = json.loads(handler.rfile.read(int(handler.headers["Content-Length"])))
            say(f"  owner notice to {', '.join(body['recipients'])} ({body['event']}): {body['message']}")
            handler.send_response(204)
            handler.end_headers()

        handler = type("Inbox", (BaseHTTPRequestHandler,), {"do_POST": answer, "log_message": lambda *a, **k: None})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/owners"


def where_to_look(sb: Sandbox, incident: str) -> str:
    """The incident in the Web UI, or (the cluster has none here) the CLI command that shows it."""
    if sb.ui_url:
        return f"{sb.ui_url}/namespaces/default/workflows/{incident}"
    certs = sb.temporal.tls_dir
    return (
        f"TEMPORAL_ADDRESS={sb.temporal_address} TEMPORAL_TLS_SERVER_CA_CERT_PATH={certs}/ca.pem "
        f"TEMPORAL_TLS_CLIENT_CERT_PATH={certs}/gpuheal.pem TEMPORAL_TLS_CLIENT_KEY_PATH={certs}/gpuheal.key "
        f"temporal workflow show -w {incident}"
    )


async def _run(sb: Sandbox, ks: KubeSandbox | None) -> int:
    client = await connect(Settings.from_env(sb.env()).temporal)
    job = sb.submit_training(name="llm-pretrain", env={"TRAIN_NOTIFY": "ml-team@example.com"})
    say(
        f"submitted training job {job} (checkpoints every 10 steps; its progress line says it traps SIGUSR1, "
        "so gpuheal may ask it to checkpoint now)"
    )
    node = sb.wait_for_step(job, 14, show=True)
    before = sb.job_progress(job)
    say(
        f"job {job} is training on {node}: step {before.step if before else '?'}, "
        f"checkpoint at step {before.checkpoint_step if before else '?'}"
    )

    say(
        f"injecting XID {XID} (GPU fell off the bus) on {node}: the job hangs; "
        f"an Alertmanager alert goes to the webhook"
    )
    sb.inject_gpu_fault(node)
    status, body = sb.post_alert(sb.alertmanager_payload(node, XID, gpu=3))
    if status != 200:
        say(f"webhook refused the alert: HTTP {status} {body}")
        return 1
    incident = ids.incident_id(sb.cluster, node)
    say(f"incident {incident} started; see it: {where_to_look(sb, incident)}")
    handle = client.get_workflow_handle_for(GpuRemediationWorkflow.run, incident)
    result = await asyncio.wait_for(follow(handle), timeout=600)

    print()
    print(render_timeline(result.stages, result.failure_observed_at))
    print()
    print(render_result(result, where_to_look(sb, incident)))
    print()
    if ks is not None:
        print_node_events(ks, node)
        print()
    resumed = [r for r in result.jobs_resumed if r.job_id == job]
    ok = bool(resumed) and node not in resumed[0].node.split(",") and resumed[0].step > resumed[0].checkpoint_step
    sb.slurm("scancel", str(job), check=False)
    if ok:
        say(
            f"PASS: job {job} resumed on {resumed[0].node} past its checkpoint "
            f"(step {resumed[0].step} > {resumed[0].checkpoint_step}); MTTR {result.mttr_s:.1f} s"
        )
        return 0
    say(f"FAIL: job {job} did not resume past its checkpoint on another node")
    return 1


def run_demo(
    slurm_version: str = NEWEST_SLURM, backend: str = "cli", kubernetes: bool = True, temporal: TemporalKind = "dev"
) -> int:
    inbox = OwnerInbox()
    sb = Sandbox.named(
        "demo",
        RUN,
        extra_env={"GPUHEAL_CHECKPOINT_GRACE_S": "30", "GPUHEAL_OWNER_ROUTES": json.dumps({"*": inbox.url})},
        temporal_kind=temporal,
    )
    sb.use_slurm(slurm_version, backend)
    sb.extra_env["GPUHEAL_VALIDATE_JOB"] = str(sb.validate_job)  # a repaired node is burned in first
    t0 = time.monotonic()
    say(f"starting the Slurm {slurm_version} sandbox (slurmctld + 3 slurmd + 3 spares, loopback; worker via {backend})")
    sb.start_slurm(clean=True)
    if temporal == "dev":
        say(f"starting Temporal dev server on {sb.temporal_address} with a fresh database; Web UI {sb.ui_url}")
    else:
        say(
            f"starting the Temporal cluster on {sb.temporal_address} (temporal-server on PostgreSQL, mTLS; "
            "built from its Go module the first time) with fresh databases"
        )
    sb.start_temporal(fresh=True)
    ks = start_kubernetes(sb) if kubernetes else None
    if not kubernetes:
        say("Kubernetes: off (K8S=0)")
    say("starting the gpuheal worker and the Alertmanager webhook")
    worker = sb.start_worker()
    webhook = sb.start_webhook()
    try:
        rc = asyncio.run(_run(sb, ks))
    finally:
        Sandbox.stop_process(webhook)
        Sandbox.stop_process(worker)
        sb.stop_recorded("webhook")  # (their pid files go with them)
        sb.stop_recorded("worker")
    parts = "Temporal, Slurm" + (" and Kubernetes" if ks is not None else "")
    say(
        f"demo took {time.monotonic() - t0:.0f} s. {parts} keep running so you can look around "
        f"({sb.ui_url or 'the temporal CLI, with the certificates in ' + str(sb.temporal.tls_dir)}); "
        f"`make stop` stops them. Logs: {sb.root}"
    )
    return rc


def main() -> int:
    ap = argparse.ArgumentParser(prog="make demo", description=__doc__)
    ap.add_argument("--slurm", default=NEWEST_SLURM, choices=SLURM_VERSIONS, help="Slurm release (default: newest)")
    ap.add_argument("--backend", default="cli", choices=["cli", "rest"], help="how the worker talks to Slurm")
    ap.add_argument("--no-k8s", action="store_true", help="run without the Kubernetes sandbox")
    ap.add_argument("--temporal", default="dev", choices=KINDS, help="the dev server (default) or the cluster")
    args = ap.parse_args()
    return run_demo(args.slurm, args.backend, kubernetes=not args.no_k8s, temporal=args.temporal)


if __name__ == "__main__":
    raise SystemExit(main())
