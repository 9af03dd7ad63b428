"""The incident's work on the node's jobs: ask them to checkpoint, hand each to its recovery,
collect the recoveries' answers. The decisions are the ledger's and job_policy's; this runs the
activities they call for. Each function returns its stage's outcome in words."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

from gpuheal.workflows import gate
from gpuheal.workflows.activity import run as act_run
from gpuheal.workflows.activity import run_waiting
from gpuheal.workflows.incident.state import IncidentState

with workflow.unsafe.imports_passed_through():
    from gpuheal.activities import interface as act
    from gpuheal.core import job_policy, render
    from gpuheal.core.jobs import RecoveryJoin
    from gpuheal.core.models.slurm import CheckpointRequest, CheckpointWait, JobList, JobSnapshot

# verify_resume waits this much beyond the recoveries' own bound before it stops waiting.
ANSWER_MARGIN_S = 120

# Incidents before this release signalled a job its previous run's progress line named a signal
# for; they keep doing so (workflow.patched) to replay.
ASK_ONLY_THIS_RUN = "checkpoint-ask-only-what-this-run-said"


async def protect_progress(s: IncidentState) -> str:
    """The jobs on the node now are the incident's to account for. Those that said they handle
    a signal are asked to checkpoint, and waited for until each confirms (a checkpoint newer than
    the signal) or the grace ends; the others are not signalled at all."""
    settings = s.settings
    jobs = await act_run(act.LIST_JOBS_ON_NODE, s.ref, summary="find jobs on node")
    s.jobs.found(jobs.jobs)
    this_run_only = workflow.patched(ASK_ONLY_THIS_RUN)
    asks = [a for a in (job_policy.checkpoint_ask(j, this_run_only) for j in jobs.jobs) if a is not None]
    s.jobs.checkpoints = {j.job_id: render.not_signalled(j) for j in jobs.jobs}
    if asks:
        req = CheckpointRequest(node=s.ref.node, asks=tuple(asks))
        sent = await act_run(act.REQUEST_CHECKPOINT, req, summary="ask jobs to checkpoint (the signal each asked for)")
        wait = CheckpointWait(
            asks=sent.asks,
            deadline_at=workflow.now().timestamp() + settings.checkpoint_grace_s,
            unconfirmed_wait_s=min(settings.checkpoint_unconfirmed_wait_s, settings.checkpoint_grace_s),
        )
        confirmed = await run_waiting(
            act.WAIT_FOR_CHECKPOINTS,
            wait,
            summary="wait for each job to confirm a checkpoint (or the grace)",
            deadline_s=settings.checkpoint_grace_s,
        )
        s.jobs.checkpoints.update({o.job_id: o for o in confirmed.outcomes})
    return render.checkpoints(len(jobs.jobs), [s.jobs.checkpoints[j.job_id] for j in jobs.jobs])


async def requeue(s: IncidentState, avoid_failed_node: bool) -> str:
    """Every job that was on the node: still there -> its job recovery (which requeues it once,
    whichever incidents join); gone -> how it ended (and a failed, requeueable one is recovered
    too, not forgotten)."""
    live = await act_run(act.LIST_JOBS_ON_NODE, s.ref, summary="find jobs on node")
    live_ids = {j.job_id for j in live.jobs}
    left = [j for j in s.jobs.affected if j.job_id not in live_ids]
    now = await act_run(act.FIND_JOBS, JobList(jobs=tuple(left)), summary="how the others ended") if left else JobList()
    for job in s.jobs.sort_out(live.jobs, left, now.jobs):
        await hand_over(s, job, avoid_failed_node)
    return render.handed_over(list(s.jobs.settled.values()), list(s.jobs.recoveries))


async def hand_over(
    s: IncidentState, job: JobSnapshot, avoid_failed_node: bool, node: str = "", what: str = ""
) -> None:
    s.jobs.found_late(job)
    first = s.first_report
    join = RecoveryJoin(
        incident_id=s.ref.incident_id,
        cluster=s.ref.cluster,
        failed_node=node or s.ref.node,
        what=what or first.describe(),
        failure_at=first.observed_at,
        job=job,
        checkpoint=s.jobs.checkpoints.get(job.job_id),
        exclude_failed_node=avoid_failed_node,
    )
    handoff = await act_run(act.START_JOB_RECOVERY, join, summary=f"hand job {job.job_id} to its recovery")
    s.jobs.handed_over(handoff.recovery_id, job.job_id, handoff.result)


async def hand_over_from(s: IncidentState, job: JobSnapshot, node: str, what: str) -> None:
    """A job on a borrowed node that goes back: it must not come back to that node."""
    await hand_over(s, job, avoid_failed_node=True, node=node, what=what)


async def collect_answers(s: IncidentState) -> str:
    """The job recoveries verify (each job once, across all its new nodes); this collects their
    answers for at most their bound, or until a more severe report outgrows the plan (the
    follow-up run acts at once). The unanswered are recorded as such; their recoveries go on."""
    bound = s.settings.jobs.verify_timeout_s + s.settings.jobs.gather_s + ANSWER_MARGIN_S
    await gate.wait_for(
        lambda: True if s.jobs.all_answered() or s.follow_up is not None else None,
        within=timedelta(seconds=bound),
        summary="job recoveries: stop waiting for their answers",
    )
    return "; ".join(render.job_line(a) for a in s.jobs.accounts(s.ref.incident_id)) or "no job"


async def account_for_untouched(s: IncidentState) -> None:
    """Stopped before the jobs were looked at: they are accounted for, untouched."""
    if not s.jobs.affected:
        jobs = await act_run(act.LIST_JOBS_ON_NODE, s.ref, summary="find jobs on node")
        s.jobs.found(jobs.jobs)
