"""Start a remediation, or join the one already running for the node, or say who handled it.

Every trigger (CLI, Alertmanager webhook, node agent, Slurm health check) ends here. The workflow
id is derived from cluster and node, and the start is a signal-with-start: a second report for a
node under remediation is delivered to the running workflow as a `report` signal instead of
starting a second drain. A report an earlier incident already handled (the same alert, by
fingerprint and start, or any report within the cluster's duplicate window after that incident
closed) starts nothing: `already_handled` answers which incident (and run) handled it, and why.
A report carries what failed, never how to remediate: the policy is the cluster's (its
coordinator's).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from temporalio.client import Client, WorkflowExecution, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError

from gpuheal.core import ids, queries
from gpuheal.core import search_attributes as sa
from gpuheal.core.messages import FLEET_POLICY, INCIDENT, INCIDENT_GIVE_BACK, INCIDENT_REPORT
from gpuheal.core.models import Decision, Frozen, HealthReport, RemediationInput, RemediationResult, Stage
from gpuheal.core.settings import Settings


class AlreadyHandled(Frozen):
    """The incident that already handled a report: the caller starts nothing and says so."""

    incident_id: str
    run_id: str
    why: str  # "the same alert, fp@start" or "closed 12 s ago, within ..."

    def __str__(self) -> str:
        return f"{self.incident_id} ({self.why})"


async def start_or_join(
    client: Client, settings: Settings, report: HealthReport
) -> WorkflowHandle[Any, RemediationResult]:
    attrs: list[SearchAttributePair[Any]] = [
        SearchAttributePair(sa.NODE, report.node),
        SearchAttributePair(sa.CLUSTER, report.cluster),
        SearchAttributePair(sa.STAGE, Stage.TRIAGE.value),
    ]
    if report.xid is not None:
        attrs.append(SearchAttributePair(sa.XID, report.xid))
    if report.alert_key:
        attrs.append(SearchAttributePair(sa.ALERT_KEYS, [report.alert_key]))
    return await client.start_workflow(
        INCIDENT.name,
        RemediationInput(report=report),
        result_type=INCIDENT.output,
        id=ids.incident_id(report.cluster, report.node),
        task_queue=settings.task_queue,
        start_signal=INCIDENT_REPORT.name,
        start_signal_args=[report],
        search_attributes=TypedSearchAttributes(attrs),
        static_summary=f"GPU failure: {report.describe()}",
        static_details=(f"Reported by `{report.source}` at {report.observed_at.isoformat()}.\n\n{report.summary}"),
    )


async def give_back_borrowed(client: Client, cluster: str, node: str, operator: str, reason: str) -> str:
    """Demand shifted back: the running incident that borrowed `node` from inference gives it back
    now (its jobs move off first). Says so when no incident holds that node."""
    query = queries.where(
        queries.of_type(INCIDENT),
        queries.eq(sa.CLUSTER, cluster),
        queries.eq(sa.BORROWED, node),
        queries.status("Running"),
    )
    async for execution in client.list_workflows(query):
        handle = INCIDENT.handle(client, execution.id)
        try:
            return await INCIDENT_GIVE_BACK.execute(handle, Decision(operator=operator, reason=reason))
        except WorkflowUpdateFailedError as err:
            return f"{execution.id} refused: {err.cause}"
    return f"no running incident has borrowed {node}"


async def already_handled(client: Client, report: HealthReport) -> AlreadyHandled | None:
    """The incident that already handled this report, or None (then start or join). Read-only:
    the same alert (fingerprint@startsAt) in any earlier incident of the node, or any report
    within the cluster's duplicate window after the node's last incident closed."""
    node = (queries.of_type(INCIDENT), queries.eq(sa.CLUSTER, report.cluster), queries.eq(sa.NODE, report.node))
    async for _ in client.list_workflows(queries.where(*node, queries.status("Running")), limit=1):
        return None  # running: the report joins it
    if report.alert_key:
        same_alert = queries.where(*node, queries.contains(sa.ALERT_KEYS, report.alert_key))
        async for wf in client.list_workflows(same_alert, limit=1):
            return AlreadyHandled(incident_id=wf.id, run_id=wf.run_id, why=f"the same alert, {report.alert_key}")
    # Only a node with a closed incident asks the coordinator for the window (a storm of new
    # nodes costs the coordinator nothing here). The first closed run is the last to close:
    # visibility's documented default order is CloseTime DESC, StartTime DESC (an explicit
    # ORDER BY is refused by Temporal Cloud).
    last: WorkflowExecution | None = None
    async for wf in client.list_workflows(queries.where(*node, queries.not_status("Running")), limit=1):
        last = wf
    if last is None or last.close_time is None:
        return None
    try:
        cluster_policy = await FLEET_POLICY.ask(client.get_workflow_handle(ids.coordinator_id(report.cluster)))
    except RPCError:
        return None  # no coordinator (yet): no window to apply
    window = cluster_policy.policy.duplicate_window_s
    ago = (datetime.now(UTC) - last.close_time).total_seconds()
    if window <= 0 or ago >= window:
        return None
    why = f"closed {ago:.0f} s ago, within the cluster's {window:g} s duplicate window"
    return AlreadyHandled(incident_id=last.id, run_id=last.run_id, why=why)
