"""A human's decision on the incident: asked for, waited for at the gate with the cluster's
timeout, and what silence means (the policy's default, recorded as the policy's decision).
The workflow's `approve` / `abort` updates and signals record into the same state."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

from gpuheal.workflows import gate
from gpuheal.workflows.incident.state import IncidentState

with workflow.unsafe.imports_passed_through():
    from gpuheal.core.models.base import Verdict
    from gpuheal.core.models.incident import POLICY_OPERATOR, Decision, RecordedDecision


def open(s: IncidentState) -> None:
    """From now on approve / abort are taken (an earlier gate's decision does not answer this one)."""
    s.decision = None
    s.awaiting_approval = True


async def wait(s: IncidentState) -> RecordedDecision:
    """Wait for approve / abort, for at most the cluster's approval timeout."""
    approval = s.cluster_policy.approval
    try:
        s.decision = await gate.decide(
            lambda: s.decision,
            within=timedelta(seconds=approval.timeout_s),
            summary=f"approval: without a decision, {approval.default_on_timeout}",
            otherwise=lambda: RecordedDecision(
                verdict=approval.default_on_timeout,
                operator=POLICY_OPERATOR,
                reason=f"no decision within {approval.timeout_s:g} s",
                at=workflow.now(),
                by_timeout=True,
            ),
        )
    finally:
        s.awaiting_approval = False
    return s.decision


def record(s: IncidentState, verdict: Verdict, d: Decision) -> str:
    s.decision = RecordedDecision(verdict=verdict, operator=d.operator, reason=d.reason, at=workflow.now())
    return f"{verdict} recorded for {s.ref.incident_id} by {d.operator}"


def refusal(s: IncidentState) -> str | None:
    """Why a decision cannot be taken now (an update's validator raises it), or None."""
    if not s.awaiting_approval:
        return f"incident is not awaiting approval (stage: {s.stage.value})"
    if s.decision is not None:
        return f"already decided: {s.decision.verdict} by {s.decision.operator}"
    return None
