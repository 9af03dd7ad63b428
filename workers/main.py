"""The gpuheal worker: runs the remediation workflow and its activities.

Serves the SDK's Prometheus metrics (task latencies, activity failures, ...) on one port and the
project's own (incidents open, stage durations, MTTR) on another. SIGTERM or SIGINT shut it down
gracefully: it stops polling, lets running activities finish for a while, then exits; whatever
was cut off is retried by Temporal on the next worker.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from kubernetes.client import ApiClient, CoreV1Api
from prometheus_client import start_http_server
from temporalio.client import Client
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.worker import Worker

from activities.kube_providers import ExecHookProvider, KubernetesProvider, KubeSandboxProvider
from activities.kubernetes import KubernetesActivities, load_api
from activities.notify import FanOut, LogNotifier, Notifier, WebhookNotifier
from activities.providers import NodeProvider, SandboxProvider
from activities.remediation import RemediationActivities
from activities.slurm import SlurmClient
from gpuheal.config import REPO, Settings
from triggers.start import connect
from workers import metrics
from workflows.remediation import GpuRemediationWorkflow

log = logging.getLogger("gpuheal.worker")


def build_provider(settings: Settings, slurm: SlurmClient, kube: ApiClient | None) -> NodeProvider:
    script = REPO / "infra" / "slurm" / "sandbox.sh"
    if settings.provider == "exec":
        if not settings.provider_hook:
            raise ValueError("GPUHEAL_PROVIDER=exec needs GPUHEAL_PROVIDER_HOOK")
        return ExecHookProvider(settings.provider_hook)
    if settings.provider == "kubernetes":
        if kube is None:
            raise ValueError("GPUHEAL_PROVIDER=kubernetes needs GPUHEAL_KUBECONFIG or GPUHEAL_K8S_IN_CLUSTER=1")
        return KubernetesProvider(slurm, kube)
    if kube is not None:
        # The sandbox's node group is the platform, not the worker: it may create Nodes.
        platform = load_api(settings.sandbox_kubeconfig) if settings.sandbox_kubeconfig else kube
        return KubeSandboxProvider(slurm, settings.sandbox_dir, script, CoreV1Api(platform))
    return SandboxProvider(slurm, settings.sandbox_dir, script)


def activity_list(settings: Settings) -> list[Callable[..., Any]]:
    """Every activity this worker serves; the Kubernetes ones when a cluster is configured."""
    slurm = SlurmClient(settings.slurm_conf or str(settings.sandbox_dir / "slurm.conf"))
    kube = load_api(settings.kubeconfig) if settings.kubernetes_enabled else None
    notifier: Notifier = LogNotifier()
    if settings.notify_url:
        notifier = FanOut(notifier, WebhookNotifier(settings.notify_url))
    acts = RemediationActivities(slurm, build_provider(settings, slurm, kube), notifier)
    found: list[Callable[..., Any]] = [
        acts.look_up_slurm_node,
        acts.notify_operators,
        acts.list_jobs_on_node,
        acts.request_checkpoint,
        acts.drain_slurm_node,
        acts.requeue_slurm_job,
        acts.repair_node,
        acts.replace_node,
        acts.check_node_health,
        acts.resume_slurm_node,
        acts.decommission_node,
        acts.wait_for_training_progress,
        acts.record_incident_metrics,
    ]
    if kube is not None:
        k = KubernetesActivities(kube)
        found += [k.map_kube_node, k.cordon_and_taint_node, k.evict_pods, k.uncordon_node, k.post_node_event]
    return found


def make_worker(client: Client, settings: Settings) -> Worker:
    return Worker(
        client,
        task_queue=settings.task_queue,
        workflows=[GpuRemediationWorkflow],
        activities=activity_list(settings),
        graceful_shutdown_timeout=timedelta(seconds=10),
    )


async def _refresh_open_incidents(client: Client) -> None:
    query = 'WorkflowType="GpuRemediation" AND ExecutionStatus="Running"'
    while True:
        try:
            metrics.INCIDENTS_OPEN.set((await client.count_workflows(query)).count)
        except Exception as err:
            log.warning("could not count open incidents: %s", err)
        await asyncio.sleep(15)


async def run_worker(settings: Settings, metrics_port: int, sdk_metrics_port: int) -> None:
    host = settings.metrics_host
    runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=f"{host}:{sdk_metrics_port}")))
    start_http_server(metrics_port, addr=host)
    client = await connect(settings, runtime)
    worker = make_worker(client, settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    refresher = asyncio.create_task(_refresh_open_incidents(client))
    log.info(
        "worker on task queue %r at %s; metrics :%d (gpuheal) :%d (SDK); Slurm %s",
        settings.task_queue,
        settings.temporal_address,
        metrics_port,
        sdk_metrics_port,
        settings.slurm_conf or Path(settings.sandbox_dir) / "slurm.conf",
    )
    async with worker:
        await stop.wait()
        log.info("shutting down: finishing running tasks (up to 10 s)")
    refresher.cancel()
    log.info("worker stopped")
