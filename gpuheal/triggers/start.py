"""Start a remediation, or join the one already running for the node, or say who handled it.

Every trigger (CLI, Alertmanager webhook, node agent, Slurm health check) ends here. The workflow
id is derived from cluster and node, and the start is a signal-with-start: a second report for a
node under remediation is delivered to the running workflow as a `report` signal instead of
starting a second drain. A report an earlier incident already handled starts nothing:
`already_handled` answers which incident (and run) handled it, and why. That is decided by the
failure, not the node (gpuheal.core.dedupe): the same alert, by fingerprint and start, or the same
failure on the same GPU while the node is still out of service from that incident, within the
duplicate window; another failure, a more severe one or a recurrence on a node back in service
starts a remediation. A report carries what failed, never how to remediate: the policy is the
cluster's (its coordinator's).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import (
    Client,
    WorkflowContinuedAsNewError,
    WorkflowExecution,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from gpuheal.clients.slurm.base import NodeOutOfService, SlurmBackend, UnknownNode
from gpuheal.core import dedupe, ids, queries
from gpuheal.core import search_attributes as sa
from gpuheal.core.messages import INCIDENT, INCIDENT_GIVE_BACK, INCIDENT_REPORT
from gpuheal.core.models.base import Stage, check_cluster_name, check_node_name
from gpuheal.core.models.incident import Decision, RemediationInput
from gpuheal.core.models.report import HealthReport
from gpuheal.core.models.result import RemediationResult
from gpuheal.core.settings import Settings

log = logging.getLogger("gpuheal.start")

# The incident that already handled a report (gpuheal.core.dedupe): the caller starts nothing.
AlreadyHandled = dedupe.Duplicate
# Whether the scheduler has a node in service now; None: it cannot tell (unreachable, no access).
NodeProbe = Callable[[str], Awaitable[bool | None]]
PROBE_TIMEOUT_S = 3.0
PROBE_QUIET_S = 60.0
# A node with more incidents closed within one duplicate window than this is looked at no further.
RECENT_LIMIT = 10


class ForeignCluster(ValueError):
    """A report or request names a cluster this process does not serve."""


def foreign_cluster(labels: list[str], cluster: str) -> str:
    """Why a report for another cluster is refused: what it said, and whose endpoint this is."""
    named = ", ".join(repr(c) for c in labels)
    return (
        f"cluster label {named} is not this endpoint's cluster {cluster!r}: refused, nothing started "
        "(send each cluster's alerts to its own gpuheal, or set GPUHEAL_CLUSTER to the label's value)"
    )


def check_own_cluster(settings: Settings, cluster: str) -> None:
    """One cluster, one authority: only this process's cluster (GPUHEAL_CLUSTER) is acted on."""
    own = settings.require_cluster()
    if cluster != own:
        raise ForeignCluster(foreign_cluster([cluster], own))


async def start_or_join(
    client: Client, settings: Settings, report: HealthReport, *, only_if_new: bool = False
) -> WorkflowHandle[Any, RemediationResult]:
    """Signal-with-start: the node's running incident gets the report, or a new one starts.
    `only_if_new`: refused (WorkflowAlreadyStartedError) when the node has a closed incident,
    which only the duplicate check may decide on (start_unless_handled)."""
    check_own_cluster(settings, report.cluster)
    return await client.start_workflow(
        INCIDENT.name,
        RemediationInput(report=report),
        result_type=INCIDENT.output,
        id=ids.incident_id(report.cluster, report.node),
        task_queue=settings.task_queue,
        id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE
        if only_if_new
        else WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        start_signal=INCIDENT_REPORT.name,
        start_signal_args=[report],
        search_attributes=sa.of_incident([report], Stage.TRIAGE.value),
        static_summary=f"GPU failure: {report.describe()}",
        static_details=(f"Reported by `{report.source}` at {report.observed_at.isoformat()}.\n\n{report.summary}"),
    )


async def start_unless_handled(
    client: Client, settings: Settings, report: HealthReport, *, node_in_service: NodeProbe | None = None
) -> WorkflowHandle[Any, RemediationResult] | AlreadyHandled:
    """already_handled, then start_or_join, in one Temporal call where that decides alike: a node
    with no incident yet (or none within retention) starts one, a node whose incident runs joins
    it (already_handled answers None for both). Only a node with a closed incident is looked at
    as already_handled does (the signal-with-start refuses to reuse its id), then started or not.
    A storm's first reports are one call each instead of two."""
    try:
        return await start_or_join(client, settings, report, only_if_new=True)
    except WorkflowAlreadyStartedError:
        pass  # a closed incident of this node: the duplicate check decides
    by = await already_handled(client, settings, report, node_in_service=node_in_service)
    return by if by is not None else await start_or_join(client, settings, report)


async def give_back_borrowed(
    client: Client, settings: Settings, cluster: str, node: str, operator: str, reason: str
) -> str:
    """Demand shifted back: the running incident that borrowed `node` from inference gives it back
    now (its jobs move off first). Says so when no incident holds that node. The names reach a
    visibility query: a bad one is refused here, before it is asked."""
    check_node_name(node)
    check_cluster_name(cluster)
    check_own_cluster(settings, cluster)
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


async def already_handled(
    client: Client, settings: Settings, report: HealthReport, *, node_in_service: NodeProbe | None = None
) -> AlreadyHandled | None:
    """The incident that already handled this report, or None (then start or join). Read-only.

    The duplicate window is this process's configured one (`settings.fleet.duplicate_window_s`,
    GPUHEAL_DUPLICATE_WINDOW_S of the worker, webhook or CLI), not the coordinator's: asking the
    coordinator would fail exactly in a storm, when it refuses queries.

    The node's latest run is described by its workflow id, which is consistent where visibility
    is not: right after a close visibility may still list it running, or not yet list it, and
    its alert keys may lag. Visibility adds the earlier runs closed within the window, and any
    run that had the same alert. `node_in_service`, where the caller can ask the scheduler, is
    asked only before a report is dropped as the same failure, so a node a person resumed after
    an aborted incident takes its next failure as news."""
    try:
        latest = await INCIDENT.handle(client, ids.incident_id(report.cluster, report.node)).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None  # no incident of this node (within retention): news
        raise
    if latest.status == WorkflowExecutionStatus.RUNNING:
        return None  # the report joins it (its own report signal dedupes and escalates)
    now = datetime.now(UTC)
    window = settings.fleet.duplicate_window_s
    closed: list[WorkflowExecution] = [latest]
    if window > 0:
        recent = queries.where(
            *_node_terms(report),
            queries.not_status("Running"),
            queries.after(queries.CLOSE_TIME, now - timedelta(seconds=window)),
        )
        closed += [wf async for wf in client.list_workflows(recent, limit=RECENT_LIMIT) if wf.run_id != latest.run_id]
    # (the result says whether it acted on its alerts, and how it left the node: see dedupe)
    past = [await _past(client, wf, with_result=window > 0 or bool(report.alert_key)) for wf in closed]
    if report.alert_key and not any(report.alert_key in p.alert_keys for p in past):
        # an older run beyond the window may have had it (the window does not bound the same alert)
        same_alert = queries.where(*_node_terms(report), queries.contains(sa.ALERT_KEYS, report.alert_key))
        past += [await _past(client, wf, with_result=True) async for wf in client.list_workflows(same_alert, limit=1)]
    verdict = dedupe.decide(report, past, now=now, window_s=window)
    if isinstance(verdict, dedupe.Duplicate) and verdict.kind == "same_failure" and node_in_service is not None:
        if await _ask(node_in_service, report.node):
            verdict = dedupe.decide(report, past, now=now, window_s=window, in_service_now=True)
    if isinstance(verdict, dedupe.New):
        log.debug("%s: new (%s)", report.describe(), verdict.why)
        return None
    return verdict


def _node_terms(report: HealthReport) -> tuple[queries.Term, ...]:
    return queries.of_type(INCIDENT), queries.eq(sa.CLUSTER, report.cluster), queries.eq(sa.NODE, report.node)


async def _past(client: Client, wf: WorkflowExecution, *, with_result: bool) -> dedupe.PastIncident:
    """A closed run as the decision reads it: its alert keys from Temporal's record, and (with
    `with_result`) what it handled and how it left the node, from its result."""
    keys = frozenset(wf.typed_search_attributes.get(sa.ALERT_KEYS) or ())
    closed_at = wf.close_time or datetime.now(UTC)
    # A run that continued as new (a follow-up) ran to its close too; it keeps only the alerts it acted on.
    completed = wf.status in (WorkflowExecutionStatus.COMPLETED, WorkflowExecutionStatus.CONTINUED_AS_NEW)
    base = dedupe.PastIncident(
        incident_id=wf.id, run_id=wf.run_id, closed_at=closed_at, alert_keys=keys, completed=completed
    )
    if not with_result:
        return base
    try:
        result = await INCIDENT.handle(client, wf.id, run_id=wf.run_id).result(follow_runs=False)
    except WorkflowFailureError:
        return base  # failed or terminated: no record of the node's state, nothing to swallow
    except WorkflowContinuedAsNewError:
        return base  # a follow-up took over: its own run says how it left the node
    return dedupe.PastIncident(
        incident_id=wf.id,
        run_id=wf.run_id,
        closed_at=closed_at,
        alert_keys=keys | {r.alert_key for r in result.reports if r.alert_key},  # visibility may lag
        failures=tuple(dedupe.Failure.of(r) for r in result.reports),
        action=result.action,
        outcome=result.outcome,
        node_state=result.node_state,
        completed=completed,
    )


def slurm_probe(slurm: SlurmBackend) -> NodeProbe:
    """Slurm's word on a node: in service unless drained, down, or out of the cluster (FUTURE)."""

    quiet_until = 0.0  # after a failure, Slurm is not asked again for PROBE_QUIET_S

    async def in_service(node: str) -> bool | None:
        nonlocal quiet_until
        if time.monotonic() < quiet_until:
            return None  # a storm of re-sent alerts must not become a storm of slow Slurm queries
        try:
            info = await asyncio.wait_for(slurm.node(node), PROBE_TIMEOUT_S)
        except (UnknownNode, NodeOutOfService):
            return False
        except Exception:
            quiet_until = time.monotonic() + PROBE_QUIET_S
            raise
        return not info.drained and info.state != "down"

    return in_service


async def _ask(probe: NodeProbe, node: str) -> bool | None:
    """The probe's answer, or None when it fails or is slow: then the incidents' records stand."""
    try:
        # a little longer than the probe's own timeout, so that a slow Slurm ends in the probe
        # (which then goes quiet) rather than by cancelling it from here
        return await asyncio.wait_for(probe(node), PROBE_TIMEOUT_S + 1)
    except Exception as err:  # advisory: a scheduler we cannot ask never blocks a report
        log.warning("could not ask whether %s is in service: %s", node, err)
        return None
