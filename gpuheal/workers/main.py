"""The gpuheal worker: runs the remediation workflow and its activities.

It builds every client once (Slurm, Kubernetes, the notifier, the provider GPUHEAL_PROVIDER
names) and injects them into the activities; it refuses to start, naming the setting, when the
provider or the cluster is not configured. It serves the SDK's Prometheus metrics (task
latencies, activity failures, ...) on one port and the project's own (incidents open, stage
durations, MTTR) on another. SIGTERM or SIGINT shut it down gracefully: it stops polling, lets
running activities finish for a while, then exits; whatever was cut off is retried by Temporal
on the next worker.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import signal
import socket
from collections.abc import Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any

from prometheus_client import start_http_server
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.api.workflowservice.v1 import DescribeWorkerDeploymentRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker, WorkerDeploymentConfig
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from gpuheal.activities import interface as act
from gpuheal.activities.borrowed import BorrowedNodes
from gpuheal.activities.carrying import StatePacking
from gpuheal.activities.fleet import FleetActivities
from gpuheal.activities.jobs import JobActivities
from gpuheal.activities.remediation import RemediationActivities
from gpuheal.activities.rma import RmaActivities
from gpuheal.activities.validation import ValidationActivities
from gpuheal.clients import deployment as build_metadata
from gpuheal.clients.notify import FanOut, LogNotifier, Notifier, WebhookNotifier
from gpuheal.clients.owners import OwnerDelivery, OwnerNotifier
from gpuheal.clients.slurm import build_slurm, wrapper
from gpuheal.clients.slurm.base import SlurmError
from gpuheal.clients.slurm.burn_in import BurnIn
from gpuheal.clients.slurm.cli import SlurmCli
from gpuheal.clients.temporal import connect
from gpuheal.core import ids, queries
from gpuheal.core import search_attributes as sa
from gpuheal.core.errors import SettingsError
from gpuheal.core.fleet import packing, policy_file
from gpuheal.core.fleet import view as fleet_view
from gpuheal.core.fleet.policy import ConfiguredPolicy
from gpuheal.core.messages import COORDINATOR, FLEET_CONFIGURE, FLEET_MOVE, FLEET_STATUS, FLEET_VIEW, INCIDENT
from gpuheal.core.settings import Settings
from gpuheal.providers import build_provider
from gpuheal.providers.base import ProviderContext
from gpuheal.workers import metrics
from gpuheal.workers.payloads import PayloadSizes
from gpuheal.workflows.domain import DomainIncidentWorkflow
from gpuheal.workflows.fleet import FleetCoordinator
from gpuheal.workflows.job_recovery import JobRecoveryWorkflow
from gpuheal.workflows.remediation import GpuRemediationWorkflow

log = logging.getLogger("gpuheal.worker")
MAX_CACHED_WORKFLOWS = 300
# The workflows' parts, shared by every workflow run instead of imported anew into each run's
# sandbox: a storm starts a run per incident and another after each eviction from the cache, and
# each import of them cost tens of milliseconds of CPU and about 0.4 MB kept while cached. They
# keep no state of their own (tests/test_worker_sandbox.py checks); the four workflows' own
# modules stay sandboxed, and the time-skipping tests' workers and the replays sandbox all.
SHARED_WORKFLOW_PARTS = (
    "gpuheal.workflows.activity",
    "gpuheal.workflows.gate",
    "gpuheal.workflows.incident",
    "gpuheal.workflows.coordinator",
)
SANDBOX = SandboxedWorkflowRunner(
    restrictions=SandboxRestrictions.default.with_passthrough_modules(*SHARED_WORKFLOW_PARTS)
)
# The coordinator's own activities at once (ids.coordinator_queue): a rebuild, a look, a few
# notices and domain incidents beside them. Slots of their own, never the incidents'.
COORDINATOR_ACTIVITY_SLOTS = 20


def activity_list(settings: Settings) -> list[Callable[..., Any]]:
    """Every activity this worker serves; the Kubernetes ones when a cluster is configured.
    Raises SettingsError (naming the variable) when the provider cannot be built."""
    settings.require_cluster()
    slurm = build_slurm(settings.slurm)
    kube_api = None
    if settings.kubernetes_enabled:
        from gpuheal.clients.kube import load_api

        kube_api = load_api(settings.kubeconfig)
    timeout_s = settings.remediation.provider_timeout_s
    provider = build_provider(ProviderContext(settings.provider, timeout_s, slurm, kube_api))
    notifier: Notifier = LogNotifier()
    if settings.notify_url:
        notifier = FanOut(notifier, WebhookNotifier(settings.notify_url))
    # The burn-in and the topology speak Slurm's commands (reservations, sbatch, `scontrol show
    # topology`), whichever backend asks the rest.
    cli = slurm if isinstance(slurm, SlurmCli) else SlurmCli(settings.slurm.conf, wrapper(settings.slurm))
    sbatch_args = tuple(shlex.split(settings.slurm.validate_sbatch_args))
    validation = ValidationActivities(slurm, BurnIn(cli, settings.slurm.validate_user, sbatch_args))
    acts = RemediationActivities(slurm, provider, notifier, metrics.observe_incident, holder=validation.hold)
    owners: OwnerNotifier = OwnerDelivery(settings.owners)
    jobs = JobActivities(slurm, owners, settings.remediation.jobs)
    rma = RmaActivities(settings.rma_hook)
    fleet = FleetActivities(
        slurm,
        kube_api,
        settings.fleet,
        settings.remediation,
        settings.domain_labels,
        settings.coordinator_updates,
        topology=cli.topology,
        cluster=settings.cluster,
    )
    k8s = settings.remediation.kubernetes
    borrowed = BorrowedNodes(slurm, kube_api, k8s.node_label if k8s is not None else None)
    served: list[object] = [acts, jobs, fleet, validation, rma, borrowed, StatePacking()]
    if kube_api is not None:
        from gpuheal.activities.kubernetes import KubernetesActivities

        served.append(KubernetesActivities(kube_api))
    found = act.implementations(*served)
    declared: tuple[act.Activity[Any, Any], ...] = act.WORKER + (act.KUBERNETES if kube_api is not None else ())
    unserved = sorted({ref.name for ref in declared} - found.keys())
    if unserved:  # a workflow would schedule them and wait for a worker that never comes
        raise SettingsError(f"this worker serves no implementation of the declared activities {unserved}")
    return list(found.values())


WORKFLOWS: list[type] = [GpuRemediationWorkflow, JobRecoveryWorkflow, FleetCoordinator, DomainIncidentWorkflow]


def deployment(settings: Settings) -> WorkerDeploymentConfig | None:
    """With GPUHEAL_BUILD_ID: this worker as that build of its cluster's Worker Deployment. New
    workflows start on the deployment's current build (`gpuheal rollout` sets it), and each is
    pinned to the build it started on: an incident ends where it began, so a new build may change
    it incompatibly; the old build's workers stay until `gpuheal versions` shows it drained. The
    coordinator, which never ends, moves up by continuing as new (workflows/fleet.py).

    (Declared here, not on each @workflow.defn: Temporal refuses a versioning behavior from an
    unversioned worker, and unversioned is the default.)"""
    if settings.build_id is None:
        return None
    version = WorkerDeploymentVersion(ids.deployment_name(settings.require_cluster()), settings.build_id)
    return WorkerDeploymentConfig(
        version=version, use_worker_versioning=True, default_versioning_behavior=VersioningBehavior.PINNED
    )


class Workers:
    """The worker on the cluster's task queue (the workflows and the incidents' activities) and
    the one on the coordinator's own queue (its workflow and activities), or either alone
    (GPUHEAL_WORKER_SERVES), run and shut down together."""

    def __init__(self, *workers: Worker) -> None:
        self.workers = workers
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> Workers:
        async with AsyncExitStack() as stack:
            for w in self.workers:
                await stack.enter_async_context(w)
            self._stack = stack.pop_all()  # all started: stopped together in __aexit__
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        # Both at once: each lets its running activities finish within its grace, not one after
        # the other; then each exits as `async with` would (a worker's fatal error is raised).
        await asyncio.gather(*(w.shutdown() for w in self.workers))
        return await self._stack.__aexit__(exc_type, exc, tb)


def make_worker(
    client: Client,
    settings: Settings,
    activities: list[Callable[..., Any]] | None = None,
    workflows: list[type] | None = None,
) -> Workers:
    """`workflows`: the product's (WORKFLOWS) unless a test brings another build's. The cluster's
    queue keeps the coordinator's workflow too: a coordinator started there by the release before
    runs there until it moves to its own (workflows/fleet.py, OWN_WORKFLOW_QUEUE)."""
    served = activities if activities is not None else activity_list(settings)
    every = workflows if workflows is not None else WORKFLOWS
    version = deployment(settings)
    grace = timedelta(seconds=10)

    def coordinators() -> Worker:  # built only where served: the SDK starts its core at once
        return Worker(
            client,
            task_queue=ids.coordinator_queue(settings.task_queue),
            workflows=[w for w in every if _workflow_name(w) == COORDINATOR.name],
            activities=served,
            deployment_config=version,
            graceful_shutdown_timeout=grace,
            max_concurrent_activities=COORDINATOR_ACTIVITY_SLOTS,
            workflow_runner=SANDBOX,
            interceptors=[PayloadSizes()],
        )

    if settings.worker_serves == "coordinator":
        return Workers(coordinators())
    main = Worker(
        client,
        task_queue=settings.task_queue,
        workflows=every,
        activities=served,
        deployment_config=version,
        graceful_shutdown_timeout=grace,
        # A held incident sleeps for minutes: evicted, it costs one short replay when it wakes,
        # and a storm of a thousand no longer keeps a thousand workflow sandboxes in memory.
        max_cached_workflows=MAX_CACHED_WORKFLOWS,
        workflow_runner=SANDBOX,
        interceptors=[PayloadSizes()],  # (a coordinator started here by the release before)
    )
    return Workers(main) if settings.worker_serves == "incidents" else Workers(main, coordinators())


def _workflow_name(cls: type) -> str:
    """The name a workflow class is registered under (@workflow.defn's)."""
    return str(getattr(cls, "__temporal_workflow_definition").name)


async def _refresh_gauges(client: Client, cluster: str) -> None:
    """Open incidents (visibility) and the fleet's state (its coordinator), every 15 s: right
    across worker restarts and with several workers."""
    query = queries.where(queries.of_type(INCIDENT), queries.status("Running"))
    while True:
        try:
            metrics.INCIDENTS_OPEN.set((await client.count_workflows(query)).count)
            handle = client.get_workflow_handle(ids.coordinator_id(cluster))
            view = await FLEET_VIEW.read(handle)  # from the server: answers in a storm
            if view is None:  # a coordinator of a release before the memo
                view = fleet_view.view(await FLEET_STATUS.ask(handle), datetime.now(UTC))
            metrics.observe_fleet(view)
        except RPCError as err:
            log.debug("fleet gauges not refreshed: %s", err)  # no coordinator before the first incident
        except Exception as err:
            log.warning("could not refresh the gauges: %s", err)
        await asyncio.sleep(15)


BURN_IN_CHECKS = 3  # tries of the burn-in's Slurm commands at start, 1 s then 2 s apart
OFFER_ATTEMPTS = 8  # about four minutes of backoff: a worker starting beside a busy or restarting server


async def offer_configuration(client: Client, settings: Settings) -> None:
    """This worker's configured policy, to its cluster's coordinator: applied if the
    configuration changed since the last one offered (steering.configure), else the cluster's
    policy stands. Said loudly either way; no coordinator yet, the first incident seeds it."""
    c = ConfiguredPolicy(
        policy=settings.fleet,
        digest=policy_file.digest(settings.fleet),
        by=f"worker {socket.gethostname()} pid {os.getpid()}",
    )
    handle = client.get_workflow_handle(ids.coordinator_id(settings.require_cluster()))
    for attempt in range(OFFER_ATTEMPTS):
        try:
            log.warning("cluster policy: %s", await FLEET_CONFIGURE.execute(handle, c))
            return
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                log.info("no coordinator yet: the first incident starts it with this configuration (%s)", c.digest)
                return
            last: Exception = err
        except Exception as err:  # an update refused (a coordinator still run by the release before)
            last = err
        await asyncio.sleep(2**attempt)
    log.error("could not offer this worker's configuration (%s) to the cluster: %s", c.digest, last)


async def move_coordinator_home(client: Client, settings: Settings) -> None:
    """A coordinator found on the cluster's queue (started by the release before, or running
    since then) is asked to move onto its own (workflows/fleet.py: FLEET_MOVE). Best effort: the
    next worker to start asks again."""
    handle = client.get_workflow_handle(ids.coordinator_id(settings.require_cluster()))
    last: Exception | None = None
    for attempt in range(OFFER_ATTEMPTS):
        try:
            found = await handle.describe()
            if found.status == WorkflowExecutionStatus.RUNNING and found.task_queue == settings.task_queue:
                await FLEET_MOVE.send(handle, f"worker {socket.gethostname()} pid {os.getpid()} of this release")
                log.info("the coordinator runs on %r: asked to move to its own queue", settings.task_queue)
            return
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return  # no coordinator yet: the first incident starts it on its own queue
            last = err
        await asyncio.sleep(2**attempt)
    log.warning("could not check which queue the coordinator runs on: %s", last)


async def declare_build(client: Client, settings: Settings) -> None:
    """A versioned worker's build says which formats of the coordinator's state it reads and
    writes (`gpuheal rollout` refuses a build that cannot read the coordinator's)."""
    if settings.build_id is not None:
        name = ids.deployment_name(settings.require_cluster())
        await build_metadata.declare(client, name, settings.build_id, packing.READS, packing.WRITES)


async def say_if_no_current_build(client: Client, settings: Settings) -> None:
    """A versioned worker gets nothing until its deployment has a current build (a first
    install): incidents would wait unseen. Said loudly, with the command that ends it. (An
    unversioned worker has no deployment: nothing to check.)"""
    if settings.build_id is None:
        return
    await asyncio.sleep(5)  # this worker's first polls register its build
    name = ids.deployment_name(settings.require_cluster())
    try:
        described = await client.workflow_service.describe_worker_deployment(
            DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=name)
        )
        current = described.worker_deployment_info.routing_config.current_deployment_version.build_id
    except RPCError as err:
        log.warning("could not read worker deployment %s: %s", name, err)
        return
    if not current:
        log.error(
            "worker deployment %s has no current build: no incident starts until one is set "
            "(`gpuheal rollout %s --operator NAME --reason 'first install'`)",
            name,
            settings.build_id,
        )


async def check_queue_is_this_clusters(client: Client, settings: Settings) -> None:
    """Refuse a task queue that another cluster's incidents run on: on one Temporal, each cluster
    needs its own (GPUHEAL_TASK_QUEUE), or this worker would run their drains on its own Slurm."""
    cluster = settings.require_cluster()
    query = queries.where(
        queries.eq(queries.TASK_QUEUE, settings.task_queue), queries.status("Running"), queries.ne(sa.CLUSTER, cluster)
    )
    if (await client.count_workflows(query)).count:
        raise SettingsError(
            f"task queue {settings.task_queue!r} runs open incidents of another cluster than {cluster!r}: "
            "give each cluster its own GPUHEAL_TASK_QUEUE (docs/production.md: one Temporal, several clusters)"
        )


async def check_search_attributes(client: Client, namespace: str) -> None:
    """Refuse to run against a namespace without the project's search attributes: every incident
    would fail where it upserts one (and a job recovery could not start)."""
    resp = await client.operator_service.list_search_attributes(ListSearchAttributesRequest(namespace=namespace))
    missing = [k for k in sa.ALL if k.name not in resp.custom_attributes]
    if missing:
        create = "; ".join(
            f"temporal operator search-attribute create --name {k.name} --type {sa.type_name(k)}" for k in missing
        )
        raise SettingsError(
            f"Temporal namespace {namespace!r} lacks search attributes {', '.join(k.name for k in missing)}: {create}"
        )


async def check_burn_in_can_run(settings: Settings) -> None:
    """Refuse a validation job this worker cannot run. The burn-in's maintenance reservation and
    its job go through Slurm's commands (`scontrol`, `sbatch`: gpuheal.clients.slurm.burn_in),
    whichever backend reads the rest: with GPUHEAL_SLURM_BACKEND=rest they must work too (the
    client, munge, the slurm.conf). Else every burn-in would fail to run: never a verdict on a
    GPU, but every repaired or new node kept out for a person."""
    if not settings.remediation.validate_job or settings.slurm.backend != "rest":
        return
    cli = SlurmCli(settings.slurm.conf, wrapper(settings.slurm))
    last: Exception | None = None
    for attempt in range(BURN_IN_CHECKS):  # (a controller restarting as the worker starts is no refusal)
        try:
            await cli.run("scontrol", "ping")
            await cli.run("sbatch", "--version")
            return
        except (OSError, SlurmError) as err:
            last = err
        if attempt + 1 < BURN_IN_CHECKS:
            await asyncio.sleep(2**attempt)
    raise SettingsError(
        "GPUHEAL_VALIDATE_JOB is set, but its burn-in runs through Slurm's own commands (a maintenance"
        " reservation with scontrol, the job with sbatch), which this worker cannot run beside"
        f" GPUHEAL_SLURM_BACKEND=rest: {last}. Give the worker Slurm's client, munge and SLURM_CONF"
        " (or GPUHEAL_SLURM_CLI_WRAPPER), or unset GPUHEAL_VALIDATE_JOB. (This checks the commands"
        " reach slurmctld; the reservation also needs an operator's rights: `sacctmgr` AdminLevel)"
    ) from last


async def run_worker(settings: Settings, metrics_port: int, sdk_metrics_port: int) -> None:
    activities = activity_list(settings)  # refuse a bad configuration before anything listens
    await check_burn_in_can_run(settings)
    host = settings.metrics_host
    runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=f"{host}:{sdk_metrics_port}")))
    client = await connect(settings.temporal, runtime)
    await check_search_attributes(client, client.namespace)
    await check_queue_is_this_clusters(client, settings)
    start_http_server(metrics_port, addr=host)
    worker = make_worker(client, settings, activities)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    refresher = asyncio.create_task(_refresh_gauges(client, settings.require_cluster()))
    log.info(
        "worker for cluster %r serving %s on task queue(s) %s (%s) at %s; provider %s; Slurm via %s; "
        "metrics :%d (gpuheal) :%d (SDK)",
        settings.cluster,
        settings.worker_serves,
        ", ".join(repr(w.config()["task_queue"]) for w in worker.workers),
        f"build {settings.build_id} of {ids.deployment_name(settings.cluster or '')}"
        if settings.build_id
        else "unversioned",
        f"{client.service_client.config.target_host} (namespace {client.namespace})",
        settings.provider.name,
        settings.slurm.rest_url if settings.slurm.backend == "rest" else f"CLI, SLURM_CONF {settings.slurm.conf}",
        metrics_port,
        sdk_metrics_port,
    )
    async with worker:
        offered = asyncio.create_task(offer_configuration(client, settings))
        moved = asyncio.create_task(move_coordinator_home(client, settings))
        checked = asyncio.create_task(say_if_no_current_build(client, settings))
        declared = asyncio.create_task(declare_build(client, settings))
        await stop.wait()
        offered.cancel()
        moved.cancel()
        checked.cancel()
        declared.cancel()
        log.info("shutting down: finishing running tasks (up to 10 s)")
    refresher.cancel()
    log.info("worker stopped")
