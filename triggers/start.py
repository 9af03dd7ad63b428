"""Start a remediation, or join the one already running for the node.

Every trigger (CLI, Alertmanager webhook, node agent, Slurm health check) ends here. The workflow
id is derived from cluster and node, and the start is a signal-with-start: a second report for a
node under remediation is delivered to the running workflow as a `report` signal instead of
starting a second drain.
"""

from __future__ import annotations

from typing import Any

from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from gpuheal import policy
from gpuheal import search_attributes as sa
from gpuheal.models import Decision, HealthReport, RemediationInput, RemediationResult, Stage
from gpuheal.settings import Settings
from workflows.remediation import GpuRemediationWorkflow


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


async def give_back_borrowed(client: Client, cluster: str, node: str, operator: str, reason: str) -> str:
    """Demand shifted back: the running incident that borrowed `node` from inference gives it back
    now (its jobs move off first). Says so when no incident holds that node."""
    query = (
        f'WorkflowType="GpuRemediation" AND Cluster="{cluster}" AND {sa.BORROWED.name}="{node}" '
        'AND ExecutionStatus="Running"'
    )
    async for execution in client.list_workflows(query):
        handle = client.get_workflow_handle_for(GpuRemediationWorkflow.run, execution.id)
        try:
            return await handle.execute_update(
                GpuRemediationWorkflow.give_back, Decision(operator=operator, reason=reason)
            )
        except WorkflowUpdateFailedError as err:
            return f"{execution.id} refused: {err.cause}"
    return f"no running incident has borrowed {node}"
