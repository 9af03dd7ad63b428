"""Start a remediation, or join the one already running for the node.

Every trigger (CLI, Alertmanager webhook, node agent, Slurm health check) ends here. The workflow
id is derived from cluster and node, and the start is a signal-with-start: a second report for a
node under remediation is delivered to the running workflow as a `report` signal instead of
starting a second drain.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime
from temporalio.service import TLSConfig

from gpuheal import policy
from gpuheal import search_attributes as sa
from gpuheal.config import Settings
from gpuheal.models import HealthReport, RemediationInput, RemediationResult, Stage
from workflows.remediation import GpuRemediationWorkflow


async def connect(settings: Settings, runtime: Runtime | None = None) -> Client:
    """The one place that connects to Temporal. Whoever can reach Temporal can approve or abort
    an incident, so production clusters use mTLS or an API key (GPUHEAL_TEMPORAL_TLS_*,
    GPUHEAL_TEMPORAL_API_KEY) and Temporal's authorizer."""
    tls: TLSConfig | bool = False
    if settings.temporal_tls_cert or settings.temporal_tls_ca:
        tls = TLSConfig(
            server_root_ca_cert=_read(settings.temporal_tls_ca),
            client_cert=_read(settings.temporal_tls_cert),
            client_private_key=_read(settings.temporal_tls_key),
        )
    api_key = settings.temporal_api_key.get_secret_value() if settings.temporal_api_key else None
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.namespace,
        data_converter=pydantic_data_converter,
        tls=tls if not api_key else (tls or True),
        api_key=api_key,
        runtime=runtime,
    )


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


async def start_or_join(
    client: Client, settings: Settings, report: HealthReport
) -> WorkflowHandle[GpuRemediationWorkflow, RemediationResult]:
    attrs: list[SearchAttributePair[Any]] = [
        SearchAttributePair(sa.NODE, report.node),
        SearchAttributePair(sa.CLUSTER, report.cluster),
        SearchAttributePair(sa.STAGE, Stage.TRIAGE.value),
    ]
    if report.xid is not None:
        attrs.append(SearchAttributePair(sa.XID, report.xid))
    return await client.start_workflow(
        GpuRemediationWorkflow.run,
        RemediationInput(report=report, settings=settings.remediation),
        id=policy.workflow_id(report.cluster, report.node),
        task_queue=settings.task_queue,
        start_signal="report",
        start_signal_args=[report],
        search_attributes=TypedSearchAttributes(attrs),
        static_summary=f"GPU failure: {report.describe()}",
        static_details=(f"Reported by `{report.source}` at {report.observed_at.isoformat()}.\n\n{report.summary}"),
    )
