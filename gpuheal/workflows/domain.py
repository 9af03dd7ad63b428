"""DomainIncident: one per domain that fails as a whole (at least half its nodes reporting within
the window, decided by the coordinator, workflows/fleet.py). It tells the operators which domain
and which nodes, holds the domain's node incidents, and waits for an operator to release them
(each then goes on, within the budget) or dismiss them, for at most its bound.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

from gpuheal.workflows import gate
from gpuheal.workflows.activity import run

with workflow.unsafe.imports_passed_through():
    from gpuheal.activities import interface as act
    from gpuheal.core import messages as m
    from gpuheal.core.fleet.models import DomainDecision, DomainDecisionFor, DomainIncidentInput, DomainIncidentResult
    from gpuheal.core.models.incident import POLICY_OPERATOR
    from gpuheal.core.models.result import Notification


@workflow.defn(name=m.DOMAIN_INCIDENT.name)
class DomainIncidentWorkflow:
    """One domain failing as a whole: tell the operators which domain and which nodes, hold the
    node incidents, and wait for a decision (release or dismiss) for at most the bound."""

    @workflow.init
    def __init__(self, inp: DomainIncidentInput) -> None:
        self._decision: DomainDecision | None = None

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
        await run(act.NOTIFY_OPERATORS, note, summary="notify: domain incident")
        self._decision = await gate.decide(
            lambda: self._decision,
            within=timedelta(seconds=inp.decide_within_s),
            summary=f"domain incident: without a decision, {inp.default}",
            otherwise=lambda: DomainDecision(
                domain=d.domain, decision=inp.default, operator=POLICY_OPERATOR, reason="no decision in time"
            ),
        )
        decided = DomainDecisionFor(cluster=inp.cluster, decision=self._decision)
        answer = await run(act.DECIDE_DOMAIN, decided, summary=f"{self._decision.decision} the node incidents")
        return DomainIncidentResult(domain=d.domain, nodes=d.nodes, decision=self._decision, coordinator=answer)

    @workflow.update(name=m.DOMAIN_DECIDE.name)
    def decide(self, d: DomainDecision) -> str:
        self._decision = d
        return f"{d.decision} recorded by {d.operator}"

    @decide.validator
    def _validate_decide(self, d: DomainDecision) -> None:
        if self._decision is not None:
            raise ValueError(f"already decided: {self._decision.decision} by {self._decision.operator}")
