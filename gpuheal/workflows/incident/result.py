"""The incident's result at its close: every job with its fate, what the failure cost, the
node's state, and the policy it ran under. Built from the state alone (and the clock)."""

from __future__ import annotations

from temporalio import workflow

from gpuheal.workflows.incident.ledger import not_requeued, resumed
from gpuheal.workflows.incident.state import IncidentState

with workflow.unsafe.imports_passed_through():
    from gpuheal.core import policy
    from gpuheal.core.models.base import Outcome
    from gpuheal.core.models.result import RemediationResult


def result_for(s: IncidentState, outcome: Outcome, reason: str) -> RemediationResult:
    accounts = s.jobs.accounts(s.ref.incident_id)
    requeues = s.jobs.requeues()
    back = resumed(accounts)
    first = s.first_report
    cost = policy.incident_cost(first.observed_at, requeues, back, s.settings.gpus_per_node, s.capacity_back_at)
    counted = outcome == "resolved"  # MTTR and loss are a resolved incident's figures
    return RemediationResult(
        incident_id=s.ref.incident_id,
        cluster=s.ref.cluster,
        node=s.ref.node,
        action=s.current_action(),
        outcome=outcome,
        reason=reason,
        node_state=s.node_at.state,
        node_detail=s.node_at.detail,
        failure_observed_at=first.observed_at,
        closed_at=workflow.now(),
        stages=s.stages,
        reports=s.reports,
        decision=s.decision,
        drain=s.drain,
        jobs=accounts,
        jobs_requeued=requeues,
        jobs_not_requeued=not_requeued(accounts),
        jobs_resumed=back,
        replacement_node=s.replacement.new_node if s.replacement else None,
        rma=s.rma,
        burn_in=s.burn_in_verdict,
        borrowed_node=s.borrowed.node if s.borrowed else None,
        mode=s.policy.policy.mode if s.policy is not None else "",
        policy_version=s.policy.version if s.policy is not None else None,
        mttr_s=cost.mttr_s if counted else None,
        steps_lost=cost.steps_lost if counted else 0,
        gpu_seconds_lost=cost.gpu_seconds_lost if counted else 0.0,
    )
