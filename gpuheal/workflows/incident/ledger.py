"""The ledger of the node's jobs: every job that was on the node, and what became of each.

Pure bookkeeping (no activity, no timer): the workflow records what it learns, and the ledger
answers which jobs go to a recovery and each job's account at the close. That every job on a
failed node is accounted for is decided here, in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from gpuheal.core import job_policy
    from gpuheal.core.jobs import JobRecoveryResult
    from gpuheal.core.models.result import JobAccount, JobFate, ResumedJob, UnrequeuedJob
    from gpuheal.core.models.slurm import CheckpointOutcome, JobSnapshot, RequeueResult


@dataclass
class JobLedger:
    affected: list[JobSnapshot] = field(default_factory=list)  # on the node, in the order found
    checkpoints: dict[int, CheckpointOutcome] = field(default_factory=dict)
    settled: dict[int, JobAccount] = field(default_factory=dict)  # ended on their own: no recovery
    recoveries: dict[str, int] = field(default_factory=dict)  # recovery id -> its job, in order
    recovered: dict[str, JobRecoveryResult] = field(default_factory=dict)  # their answers

    def found(self, jobs: Sequence[JobSnapshot]) -> None:
        """The jobs on the node now are the incident's to account for."""
        self.affected = list(jobs)

    def found_late(self, job: JobSnapshot) -> None:
        """A job that started on the node after the incident first looked (or on a borrowed node)."""
        if job.job_id not in {j.job_id for j in self.affected}:
            self.affected.append(job)

    def sort_out(
        self, live: Sequence[JobSnapshot], ended: Sequence[JobSnapshot], now: Sequence[JobSnapshot]
    ) -> list[JobSnapshot]:
        """At the requeue: the jobs still on the node, and the ones that left but can be
        recovered, go to a recovery (returned, in order); the others are settled with how they
        ended. `ended` are the affected jobs no longer on the node, `now` what Slurm says of them."""
        now_by_id = {j.job_id: j for j in now}
        to_recover = list(live)
        for job in ended:
            current = now_by_id.get(job.job_id)
            if job_policy.recoverable(job, current):
                to_recover.append(job)
            else:
                self.settled[job.job_id] = job_policy.account_ended(job, current, self.checkpoints.get(job.job_id))
        return to_recover

    def handed_over(self, recovery_id: str, job_id: int, answer: JobRecoveryResult | None) -> None:
        self.recoveries[recovery_id] = job_id
        if answer is not None:  # it had already answered (a retried hand-over)
            self.recovered[recovery_id] = answer

    def answered(self, result: JobRecoveryResult) -> None:
        self.recovered.setdefault(result.recovery_id, result)

    def all_answered(self) -> bool:
        return set(self.recoveries) <= set(self.recovered)

    def accounts(self, incident_id: str) -> list[JobAccount]:
        """Every job that was on the node, in the order found, with its fate (from its latest
        recovery: a job moved off a borrowed node has two)."""
        latest = {job_id: recovery for recovery, job_id in self.recoveries.items()}
        accounts = []
        for job in self.affected:
            checkpoint = self.checkpoints.get(job.job_id)
            recovery = latest.get(job.job_id)
            if job.job_id in self.settled:
                accounts.append(self.settled[job.job_id])
            elif recovery is not None and recovery in self.recovered:
                result = self.recovered[recovery]
                accounts.append(job_policy.account_from_recovery(job, result, checkpoint, incident_id))
            elif recovery is not None:
                accounts.append(job_policy.unanswered(job, recovery, checkpoint))
            else:  # the incident stopped before the requeue stage (aborted, ignored): untouched
                accounts.append(job_policy.untouched(job, checkpoint))
        return accounts

    def requeues(self) -> list[RequeueResult]:
        return [r.requeue for r in self.recovered.values() if r.requeue is not None and r.requeue.requeued]


def resumed(accounts: Sequence[JobAccount]) -> list[ResumedJob]:
    return [a.resumed for a in accounts if a.resumed is not None]


def not_requeued(accounts: Sequence[JobAccount]) -> list[UnrequeuedJob]:
    return [UnrequeuedJob(job_id=a.job_id, reason=a.detail) for a in accounts if a.fate != JobFate.REQUEUED]


def not_back(accounts: Sequence[JobAccount]) -> bool:
    """Some job was not requeued, or has not been seen training again."""
    return any(a.fate != JobFate.REQUEUED or a.resumed is None for a in accounts)
