"""The application-fault ladder in the incident: restart, then a burn-in, then a replacement
(the decision: gpuheal.core.app_faults).

Once the jobs on the node are known (after protect_progress), an application fault asks what this
GPU's earlier application faults hit. While they hit fewer than `RepeatPolicy.incidents`
different jobs it restarts its job in place, as before. At that many, the plan becomes a burn-in:
a grant from the coordinator, the drain, the jobs requeued off the node, the validation job
(`GPUHEAL_VALIDATE_JOB`) on it; passed, the node goes back into service; failed, it is replaced
(`replace_after`, as after a failed health check). Without a validation job there is nothing to
diagnose with: the job restarts and the operators are told the GPU wants diagnostics.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

from gpuheal.workflows.activity import run as act_run
from gpuheal.workflows.incident import node
from gpuheal.workflows.incident.state import IncidentState
from gpuheal.workflows.incident.timeline import notify

with workflow.unsafe.imports_passed_through():
    from gpuheal.activities import interface as act
    from gpuheal.core import app_faults, policy, render
    from gpuheal.core.models.base import ActionClass, NodeAt
    from gpuheal.core.policy import Plan

# Incidents before this release restarted every application fault in place.
APP_FAULT_LADDER = "application-faults-recurring-across-jobs-are-burned-in"

# A burn-in takes the node out like a repair, with no repair before the validation.
BURN_IN = Plan(drain=True, requeue=True, repair=None, avoid_failed_node=True)


async def climb(s: IncidentState) -> None:
    """Whether this application fault is one too many for its GPU: then `s.burn_in` says why."""
    if s.observing or s.current_action() != ActionClass.RESTART_APP or not policy.is_application_fault(s.reports):
        return
    if not workflow.patched(APP_FAULT_LADDER):
        return
    first, repeat = s.first_report, s.cluster_policy.repeat
    req = app_faults.AppFaultsRequest(
        cluster=s.ref.cluster,
        node=s.ref.node,
        gpu=first.gpu,
        serials=tuple(dict.fromkeys(r.gpu_serial for r in s.reports if r.gpu_serial)),
        since=workflow.now() - timedelta(seconds=repeat.window_s),
    )
    earlier = await act_run(act.FIND_APPLICATION_FAULTS, req, summary="this GPU's earlier application faults")
    jobs = app_faults.burn_in_due(earlier.faults, [j.job_id for j in s.jobs.affected], repeat.incidents)
    if jobs is None:
        return
    why = render.burn_in_due(first, jobs, repeat.window_s)
    if not s.settings.validate_job:
        await notify(s, "burn_in_wanted", "warning", render.no_burn_in(s.ref.node, why))
        return
    s.burn_in = why


def plan_for(s: IncidentState) -> Plan:
    return BURN_IN if s.burn_in else policy.plan_for(s.current_action())


async def after_burn_in(s: IncidentState) -> NodeAt:
    """The validation job on the drained node: passed, it goes back; failed, it is replaced."""
    assert s.settings.validate_job
    verdict = await node.validate(s, s.settings.validate_job)
    s.burn_in_verdict = "passed" if verdict.passed else "failed"
    if verdict.by_others:
        return render.left_drained(s.drain)
    if verdict.passed:
        return await node.resume(s, f"burn-in passed ({verdict.detail})")
    return await node.replace_after(s, render.burn_in_failed(verdict.detail))
