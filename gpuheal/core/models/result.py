"""How an incident ends and what it tells: resumed jobs, notifications, stage records, every job's
fate, the result and the status a query returns.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, model_validator

from gpuheal.core.models.base import ActionClass, Frozen, NodeState, Outcome, Severity, Stage
from gpuheal.core.models.incident import RecordedDecision
from gpuheal.core.models.report import HealthReport
from gpuheal.core.models.slurm import CheckpointOutcome, DrainResult, RequeueResult
from gpuheal.core.rma import RmaEvidence


class ResumedJob(Frozen):
    job_id: int
    node: str
    step: int
    checkpoint_step: int
    restart_count: int
    observed_at: datetime
    # False: the job publishes no progress, so RUNNING again (elsewhere) is all that was checked
    progress_checked: bool = True


class Notification(Frozen):
    incident_id: str
    event: str
    severity: Severity
    message: str
    node: str
    cluster: str
    # The receiver's Idempotency-Key: one per event per incident *run* (an incident id names a
    # node, and its next failure must not be dropped as a repeat). Empty from earlier releases.
    key: str = ""


class StageRecord(BaseModel):
    stage: Stage
    started_at: datetime
    ended_at: datetime | None = None
    outcome: str = ""

    @property
    def duration_s(self) -> float | None:
        if self.ended_at is None:
            return None
        return (self.ended_at - self.started_at).total_seconds()


class UnrequeuedJob(Frozen):
    job_id: int
    reason: str


class JobFate(StrEnum):
    REQUEUED = "requeued"  # requeued; `resumed` says whether it trained past its checkpoint again
    NOT_REQUEUED = "not_requeued"  # Slurm may not requeue it (--no-requeue, pinned...): detail says why
    ENDED = "ended"  # it ended during the incident (its state; whether gpuheal caused it)
    HELD = "held"  # its retry budget is spent: held in Slurm, owner told, suspects listed
    UNKNOWN = "unknown"  # its recovery did not answer within the bound (recovery_id says where to look)
    UNTOUCHED = "untouched"  # left running where it was: the incident ended before any requeue


class JobAccount(Frozen):
    """One job that was on the node when the incident began, and what became of it."""

    job_id: int
    name: str
    user: str
    fate: JobFate
    detail: str
    slurm_state: str = ""
    caused_by_gpuheal: bool = False
    checkpoint: CheckpointOutcome | None = None
    recovery_id: str | None = None
    joined: bool = False  # another incident started the job's recovery; this one joined it
    resumed: ResumedJob | None = None


class RemediationResult(BaseModel):
    incident_id: str
    cluster: str
    node: str
    action: ActionClass
    outcome: Outcome
    reason: str
    node_state: NodeState
    node_detail: str
    failure_observed_at: datetime
    closed_at: datetime
    stages: list[StageRecord]
    reports: list[HealthReport]
    decision: RecordedDecision | None = None
    drain: DrainResult | None = None
    jobs: list[JobAccount] = []  # every job on the node when the incident began
    jobs_requeued: list[RequeueResult] = []
    jobs_not_requeued: list[UnrequeuedJob] = []
    jobs_resumed: list[ResumedJob] = []
    borrowed_node: str | None = None  # a node borrowed from inference meanwhile (and given back)
    mode: str = ""  # the cluster's mode it ran under (observe, approve, auto)
    policy_version: int | None = None  # and the version of the cluster's policy
    replacement_node: str | None = None
    rma: RmaEvidence | None = None  # a replaced, failed or repeat-offending board: for the vendor
    # An application fault that recurred across different jobs drained the node for a burn-in
    # (gpuheal.core.app_faults): its verdict. A passed one clears the GPU's count.
    burn_in: Literal["passed", "failed"] | None = None
    mttr_s: float | None = None
    steps_lost: int = 0
    gpu_seconds_lost: float = 0.0

    @model_validator(mode="before")
    @classmethod
    def _words_only(cls, data: Any) -> Any:
        """Results closed by a release before NodeState held the node's words in node_state."""
        if isinstance(data, dict) and "node_detail" not in data and "node_state" in data:
            legacy = str(data["node_state"])
            known = legacy in NodeState.__members__.values()
            return {**data, "node_state": legacy if known else NodeState.UNKNOWN, "node_detail": legacy}
        return data


class RemediationStatus(BaseModel):
    """The `status` query: where an incident is and what it has done."""

    incident_id: str
    stage: Stage
    action: ActionClass | None
    awaiting_approval: bool
    held: str | None = None  # why it waits for capacity, and its place in line
    stages: list[StageRecord]
    reports_received: int
    done: list[str]
    result: RemediationResult | None = None
