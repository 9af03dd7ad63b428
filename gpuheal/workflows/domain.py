"""DomainIncident: one per domain that fails as a whole (at least half its nodes reporting within
the window, decided by the coordinator, workflows/fleet.py). It tells the operators which domain
and which nodes, holds the domain's node incidents, and waits for an operator to release them
(each then goes on, within the budget) or dismiss them, for at most its bound.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

from gpuheal.workflows import gate
from gpuheal.workflows.activity import ask_coordinator, run

with workflow.unsafe.imports_passed_through():
    from gpuheal.activities import interface as act
    from gpuheal.core import messages as m
    from gpuheal.core.fleet.models import DomainDecision, DomainDecisionFor, DomainIncidentInput, DomainIncidentResult
    from gpuheal.core.models.incident import POLICY_OPERATOR
    from gpuheal.core.models.result import Notification

# Domain incidents started before it failed when their notice could not be delivered, and asked
# the coordinator once, 30 s an attempt (a storm's batches queue ahead of it): either failure left
# the domain held for good. Their histories replay so.
OUTLASTS_NOTICE_AND_STORM = "a-domain-incident-outlasts-its-notice-and-a-busy-coordinator"
# The decision is offered to the coordinator again after this pause, try after try, for at most
# DELIVER_WITHIN; past it the workflow ends saying so, and the coordinator applies the default
# itself (gpuheal.core.fleet.domain_reaping).
DELIVER_PAUSE = timedelta(minutes=1)
DELIVER_WITHIN = timedelta(minutes=20)  # under domain_reaping.OVERDUE_MARGIN_S: a late decision is never overridden


@workflow.defn(name=m.DOMAIN_INCIDENT.name)
class DomainIncidentWorkflow:
    """One domain failing as a whole: tell the operators which domain and which nodes, hold the
    node incidents, and wait for a decision (release or dismiss) for at most the bound."""

    @workflow.init
    def __init__(self, inp: DomainIncidentInput) -> None:
        self._decision: DomainDecision | None = None
        self._lost: list[str] = []  # what could not be delivered, in the workflow's details

    @workflow.run
    async def run(self, inp: DomainIncidentInput) -> DomainIncidentResult:
        d = inp.incident
        note = Notification(
            incident_id=d.incident_id,
            event="domain_incident",
            severity="critical",
            message=(
                f"{len(d.nodes)} nodes of {d.domain} failed within minutes ({', '.join(d.nodes)}): suspected "
                "switch, power or cooling. Their incidents are held: `gpuheal domain release|dismiss "
                f"{d.domain} --operator NAME --reason TEXT` (default after {inp.decide_within_s:g} s: {inp.default})."
            ),
            node=",".join(d.nodes),
            cluster=inp.cluster,
            key=f"{d.incident_id}/{workflow.info().first_execution_run_id}:domain_incident",
        )
        outlasts = workflow.patched(OUTLASTS_NOTICE_AND_STORM)
        try:
            await run(act.NOTIFY_OPERATORS, note, summary="notify: domain incident")
        except ActivityError as err:
            if not outlasts:
                raise  # how domain incidents started before the fix ended
            self._say(f"notice domain_incident undelivered: {err.cause or err}")
        self._decision = await gate.decide(
            lambda: self._decision,
            within=timedelta(seconds=inp.decide_within_s),
            summary=f"domain incident: without a decision, {inp.default}",
            otherwise=lambda: DomainDecision(
                domain=d.domain, decision=inp.default, operator=POLICY_OPERATOR, reason="no decision in time"
            ),
        )
        decided = DomainDecisionFor(cluster=inp.cluster, decision=self._decision)
        summary = f"{self._decision.decision} the node incidents"
        if outlasts:
            answer = await self._deliver(decided, summary)
        else:
            answer = await run(act.DECIDE_DOMAIN, decided, summary=summary)
        return DomainIncidentResult(domain=d.domain, nodes=d.nodes, decision=self._decision, coordinator=answer)

    async def _deliver(self, decided: DomainDecisionFor, summary: str) -> str:
        """The coordinator's answer to the decision, however long a storm keeps it busy (the call
        is idempotent: decided already, it says so). Past DELIVER_WITHIN, what went wrong: the
        coordinator then decides by default, as for a domain incident that ended undecided."""
        give_up = workflow.now() + DELIVER_WITHIN
        while True:
            try:
                return await ask_coordinator(act.DECIDE_DOMAIN, decided, summary=summary)
            except ActivityError as err:
                why = f"decision not delivered to the coordinator: {err.cause or err}"
                if workflow.now() >= give_up:
                    self._say(why)
                    return why
                workflow.logger.warning("%s; offered again in %s", why, DELIVER_PAUSE)
                await workflow.sleep(DELIVER_PAUSE, summary="offer the decision again")

    def _say(self, lost: str) -> None:
        workflow.logger.warning("%s", lost)
        self._lost.append(lost)
        workflow.set_current_details("\n".join(f"- {x}" for x in self._lost))

    @workflow.update(name=m.DOMAIN_DECIDE.name)
    def decide(self, d: DomainDecision) -> str:
        self._decision = d
        return f"{d.decision} recorded by {d.operator}"

    @decide.validator
    def _validate_decide(self, d: DomainDecision) -> None:
        if self._decision is not None:
            raise ValueError(f"already decided: {self._decision.decision} by {self._decision.operator}")
