"""Decisions about jobs: pure, deterministic, unit-tested (tests/test_job_policy.py).

Which signal asks a job to checkpoint (never one it did not ask for: a signal's default action
is to terminate), who owns a job, how many requeues a job has left, what a failure cost it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Required, TypedDict, Unpack

from gpuheal.core.jobs import (
    ABNORMAL_ENDS,
    ENDED_STATES,
    JobRecoveryResult,
    PastRecovery,
    RecoveryJoin,
    RetryBudget,
    VerifyOutcome,
)
from gpuheal.core.models.result import JobAccount, JobFate, ResumedJob
from gpuheal.core.models.slurm import CheckpointAsk, CheckpointOutcome, JobSnapshot, RequeueResult

# sbatch --signal=[{R|B}:]<sig_num>[@sig_time]: what the job asked Slurm to send before its end.
_SIGNAL_OPTION = re.compile(r"--signal[= ](?P<flags>[RB]{1,2}:)?(?P<sig>[A-Za-z0-9]+)(?:@\d+)?")
_SIGNAL_NUMBERS = {"10": "USR1", "12": "USR2", "15": "TERM", "1": "HUP", "2": "INT"}


def checkpoint_ask(job: JobSnapshot, this_run_only: bool = True) -> CheckpointAsk | None:
    """The signal that asks this job to checkpoint, from what the job itself said; None when it
    said nothing (it is then left alone: an untrapped SIGUSR1 kills).

    A progress line speaks for the run that wrote it. Just after a requeue the job's comment is
    still its previous run's (restart count behind the job's): the run now starting may not have
    trapped the signal yet, so that line asks for nothing (incidents before this release took it
    at its word, `this_run_only=False`, and killed such a run)."""
    line = job.this_runs_progress if this_run_only else job.progress
    if line is not None and line.signal:
        return CheckpointAsk(job_id=job.job_id, signal=_signal_name(line.signal), batch_only=True)
    match = _SIGNAL_OPTION.search(job.submit_line)
    if match is None:
        return None
    flags = match.group("flags") or ""
    return CheckpointAsk(job_id=job.job_id, signal=_signal_name(match.group("sig")), batch_only="B" in flags)


def _signal_name(sig: str) -> str:
    sig = sig.upper().removeprefix("SIG")
    return _SIGNAL_NUMBERS.get(sig, sig)


def owner_recipients(job: JobSnapshot) -> tuple[str, ...]:
    """The job's owner, its --mail-user and the progress line's notify=, each once."""
    found: list[str] = []
    for who in (job.user, job.mail_user, job.progress.notify if job.progress else ""):
        if who and who not in found:
            found.append(who)
    return tuple(found)


def retry_budget(
    past: Iterable[PastRecovery], allowed: int, window_s: float, failing_now: Iterable[str]
) -> RetryBudget:
    """Requeues by gpuheal within the window (the caller asked visibility for that window), and
    the nodes the job failed on meanwhile: the suspects if the budget is spent."""
    requeued = sorted((r for r in past if r.requeued), key=lambda r: r.started_at)
    suspects: list[str] = []
    for node in [n for r in requeued for n in r.failed_nodes] + list(failing_now):
        if node not in suspects:
            suspects.append(node)
    avoided = tuple(dict.fromkeys(n for r in requeued for n in r.avoided_nodes if n not in suspects))
    return RetryBudget(
        used=len(requeued), allowed=allowed, window_s=window_s, suspects=tuple(suspects), avoided=avoided
    )


def released_exclusions(budget: RetryBudget) -> tuple[str, ...]:
    """Nodes gpuheal excluded for this job before (its earlier failures, and nodes another
    incident was open on): the requeue activity lets the job back on those that are in service
    again, healthy."""
    return (*budget.suspects, *budget.avoided)


def steps_at_risk(requeue: RequeueResult) -> int | None:
    if requeue.step_at_failure is None or requeue.checkpoint_step is None:
        return None
    return max(0, requeue.step_at_failure - requeue.checkpoint_step)


@dataclass(frozen=True)
class JobCost:
    steps_lost: int
    gpu_seconds_lost: float


def job_cost(
    first: RecoveryJoin, requeue: RequeueResult, verify: VerifyOutcome, gpus_per_node: int, now: datetime
) -> JobCost:
    """Steps redone (failure step minus checkpoint step) and GPU time lost: the job's GPUs times
    its downtime plus the recomputation since its last checkpoint."""
    steps = steps_at_risk(requeue) or 0
    failure_at = first.failure_at
    back_at = verify.resumed.observed_at if verify.resumed is not None else now
    downtime = max(0.0, (back_at - failure_at).total_seconds())
    recompute = 0.0
    if requeue.checkpoint_at is not None:
        recompute = max(0.0, failure_at.timestamp() - requeue.checkpoint_at)
    gpu_s = requeue.node_count * gpus_per_node * (downtime + recompute)
    return JobCost(steps_lost=steps, gpu_seconds_lost=round(gpu_s, 1))


class _Outcome(TypedDict, total=False):
    """What became of a job: JobAccount's fields but who it is (typed here so each caller's fields
    are checked; their defaults stay on the model)."""

    fate: Required[JobFate]
    detail: Required[str]
    slurm_state: str
    caused_by_gpuheal: bool
    checkpoint: CheckpointOutcome | None
    recovery_id: str | None
    joined: bool
    resumed: ResumedJob | None


def _account(job: JobSnapshot, **outcome: Unpack[_Outcome]) -> JobAccount:
    """A job's account: who it is comes from its snapshot, what became of it from the caller."""
    return JobAccount(job_id=job.job_id, name=job.name, user=job.user, **outcome)


def account_from_recovery(
    job: JobSnapshot, result: JobRecoveryResult, checkpoint: CheckpointOutcome | None, incident_id: str
) -> JobAccount:
    """The incident's record of a job its recovery answered for."""
    resumed = result.verify.resumed if result.verify is not None else None
    state = result.verify.state if result.verify is not None else (result.requeue.ended_state if result.requeue else "")
    return _account(
        job,
        fate=result.fate,
        detail=result.detail,
        slurm_state=state,
        caused_by_gpuheal=signalled_then_failed(checkpoint, state),
        checkpoint=checkpoint,
        recovery_id=result.recovery_id,
        joined=bool(result.incidents) and result.incidents[0] != incident_id,
        resumed=resumed,
    )


def account_ended(job: JobSnapshot, now: JobSnapshot | None, checkpoint: CheckpointOutcome | None) -> JobAccount:
    """A job that left the node by itself (or was moved by someone else) during the incident."""
    state = now.state if now is not None else "PURGED"
    caused = signalled_then_failed(checkpoint, state)
    detail = f"ended {state} during the incident" + (
        f" after gpuheal's SIG{checkpoint.signal}" if caused and checkpoint else ""
    )
    if now is not None and now.state not in ENDED_STATES:
        return _account(
            job,
            fate=JobFate.NOT_REQUEUED,
            slurm_state=state,
            detail=f"no longer on the node: {state} ({now.state_reason}), moved by someone else",
            checkpoint=checkpoint,
        )
    return _account(
        job,
        fate=JobFate.ENDED,
        slurm_state=state,
        detail=detail,
        caused_by_gpuheal=caused,
        checkpoint=checkpoint,
    )


def signalled_then_failed(checkpoint: CheckpointOutcome | None, state: str) -> bool:
    """Whether gpuheal may have ended it: it signalled the job, and the job then ended other than
    by completing (a job that traps its signal does not die of it)."""
    return checkpoint is not None and checkpoint.signal is not None and state in ENDED_STATES - {"COMPLETED"}


def unanswered(job: JobSnapshot, recovery_id: str, checkpoint: CheckpointOutcome | None) -> JobAccount:
    return _account(
        job,
        fate=JobFate.UNKNOWN,
        checkpoint=checkpoint,
        recovery_id=recovery_id,
        detail=f"its recovery {recovery_id} has not answered yet (it goes on)",
    )


def recoverable(job: JobSnapshot, now: JobSnapshot | None) -> bool:
    """A job gone from the node during the incident still goes to its recovery when it ended in a
    way a requeue redoes (FAILED, NODE_FAIL...) and may be requeued."""
    return now is not None and job.requeueable and now.state in ABNORMAL_ENDS


def untouched(job: JobSnapshot, checkpoint: CheckpointOutcome | None) -> JobAccount:
    return _account(
        job,
        fate=JobFate.UNTOUCHED,
        checkpoint=checkpoint,
        detail="left running where it was (the incident ended before any requeue)",
    )
