"""What a build of a cluster's Worker Deployment says about itself, in its version's metadata on
the Temporal server: which formats of the coordinator's carried state it reads and writes
(gpuheal.core.fleet.packing). A worker declares it once it polls (its version exists only then);
`gpuheal rollout` reads it before making a build current. A build that declares nothing is one
from before the declaration: it reads and writes format 1 only."""

from __future__ import annotations

import asyncio
import logging

from temporalio.api.deployment.v1 import WorkerDeploymentVersion
from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentVersionRequest,
    UpdateWorkerDeploymentVersionMetadataRequest,
)
from temporalio.client import Client
from temporalio.converter import default as default_converter
from temporalio.service import RPCError

log = logging.getLogger("gpuheal.deployment")

READS_KEY = "gpuheal.state-reads"  # "1,2"
WRITES_KEY = "gpuheal.state-writes"  # "2"
UNDECLARED = (frozenset({1}), 1)  # a build from before the declaration
DECLARE_EVERY_S = 2.0
DECLARE_WITHIN_S = 120.0


async def declare(client: Client, deployment: str, build: str, reads: frozenset[int], writes: int) -> None:
    """This build's formats, in its version's metadata: retried until the version exists (the
    server creates it when the build's first worker polls)."""
    convert = default_converter().payload_converter
    request = UpdateWorkerDeploymentVersionMetadataRequest(
        namespace=client.namespace,
        deployment_version=WorkerDeploymentVersion(deployment_name=deployment, build_id=build),
        upsert_entries={
            READS_KEY: convert.to_payload(",".join(str(f) for f in sorted(reads))),
            WRITES_KEY: convert.to_payload(str(writes)),
        },
        identity=f"gpuheal worker, build {build}",
    )
    last: Exception | None = None
    for _ in range(int(DECLARE_WITHIN_S / DECLARE_EVERY_S)):
        try:
            await client.workflow_service.update_worker_deployment_version_metadata(request)
            log.info(
                "build %s of %s declared: reads state formats %s, writes %d", build, deployment, sorted(reads), writes
            )
            return
        except RPCError as err:  # not found until the first poll registers the version
            last = err
        await asyncio.sleep(DECLARE_EVERY_S)
    log.error("build %s could not declare its state formats (`gpuheal rollout` will refuse it): %s", build, last)


async def formats(client: Client, deployment: str, build: str) -> tuple[frozenset[int], int]:
    """(reads, writes) as the build declared them; UNDECLARED for a build that said nothing."""
    described = await client.workflow_service.describe_worker_deployment_version(
        DescribeWorkerDeploymentVersionRequest(
            namespace=client.namespace,
            deployment_version=WorkerDeploymentVersion(deployment_name=deployment, build_id=build),
        )
    )
    entries = described.worker_deployment_version_info.metadata.entries
    if READS_KEY not in entries or WRITES_KEY not in entries:
        return UNDECLARED
    convert = default_converter().payload_converter
    reads = frozenset(int(f) for f in convert.from_payload(entries[READS_KEY], str).split(","))
    return reads, int(convert.from_payload(entries[WRITES_KEY], str))
