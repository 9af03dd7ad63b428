"""The application-fault ladder in the incident: restart, then a burn-in, then a replacement
(the decision: gpuheal.core.app_faults).

Once the jobs on the node are known (after protect_progress), an application fault asks what this
GPU's earlier application faults hit. While they hit fewer than `RepeatPolicy.incidents`
different jobs it restarts its job in place, as before. At that many, it becomes a burn-in, only
when that can start at once: a validation job is set (`GPUHEAL_VALIDATE_JOB`), the cluster's
approval policy lets a drain go without a person, and the coordinator grants the drain now. Else
the job restarts in place and the operators are told the GPU wants diagnostics (`burn_in_wanted`):
a crashed job never waits for a diagnosis. The burn-in drains the node, requeues its jobs off it
and runs the validation job. Passed, the node goes back into service. Failed (the job ran and
failed), the incident is admitted again as hardware (the breaker and the repeat rule count it:
a validation job that fails everywhere trips the breaker) and, if its grant still stands, the
node is replaced; otherwise the node stays drained for the vendor. A burn-in that gave no verdict
(it never ran to an end) keeps the node drained for a person and condemns nothing. A history
Temporal cannot give restarts the job in place, as before.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

from gpuheal.workflows.activity import run as act_run
from gpuheal.workflows.incident import capacity, node
from gpuheal.workflows.incident.state import IncidentState
from gpuheal.workflows.incident.timeline import notify

with workflow.unsafe.imports_passed_through():
    from gpuheal.activities import interface as act
    from gpuheal.core import app_faults, policy, render
    from gpuheal.core import search_attributes as sa
    from gpuheal.core.fleet import budget
    from gpuheal.core.fleet.models import CapacityDecision
    from gpuheal.core.models.base import ActionClass, NodeAt
    from gpuheal.core.models.slurm import ValidationResult
    from gpuheal.core.policy import Plan

# Incidents before this release restarted every application fault in place.
APP_FAULT_LADDER = "application-faults-recurring-across-jobs-are-burned-in"

# A burn-in takes the node out like a repair, with no repair before the validation.
BURN_IN = Plan(drain=True, requeue=True, repair=None, avoid_failed_node=True)


def _an_application_fault(s: IncidentState) -> bool:
    return s.current_action() == ActionClass.RESTART_APP and policy.is_application_fault(s.reports)


def burning_in(s: IncidentState) -> bool:
    """A burn-in was granted, and no report since says hardware (then its plan is that one's)."""
    return s.burn_in is not None and _an_application_fault(s)


def plan_for(s: IncidentState) -> Plan:
    return BURN_IN if burning_in(s) else policy.plan_for(s.current_action())


async def climb(s: IncidentState) -> None:
    """Whether this application fault is one too many for its GPU and can be burned in now: then
    `s.burn_in` says why (and the coordinator has granted the drain)."""
    if s.observing or not _an_application_fault(s) or not workflow.patched(APP_FAULT_LADDER):
        return
    first, repeat = s.first_report, s.cluster_policy.repeat
    req = app_faults.AppFaultsRequest(
        cluster=s.ref.cluster,
        node=s.ref.node,
        gpu=first.gpu,
        serials=tuple(sa.serials(s.reports)),
        since=workflow.now() - timedelta(seconds=repeat.window_s),
    )
    try:
        earlier = await act_run(act.FIND_APPLICATION_FAULTS, req, summary="this GPU's earlier application faults")
    except ActivityError as err:  # no history, no verdict: the job restarts as it always did
        workflow.logger.warning("application-fault history not read: %s", err.cause or err)
        return
    jobs = app_faults.burn_in_due(earlier.faults, [j.job_id for j in s.jobs.affected], repeat.incidents)
    if jobs is None or not _an_application_fault(s):  # (a hardware report may have joined meanwhile)
        return
    why = render.burn_in_due(first, jobs, repeat.window_s)
    not_now = await _why_not_now(s)
    if not_now:
        await notify(s, "burn_in_wanted", "warning", render.no_burn_in(s.ref.node, why, not_now))
        return
    s.burn_in = why


async def _why_not_now(s: IncidentState) -> str:
    """Why the burn-in cannot start at once ("" when it can: the coordinator granted the drain)."""
    p = s.cluster_policy
    if not s.settings.validate_job:
        return "no validation job is set (GPUHEAL_VALIDATE_JOB)"
    if budget.needs_approval(p.mode, ActionClass.REPLACE_NODE, p.approval):
        return f"the cluster's policy has a person approve what may replace a node (mode {p.mode})"
    answer = await capacity.request(s, contain=False)  # held, it leaves the line at once
    if isinstance(answer, CapacityDecision) and answer.granted:
        return ""
    await capacity.release(s)  # out of the line: the job restarts now, not after a wait
    reason = answer.reason if isinstance(answer, CapacityDecision) else f"{answer.asked}: {answer.cause}"
    return f"the coordinator has no capacity for it now ({reason})"


async def after_burn_in(s: IncidentState) -> NodeAt:
    """The validation job on the drained node: passed, it goes back; failed, it is replaced if
    the coordinator, counting it as hardware now, still grants it; else it stays drained."""
    assert s.settings.validate_job
    verdict = await node.validate(s, s.settings.validate_job)
    if verdict.by_others:
        return render.left_drained(s.drain)
    s.burn_in_verdict = "passed" if verdict.passed else "failed"
    if verdict.passed:
        return await node.resume(s, f"burn-in passed ({verdict.detail})")
    if verdict.no_verdict:  # it never ran to an end: kept drained for a person, nothing condemned
        return render.unvalidated("drained for a burn-in", verdict)
    # Replaced only on a job that ended and said no: not a hung one (kept for the vendor), nor a
    # verdict an earlier release's worker worded (which named no "no verdict").
    if not (verdict.ran_and_failed and _ran_and_failed(verdict)):
        return render.failed_validation("drained for a burn-in", verdict)
    await capacity.admit(s, ActionClass.REPLACE_NODE, render.burn_in_failed(verdict.detail), hardware=True)
    answer = await capacity.confirm(s)
    if not (isinstance(answer, CapacityDecision) and answer.granted):
        return render.failed_validation("drained for a burn-in", verdict)
    return await node.replace_after(s, render.burn_in_failed(verdict.detail))


def _ran_and_failed(v: ValidationResult) -> bool:
    """The burn-in job ended and said no ("burn-in job N ended FAILED ..."), as opposed to one
    that could not run or gave no verdict in time (activities/validation.py words them)."""
    return v.job_id is not None and " ended " in v.detail
