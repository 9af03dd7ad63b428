"""The incident's timeline as people see it: a StageRecord per stage (the result and `status`),
the Stage and Action search attributes (visibility), a line per stage in the UI's current
details, and an Event per stage on the Kubernetes node (`kubectl describe node`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from temporalio import workflow
from temporalio.exceptions import ActivityError

from gpuheal.workflows.activity import run as act_run
from gpuheal.workflows.incident.state import IncidentState

with workflow.unsafe.imports_passed_through():
    from gpuheal.activities import interface as act
    from gpuheal.core import search_attributes as sa
    from gpuheal.core.models.base import ActionClass, Severity, Stage
    from gpuheal.core.models.kubernetes import KubeEvent, KubeNodeRef
    from gpuheal.core.models.report import HealthReport
    from gpuheal.core.models.result import Notification, StageRecord


@asynccontextmanager
async def in_stage(s: IncidentState, stage: Stage) -> AsyncIterator[StageRecord]:
    rec = StageRecord(stage=stage, started_at=workflow.now())
    s.stages.append(rec)
    s.stage = stage
    workflow.upsert_search_attributes([sa.STAGE.value_set(stage.value)])
    workflow.logger.info("stage %s started", stage.value)
    closed = False
    try:
        yield rec
    except GeneratorExit:
        # Python closes an evicted run's coroutine later, outside the workflow (a stopped
        # worker's cache): no workflow call may run then, it could touch another run's details.
        closed = True
        raise
    finally:
        if not closed:
            rec.ended_at = workflow.now()
            s.done.append(f"{stage.value}: {rec.outcome}" if rec.outcome else stage.value)
            workflow.set_current_details("\n".join(f"- {d}" for d in s.done))
    if s.kube is not None and not s.observing:
        await post_event(s.kube, stage, rec.outcome or stage.value)


async def post_event(node: KubeNodeRef, stage: Stage, message: str) -> None:
    """Best effort: an Event tells the story, it must not hold up the remediation (during an
    apiserver outage the cordon and eviction are retried; the Events are not)."""
    reason = "Gpuheal" + "".join(w.capitalize() for w in stage.value.split("_"))
    event = KubeEvent(node=node, reason=reason, message=message)
    try:
        await act_run(act.POST_NODE_EVENT, event, summary=f"event {reason}", attempts=3)
    except ActivityError as err:
        workflow.logger.warning("could not post Event %s on %s: %s", reason, node.kube_node, err.cause)


def index_report(s: IncidentState, report: HealthReport) -> None:
    """A joining report's alert and GPU serial, findable: the same alert re-sent after the close
    starts nothing, and a board's history follows its serial (`gpuheal history --serial`)."""
    if report.alert_key:
        workflow.upsert_search_attributes([sa.ALERT_KEYS.value_set(sa.alert_keys(s.reports))])
    if report.gpu_serial:
        workflow.upsert_search_attributes([sa.GPU_SERIALS.value_set(sa.serials(s.reports))])


def set_action(s: IncidentState, action: ActionClass) -> None:
    s.action = action
    workflow.upsert_search_attributes([sa.ACTION.value_set(action.value)])


async def notify(s: IncidentState, event: str, severity: Severity, message: str) -> None:
    """Tell the operators (the notifier routes it; the incident and event key it). A notice that
    cannot be delivered after its retries never fails the incident: the remediation goes on, and
    its timeline says the notice was lost."""
    ref = s.ref
    note = Notification(
        incident_id=ref.incident_id,
        event=event,
        severity=severity,
        message=message,
        node=ref.node,
        cluster=ref.cluster,
        # The second approval request of a run is news too: each telling has its own key.
        key=f"{ref.incident_id}/{s.notice_key}:{event}:{s.notices.get(event, 0)}",
    )
    s.notices[event] = s.notices.get(event, 0) + 1
    try:
        await act_run(act.NOTIFY_OPERATORS, note, summary=f"notify: {event}")
    except ActivityError as err:
        if not workflow.patched(NOTICES_NEVER_FAIL):
            raise  # how incidents started before the fix ended (their histories replay so)
        workflow.logger.warning("notice %s undelivered: %s", event, err.cause or err)
        s.done.append(f"notice {event} undelivered: {err.cause or err}")


# Incidents started before it failed when a notice could not be delivered.
NOTICES_NEVER_FAIL = "a-lost-notice-never-fails-the-incident"
