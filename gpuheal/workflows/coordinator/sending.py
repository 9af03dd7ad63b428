"""What the coordinator's handlers decided, done by its loop (outside the handlers): domain
incidents opened, grant notices signalled to held incidents, notices to the operators. From
COORDINATOR_2 on, the activities run beside the loop: a receiver down never holds it up."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from temporalio import workflow
from temporalio.exceptions import ActivityError

from gpuheal.workflows.activity import run
from gpuheal.workflows.coordinator.state import CoordinatorState
from gpuheal.workflows.coordinator.versions import COORDINATOR_2, NOTICES_TOGETHER

with workflow.unsafe.imports_passed_through():
    from gpuheal.activities import interface as act
    from gpuheal.core import messages as m
    from gpuheal.core.fleet.models import DomainIncident, GrantNotice, Note
    from gpuheal.core.models.result import Notification

# Incidents told in one workflow task (from NOTICES_TOGETHER): a budget raised over a held line
# of thousands stays well inside Temporal's pending external signals per workflow (2,000).
NOTICES_AT_ONCE = 100


async def send(c: CoordinatorState) -> None:
    """What the updates decided, done: domain incidents, signals to held incidents, notices."""
    background = workflow.patched(COORDINATOR_2)
    while c.domains:
        domain = c.domains.pop(0)
        opening = run(
            act.OPEN_DOMAIN_INCIDENT, domain, summary=f"open domain incident {domain.domain}", task_queue=c.own_queue
        )
        if background:
            in_background(c, domain, opening, f"domain incident {domain.domain} not opened")
        else:
            await opening
    together = bool(c.signals) and workflow.patched(NOTICES_TOGETHER)
    while c.signals:  # (more may queue while these go out)
        if together:
            by_incident: dict[str, list[GrantNotice]] = {}
            for incident, notice in c.signals:
                by_incident.setdefault(incident, []).append(notice)
            c.signals.clear()
            told = list(by_incident.items())
            for at in range(0, len(told), NOTICES_AT_ONCE):
                await asyncio.gather(
                    *(tell(c, incident, notices) for incident, notices in told[at : at + NOTICES_AT_ONCE])
                )
        else:  # coordinators started before NOTICES_TOGETHER: one workflow task per notice
            incident, notice = c.signals.pop(0)
            await tell(c, incident, [notice])
    while c.notes:
        item = c.notes.pop(0)
        event, severity, message = item
        note = Notification(
            incident_id=workflow.info().workflow_id,
            event=event,
            severity=severity,
            message=message,
            node="-",
            cluster=c.fleet.cluster,
            # The coordinator lives on: the same event recurs, each occurrence its own notice.
            key=f"{workflow.info().workflow_id}:{event}:{workflow.now().isoformat()}:{len(c.notes)}",
        )
        delivery = run(act.NOTIFY_OPERATORS, note, summary=f"notify: {event}", task_queue=c.own_queue)
        if background:
            in_background(c, item, delivery, f"notice {event} undelivered")
        else:
            await delivery
    c.view_changed()


async def tell(c: CoordinatorState, incident: str, notices: list[GrantNotice]) -> None:
    """One incident's notices, in their order."""
    for notice in notices:
        try:
            await m.INCIDENT_CAPACITY.send(workflow.get_external_workflow_handle(incident), notice)
        except Exception as err:  # the incident ended meanwhile: what it holds is reaped
            workflow.logger.info("incident %s not told (%s)", incident, err)
            c.reap_now = True


def in_background(c: CoordinatorState, item: Note | DomainIncident, call: Awaitable[object], failed: str) -> None:
    """Run an activity beside the loop: it retries on its own, and when it gives up the
    coordinator says so and goes on (a notice receiver down must never fail it: the breaker,
    the grants and the line would be lost with it). A domain incident that could not be
    opened is tried again: its rack's incidents wait for it."""

    async def attempt() -> None:
        try:
            await call
        except ActivityError as err:
            c.undelivered.append(f"{failed}: {err.cause or err}")
            workflow.logger.warning("%s: %s", failed, err.cause or err)
            if isinstance(item, DomainIncident):
                c.domains.append(item)
            c.view_changed()

    task = asyncio.ensure_future(attempt())
    c.on_way[task] = item
    task.add_done_callback(lambda done: c.on_way.pop(done, None))
