"""Typed inputs and outputs shared by triggers, the workflow and its activities.

Every model here crosses a Temporal boundary (workflow input, activity argument, query result),
so each is a pydantic v2 model carried by the SDK's pydantic data converter. Validation happens
where data enters the system (a CLI flag, a webhook body), so a malformed report is refused
there, with the reason, before any workflow starts.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

# Node and cluster names reach scontrol's command line (as a separate argv element, never through
# a shell); the pattern still refuses anything a Slurm or Kubernetes node name cannot be.
NODE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
NodeName = Annotated[str, StringConstraints(pattern=NODE_NAME_PATTERN)]
ClusterName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{0,39}$")]
OperatorName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")]
_NODE_RE = re.compile(NODE_NAME_PATTERN)


def check_node_name(node: str) -> str:
    """For names that did not come through a model (a provider's answer, a hook's output)."""
    if not _NODE_RE.match(node):
        raise ValueError(f"invalid node name {node!r}")
    return node


# Literals and sets that several layers speak: defined here, once.
Verdict = Literal["approve", "abort"]
Outcome = Literal["resolved", "ignored", "aborted"]
Severity = Literal["info", "warning", "critical"]
# Slurm job states in which a job still holds its nodes (and so can be signalled or requeued).
LIVE_JOB_STATES = frozenset({"RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING"})
# States a requeued job passes through before it is PENDING again (only then does it take updates).
REQUEUE_STATES = frozenset({"REQUEUED", "COMPLETING", "PENDING", "REQUEUE_HOLD", "REQUEUE_FED"})


def _aware(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("timestamp must carry a time zone (for example 2026-11-30T01:02:03Z)")
    return value


AwareDatetime = Annotated[datetime, AfterValidator(_aware)]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ActionClass(StrEnum):
    """What a failure calls for, from least to most disruptive (see gpuheal.policy)."""

    IGNORE = "ignore"
    RESTART_APP = "restart_app"
    RESET_GPU = "reset_gpu"
    REBOOT_NODE = "reboot_node"
    REPLACE_NODE = "replace_node"


class Stage(StrEnum):
    TRIAGE = "triage"
    APPROVAL = "approval"
    NOTIFY = "notify"
    PROTECT = "protect_progress"
    DRAIN = "drain"
    CORDON = "cordon_and_taint"
    REQUEUE = "requeue"
    EVICT = "evict_pods"
    REPAIR = "repair_or_replace"
    VERIFY = "verify_resume"
    RETURN = "return_to_service"
    CLOSE = "close"
    DONE = "done"


class HealthReport(Frozen):
    """One observation that a GPU (or its node) is unhealthy."""

    node: NodeName
    cluster: ClusterName
    xid: int | None = Field(default=None, ge=1, le=999)
    # A non-XID signal, such as "gpu_lost", "ecc_dbe_volatile", "row_remap_failure",
    # "nvlink_down" or "health_check_failed" (see policy.SIGNAL_ACTIONS).
    signal: str | None = Field(default=None, pattern=r"^[a-z0-9_]{1,40}$")
    gpu: int | None = Field(default=None, ge=0, le=63)
    source: str = Field(default="cli", pattern=r"^[a-z0-9_-]{1,32}$")
    observed_at: AwareDatetime
    summary: str = Field(default="", max_length=500)

    @model_validator(mode="after")
    def _xid_or_signal(self) -> HealthReport:
        if self.xid is None and self.signal is None:
            raise ValueError("a report needs an XID or a signal name")
        return self

    def describe(self) -> str:
        what = f"XID {self.xid}" if self.xid is not None else self.signal
        gpu = f" on GPU {self.gpu}" if self.gpu is not None else ""
        return f"{what}{gpu} on {self.cluster}/{self.node}"


class ApprovalPolicy(Frozen):
    """Which action classes wait for a human, for how long, and what happens on silence."""

    required_for: tuple[ActionClass, ...] = ()
    timeout_s: float = Field(default=900.0, gt=0)
    default_on_timeout: Verdict = "abort"


class KubernetesPolicy(Frozen):
    """The Kubernetes half (Slurm on Kubernetes): present when the worker talks to a cluster."""

    # Label on the Kubernetes Node that holds the Slurm node name; None: the names are equal.
    node_label: str | None = Field(default=None, pattern=r"^[A-Za-z0-9./_-]{1,253}$")
    no_execute: bool = False  # also taint NoExecute (evicts pods that do not tolerate it)
    drain_deadline_s: float = Field(default=300.0, gt=0)
    # When a PodDisruptionBudget still blocks an eviction at the deadline: delete the pod
    # anyway (needs rbac-force-delete.yaml), or hold the incident for a human's approve/abort.
    on_pdb_timeout: Literal["delete", "hold"] = "hold"


class RemediationSettings(Frozen):
    """Knobs carried in the workflow input, so each incident's history records its own policy."""

    approval: ApprovalPolicy = ApprovalPolicy()
    kubernetes: KubernetesPolicy | None = None
    checkpoint_grace_s: float = Field(default=30.0, ge=0)
    verify_timeout_s: float = Field(default=1800.0, gt=0)
    # How long a provider may take to repair or replace a node (a cloud VM can take minutes);
    # the repair and replace activities' timeouts are derived from it, so the two always agree.
    provider_timeout_s: float = Field(default=900.0, gt=0)
    gpus_per_node: int = Field(default=8, ge=1)


class RemediationInput(Frozen):
    report: HealthReport
    settings: RemediationSettings = RemediationSettings()


class Decision(Frozen):
    """An operator's approve or abort."""

    operator: OperatorName
    reason: str = Field(min_length=1, max_length=500)


class RecordedDecision(Frozen):
    verdict: Verdict
    operator: str
    reason: str
    at: datetime
    by_timeout: bool = False


class NodeRef(Frozen):
    cluster: ClusterName
    node: NodeName
    incident_id: str


class NodeInfo(Frozen):
    name: str
    state: str
    flags: tuple[str, ...] = ()
    reason: str = ""

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags or self.state in {"drained", "draining"}


class JobProgress(Frozen):
    """What a job last said about its training progress (gpuheal.progress is the contract)."""

    step: int
    checkpoint_step: int
    checkpoint_at: float | None = None
    restart: int = 0


class JobSnapshot(Frozen):
    job_id: int
    name: str
    state: str
    # Flags beside the state (Slurm 23.11+ lists them with it): a requeued job is PENDING with
    # COMPLETING until its old run has ended, and takes no update before that.
    state_flags: tuple[str, ...] = ()
    state_reason: str = ""  # why a pending job waits (Slurm's Reason=, e.g. BeginTime, Resources)
    nodes: str
    node_count: int = 1
    requeueable: bool
    restart_count: int
    excluded_nodes: str = ""
    required_nodes: str = ""
    user: str = ""  # the job's owner (Slurm user name)
    mail_user: str = ""  # --mail-user, where Slurm reports it
    progress: JobProgress | None = None


class DrainRequest(Frozen):
    node: NodeRef
    reason: str = Field(min_length=1, max_length=200)


class DrainResult(Frozen):
    node: str
    drained_by_us: bool
    already_drained: bool
    previous_reason: str = ""


class JobList(Frozen):
    jobs: tuple[JobSnapshot, ...] = ()


class CheckpointRequest(Frozen):
    node: str
    job_ids: tuple[int, ...]


class CheckpointResult(Frozen):
    signalled: tuple[int, ...] = ()


class RequeueRequest(Frozen):
    job: JobSnapshot
    failed_node: NodeName
    exclude_failed_node: bool = True


class RequeueResult(Frozen):
    job_id: int
    requeued: bool
    already_requeued: bool = False
    reason: str = ""
    restart_count_before: int = 0
    step_at_failure: int | None = None
    checkpoint_step: int | None = None
    checkpoint_at: float | None = None
    node_count: int = 1


class RepairRequest(Frozen):
    node: NodeRef
    action: ActionClass


class RepairResult(Frozen):
    action: ActionClass
    # False: the provider cannot do this repair (no such operation on the platform); the
    # workflow then replaces the node instead.
    repaired: bool
    detail: str


class ReplacementResult(Frozen):
    failed_node: str
    new_node: str
    already_done: bool = False


class HealthCheckResult(Frozen):
    node: str
    healthy: bool
    detail: str


class VerifyRequest(Frozen):
    jobs: tuple[RequeueResult, ...]
    avoid_node: str | None
    poll_interval_s: float = 0.5


class ResumedJob(Frozen):
    job_id: int
    node: str
    step: int
    checkpoint_step: int
    restart_count: int
    observed_at: datetime


class VerifyResult(Frozen):
    resumed: tuple[ResumedJob, ...] = ()


class Notification(Frozen):
    incident_id: str
    event: str
    severity: Severity
    message: str
    node: str
    cluster: str


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


class RemediationResult(BaseModel):
    incident_id: str
    cluster: str
    node: str
    action: ActionClass
    outcome: Outcome
    reason: str
    node_state: str
    failure_observed_at: datetime
    closed_at: datetime
    stages: list[StageRecord]
    reports: list[HealthReport]
    decision: RecordedDecision | None = None
    drain: DrainResult | None = None
    jobs_requeued: list[RequeueResult] = []
    jobs_not_requeued: list[UnrequeuedJob] = []
    jobs_resumed: list[ResumedJob] = []
    replacement_node: str | None = None
    mttr_s: float | None = None
    steps_lost: int = 0
    gpu_seconds_lost: float = 0.0


class RemediationStatus(BaseModel):
    """The `status` query: where an incident is and what it has done."""

    incident_id: str
    stage: Stage
    action: ActionClass | None
    awaiting_approval: bool
    stages: list[StageRecord]
    reports_received: int
    done: list[str]
    result: RemediationResult | None = None


class KubeNodeRef(Frozen):
    """A Kubernetes Node that backs a Slurm node, within one incident."""

    slurm_node: NodeName
    kube_node: str = Field(pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
    incident_id: str


class MapNodeRequest(Frozen):
    ref: NodeRef
    node_label: str | None = None


class CordonRequest(Frozen):
    node: KubeNodeRef
    no_execute: bool = False


class CordonResult(Frozen):
    node: str
    cordoned_by_others: bool  # it was unschedulable before we came: never uncordon it
    already_done: bool


class EvictRequest(Frozen):
    node: KubeNodeRef
    deadline_s: float
    delete_when_blocked: bool = False
    poll_interval_s: float = 1.0


class EvictResult(Frozen):
    evicted: tuple[str, ...]
    kept: tuple[str, ...]  # DaemonSet and mirror pods stay
    blocked: tuple[str, ...]  # still protected by a PodDisruptionBudget at the deadline
    deleted: tuple[str, ...] = ()
    retries_429: int = 0


class KubeEvent(Frozen):
    node: KubeNodeRef
    reason: str = Field(pattern=r"^[A-Za-z]{1,64}$")
    message: str = Field(max_length=1000)
    warning: bool = False
