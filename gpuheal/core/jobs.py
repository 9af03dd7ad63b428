"""The job side of an incident: the models of a job recovery.

An incident hands each affected job to a *job recovery* (workflows/job_recovery.py, one per
failure of a job), which requeues it once however many of its nodes failed, verifies it resumed
across all its new nodes, keeps the job's retry budget and tells its owner. The incident's own
account of each job (JobAccount, JobFate) is in gpuheal.core.models, beside the incident's result.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from gpuheal.core.models.base import Frozen, NodeName
from gpuheal.core.models.incident import JobRecoverySettings
from gpuheal.core.models.result import JobFate, ResumedJob
from gpuheal.core.models.slurm import CheckpointOutcome, JobSnapshot, RequeueResult

# Slurm states a job does not leave by itself: it is over.
ENDED_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
)
# Ends that lose work a requeue can redo (COMPLETED finished its work; CANCELLED was someone's wish).
ABNORMAL_ENDS = frozenset({"FAILED", "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY"})

OwnerEvent = Literal["job_hit", "job_running_again", "job_not_resumed", "job_held"]


class RecoveryJoin(Frozen):
    """An incident handing a job to its recovery (the signal that starts or joins it)."""

    incident_id: str
    cluster: str
    failed_node: NodeName
    what: str  # the failure, for the owner ("XID 79 on GPU 3 on prod/gpu01")
    failure_at: datetime  # when the failure was observed
    job: JobSnapshot  # as the incident saw it before anything was done
    checkpoint: CheckpointOutcome | None = None
    exclude_failed_node: bool = True


class JobRecoveryInput(Frozen):
    cluster: str
    job_id: int
    settings: JobRecoverySettings = JobRecoverySettings()


class RecoveryHandoff(Frozen):
    """What handing a job over returned: the recovery's id, and its result when it had already
    ended (an activity retried after the recovery finished gets the answer, not a second run)."""

    recovery_id: str
    result: JobRecoveryResult | None = None


class PastRecovery(Frozen):
    """A recovery of the same job found in Temporal's visibility (its memo)."""

    recovery_id: str
    started_at: datetime
    requeued: bool
    failed_nodes: tuple[str, ...] = ()
    avoided_nodes: tuple[str, ...] = ()  # excluded for an open incident there (RequeueResult.avoided)


class JobHistoryRequest(Frozen):
    cluster: str
    job_id: int
    since: datetime
    exclude_id: str = ""  # the asking recovery itself


class JobHistory(Frozen):
    recoveries: tuple[PastRecovery, ...] = ()


class RetryBudget(Frozen):
    used: int
    allowed: int
    window_s: float
    suspects: tuple[str, ...] = ()  # the nodes it failed on within the window
    avoided: tuple[str, ...] = ()  # nodes its recoveries excluded for another incident open there

    @property
    def spent(self) -> bool:
        return self.used >= self.allowed


class VerifyJobRequest(Frozen):
    requeue: RequeueResult
    avoid_nodes: tuple[str, ...] = ()  # the nodes it was requeued away from
    deadline_at: float  # unix time: a silent job's verification ends here at the latest
    # Once it runs again, it has this long to train past its checkpoint (a wait in Slurm for a
    # replacement and its burn-in is not its own slowness). None: deadline_at alone (before this release).
    run_for_s: float | None = None
    poll_interval_s: float = 0.5

    def silent_at(self, running_since: float | None) -> float:
        """When a job that has not resumed is called silent: `run_for_s` after it runs again."""
        if self.run_for_s is None or running_since is None:
            return self.deadline_at
        return min(self.deadline_at, running_since + self.run_for_s)


class VerifyOutcome(Frozen):
    job_id: int
    # on_failed_node: it runs again on a node it was requeued away from (an exclusion lost, or
    # the node resumed by hand): not resumed, and said so, never an error.
    outcome: Literal["resumed", "died", "silent", "on_failed_node"]
    state: str = ""  # Slurm's state at the end
    reason: str = ""
    resumed: ResumedJob | None = None


class HoldRequest(Frozen):
    job_id: int
    failed_node: NodeName
    reason: str


class OwnerNotice(Frozen):
    """What a job's owner hears, once per job per stage of its recovery."""

    key: str  # "<recovery id>:<job>:<event>": the Idempotency-Key
    event: OwnerEvent
    cluster: str
    job_id: int
    job_name: str
    user: str
    account: str = ""  # the job's Slurm account: a team's chat route
    mail_user: str = ""  # --mail-user (Slurm's default: the user's name)
    recipients: tuple[str, ...]  # the Slurm user, --mail-user, the progress line's notify=
    nodes: tuple[str, ...]  # the failed nodes (hit), or where it runs again
    message: str
    steps_at_risk: int | None = None
    step: int | None = None
    steps_lost: int | None = None
    gpu_seconds_lost: float | None = None


class JobRecoveryResult(Frozen):
    recovery_id: str
    job_id: int
    job_name: str
    user: str
    fate: JobFate
    detail: str
    incidents: tuple[str, ...]
    failed_nodes: tuple[str, ...]
    requeue: RequeueResult | None = None
    verify: VerifyOutcome | None = None
    budget: RetryBudget | None = None
    steps_lost: int = 0
    gpu_seconds_lost: float = 0.0
    owner_notices: tuple[str, ...] = ()  # the events its owner was told


class JobRecoveryStatus(Frozen):
    """The `status` query of a job recovery."""

    recovery_id: str
    job_id: int
    stage: Literal["gathering", "deciding", "requeueing", "verifying", "answering", "done"]
    incidents: tuple[str, ...]
    result: JobRecoveryResult | None = None


RecoveryHandoff.model_rebuild()
