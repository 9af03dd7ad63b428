"""`gpuheal versions | rollout`: the cluster's worker builds (Temporal Worker Versioning).

With GPUHEAL_BUILD_ID set, a cluster's workers are builds of its Worker Deployment
(`gpuheal-CLUSTER`). An incident stays on the build it started on; the coordinator moves to the
current one. `versions` says, per build, whether it is current and how many incidents (and job
recoveries, domain incidents) are still open on it: a build may be retired when it has none.
`rollout BUILD` makes a build current (new incidents start on it), as a recorded change.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from pydantic import TypeAdapter
from temporalio.api.enums.v1 import WorkerDeploymentVersionStatus
from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    SetWorkerDeploymentCurrentVersionRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from gpuheal.clients import deployment
from gpuheal.clients.temporal import connect
from gpuheal.core import ids, queries
from gpuheal.core.messages import DOMAIN_INCIDENT, FLEET_STATE_FORMAT, FLEET_WAKE, INCIDENT, JOB_RECOVERY
from gpuheal.core.models.base import OperatorName
from gpuheal.core.settings import BuildId, Settings

PINNED_KINDS = (INCIDENT, JOB_RECOVERY, DOMAIN_INCIDENT)
MOVE_WAIT_S = 40  # how long `rollout` waits for the coordinator to move, waking it every WAKE_EVERY_S
WAKE_EVERY_S = 5


async def _open_on(client: Client, deployment: str, build: str) -> tuple[int, int]:
    """(incidents, other pinned workflows) still running on that build."""
    on = queries.eq(queries.DEPLOYMENT_VERSION, f"{deployment}:{build}")
    running = queries.status("Running")
    counts = await asyncio.gather(
        *(client.count_workflows(queries.where(queries.of_type(k), running, on)) for k in PINNED_KINDS)
    )
    return counts[0].count, sum(c.count for c in counts[1:])


async def show_versions(settings: Settings, args: argparse.Namespace) -> int:
    cluster = settings.require_cluster()
    client = await connect(settings.temporal)
    name = ids.deployment_name(cluster)
    where = f"Temporal {settings.temporal.address}, namespace {client.namespace}"
    try:
        described = await client.workflow_service.describe_worker_deployment(
            DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=name)
        )
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
        print(f"cluster {cluster}: no worker deployment {name} ({where}): its workers run unversioned")
        return 0
    info = described.worker_deployment_info
    routing = info.routing_config
    print(f"cluster {cluster}: deployment {name} ({where})")
    print(f"  coordinator on build {await _coordinator_build(client, cluster) or '(none yet)'}")
    summaries = sorted(info.version_summaries, key=lambda v: v.create_time.ToDatetime())
    for v in summaries:
        build = v.deployment_version.build_id
        incidents, others = await _open_on(client, name, build)
        role = "current" if build == routing.current_deployment_version.build_id else _status(v.status)
        if build == routing.ramping_deployment_version.build_id:
            role = f"ramping {routing.ramping_version_percentage:.0f}%"
        retire = "  (may be retired)" if role in ("drained", "inactive") and not incidents + others else ""
        print(f"  {build:<24} {role:<12} {incidents} open incidents, {others} other pinned workflows{retire}")
    return 0


def _status(code: WorkerDeploymentVersionStatus.ValueType) -> str:
    return WorkerDeploymentVersionStatus.Name(code).removeprefix("WORKER_DEPLOYMENT_VERSION_STATUS_").lower()


async def rollout(settings: Settings, args: argparse.Namespace) -> int:
    """Make `args.build_id` the current build: new incidents start on it, the coordinator moves
    to it at its next task; open incidents stay where they are. Refused while that build has no
    worker polling (nothing would serve what starts)."""
    build = TypeAdapter(BuildId).validate_python(args.build_id)
    operator = TypeAdapter(OperatorName).validate_python(args.operator)
    cluster = settings.require_cluster()
    client = await connect(settings.temporal)
    name = ids.deployment_name(cluster)
    refused = await _cannot_read(client, cluster, name, build)
    if refused:
        print(f"gpuheal: cluster {cluster}: build {build} not made current: {refused}", file=sys.stderr)
        return 1
    request = SetWorkerDeploymentCurrentVersionRequest(
        namespace=client.namespace, deployment_name=name, build_id=build, identity=f"{operator}: {args.reason}"[:200]
    )
    try:
        await client.workflow_service.set_worker_deployment_current_version(request)
    except RPCError as err:
        print(f"gpuheal: cluster {cluster}: build {build} not made current: {err.message}", file=sys.stderr)
        return 1
    print(f"cluster {cluster}: build {build} is current (by {operator}: {args.reason})")
    # The coordinator moves at its next task: one now (a quiet cluster's may have none for days,
    # and the old build must not be stopped while the coordinator still runs on it).
    # The new routing reaches the task queues a moment after the answer: a wake that comes first
    # finds nothing changed, so it is sent again until the coordinator has moved.
    coordinator = client.get_workflow_handle(ids.coordinator_id(cluster))
    for second in range(MOVE_WAIT_S):
        now = await _coordinator_build(client, cluster)
        if now is None or now == build:
            break
        if second % WAKE_EVERY_S == 0:
            await FLEET_WAKE.send(coordinator, f"rollout to {build} by {operator}")
        await asyncio.sleep(1)
    else:
        print(f"gpuheal: the coordinator has not moved to {build} within {MOVE_WAIT_S} s", file=sys.stderr)
    return await show_versions(settings, args)


async def _cannot_read(client: Client, cluster: str, name: str, build: str) -> str | None:
    """Why `build` cannot take over the coordinator (it could not read the state the coordinator
    carries across continue-as-new: every workflow task would fail), or None. The coordinator
    says in its memo which format it carries (none said: the whole JSON of format 1); the build,
    in its version's metadata, which it reads (none said: format 1 only)."""
    handle = client.get_workflow_handle(ids.coordinator_id(cluster))
    try:
        carries = await FLEET_STATE_FORMAT.read(handle) or 1
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None  # no coordinator yet: the first incident starts one on the new build
        raise
    try:
        reads, _ = await deployment.formats(client, name, build)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None  # no worker of it has polled: the server refuses it itself, saying so
        raise
    if carries in reads:
        return None
    said = " (it declares none: a build from before the declaration reads format 1)"
    return (
        f"the coordinator carries its state in format {carries}; build {build} reads "
        f"{', '.join(map(str, sorted(reads)))} only{said if reads == deployment.UNDECLARED[0] else ''}. Rolled back "
        "onto it, the coordinator would fail every task (no admissions, no grants): roll forward, or to a build "
        "that reads it"
    )


async def _coordinator_build(client: Client, cluster: str) -> str | None:
    """The build the cluster's coordinator runs on (its latest run); None without one."""
    try:
        described = await client.get_workflow_handle(ids.coordinator_id(cluster)).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    version = described.raw_description.workflow_execution_info.versioning_info.deployment_version
    return version.build_id or "(unversioned)"
