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
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from gpuheal.core.envvars import section, setting
from gpuheal.core.rma import RmaEvidence

# Node and cluster names reach scontrol's command line (as a separate argv element, never through
# a shell); the pattern still refuses anything a Slurm or Kubernetes node name cannot be.
NODE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
NodeName = Annotated[str, StringConstraints(pattern=NODE_NAME_PATTERN)]
CLUSTER_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,39}$"
ClusterName = Annotated[str, StringConstraints(pattern=CLUSTER_NAME_PATTERN)]
OperatorName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")]
# A GPU board's serial and PCI bus id (reports, visibility queries, `gpuheal history --serial`).
GPU_SERIAL_PATTERN = r"^[A-Za-z0-9-]{1,64}$"
PCI_BUS_ID_PATTERN = r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(\.[0-7])?$"
_NODE_RE = re.compile(NODE_NAME_PATTERN)
_CLUSTER_RE = re.compile(CLUSTER_NAME_PATTERN)


def check_node_name(node: str) -> str:
    """For names that did not come through a model (a provider's answer, a hook's output)."""
    if not _NODE_RE.match(node):
        raise ValueError(f"invalid node name {node!r}")
    return node


def check_cluster_name(cluster: str) -> str:
    if not _CLUSTER_RE.match(cluster):
        raise ValueError(f"invalid cluster name {cluster!r}")
    return cluster


# Literals and sets that several layers speak: defined here, once.
Verdict = Literal["approve", "abort"]
# How an incident ends: resolved (capacity back, its jobs accounted for), ignored (nothing to
# do), aborted (by an operator), no_capacity (the node is drained and out, no replacement came
# within the bound; its jobs wait in Slurm without it), observed (observe mode: what it would
# have done is in its history; nothing touched), escalated (its domain incident handles the
# node with the rest of its domain), not_granted (held past the bound: the budget never freed),
# already_replaced (a late report for a node gpuheal replaced earlier: the result names by which
# node and in which incident; nothing touched), failed_validation (repaired, but its GPUs failed
# the validation run before it would take jobs: drained and out, for the vendor).
Outcome = Literal[
    "resolved",
    "ignored",
    "aborted",
    "no_capacity",
    "observed",
    "escalated",
    "not_granted",
    "already_replaced",
    "failed_validation",
]
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
    """What a failure calls for, from least to most disruptive (see gpuheal.core.policy)."""

    IGNORE = "ignore"
    RESTART_APP = "restart_app"
    RESET_GPU = "reset_gpu"
    REBOOT_NODE = "reboot_node"
    REPLACE_NODE = "replace_node"


class Stage(StrEnum):
    TRIAGE = "triage"
    OBSERVE = "observe"
    HELD = "held"
    APPROVAL = "approval"
    NOTIFY = "notify"
    PROTECT = "protect_progress"
    DRAIN = "drain"
    CORDON = "cordon_and_taint"
    REQUEUE = "requeue"
    EVICT = "evict_pods"
    REPAIR = "repair_or_replace"
    AWAITING_CAPACITY = "awaiting_capacity"
    BORROW = "borrow_node"
    VALIDATE = "validate_new_node"
    VERIFY = "verify_resume"
    GIVE_BACK = "give_back_borrowed"
    RETURN = "return_to_service"
    CLOSE = "close"
    DONE = "done"


class NodeState(StrEnum):
    """Where the failed node stands when its incident closes; the result's node_detail says it in
    words (gpuheal.core.render). Dashboards and tests read the state, people read the detail."""

    UNTOUCHED = "untouched"  # nothing was done to it (ignored, observed, aborted before the drain)
    IN_SERVICE = "in_service"  # the action needed no drain (restart the app)
    DRAINED = "drained"  # drained by this incident and left so (aborted, not granted): a person resumes it
    BLOCKED = "blocked"  # drained and cordoned, pods a PodDisruptionBudget protects still on it
    ESCALATED = "escalated"  # its domain incident handles it with the rest of its domain
    AWAITING_REPLACEMENT = "awaiting_replacement"  # drained and out, no capacity for a replacement
    RETURNED = "returned"  # repaired, health check passed, back in service
    LEFT_DRAINED = "left_drained"  # repaired, but someone else drained it before us: left as they had it
    REPLACED = "replaced"  # out of the cluster, a new node in its place
    FAILED_VALIDATION = "failed_validation"  # repaired, its GPUs failed validation: drained and out
    ALREADY_REPLACED = "already_replaced"  # gone before this (late) report: an earlier incident replaced it
    UNKNOWN = "unknown"  # recorded by a release before the states were named (its detail has the words)


class NodeAt(NamedTuple):
    """A node state and its words, decided together (gpuheal.core.render)."""

    state: NodeState
    detail: str


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
    # An Alertmanager alert's identity (fingerprint@startsAt): the same alert re-sent starts nothing.
    alert_key: str | None = Field(default=None, pattern=r"^[A-Za-z0-9@:+._-]{1,100}$")
    gpu_uuid: str | None = Field(default=None, pattern=r"^[A-Za-z0-9-]{1,64}$")  # a GPU's record follows it
    # The board's serial (what a vendor's RMA asks for; it survives re-imaging and node renames)
    # and its PCI bus id; the kernel's own line for the failure, verbatim.
    gpu_serial: str | None = Field(default=None, pattern=GPU_SERIAL_PATTERN)
    pci_bus_id: str | None = Field(default=None, pattern=PCI_BUS_ID_PATTERN)
    kernel_log: str = Field(default="", max_length=1000)

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

    required_for: tuple[ActionClass, ...] = setting(
        "GPUHEAL_APPROVAL_REQUIRED",
        (),
        "comma list of action classes that wait for a human (`replace_node,reboot_node`)",
    )
    timeout_s: float = setting("GPUHEAL_APPROVAL_TIMEOUT_S", 900.0, "how long to wait for approve / abort", gt=0)
    default_on_timeout: Verdict = setting(
        "GPUHEAL_APPROVAL_DEFAULT", "abort", "what silence means: `abort` or `approve`"
    )


class KubernetesPolicy(Frozen):
    """The Kubernetes half (Slurm on Kubernetes): present when the worker talks to a cluster."""

    node_label: str | None = setting(
        "GPUHEAL_K8S_NODE_LABEL",
        None,
        "Node label that holds the Slurm node name",
        unset="none: the names are equal",
        pattern=r"^[A-Za-z0-9./_-]{1,253}$",
    )
    no_execute: bool = setting(
        "GPUHEAL_K8S_NO_EXECUTE", False, "`1`: also taint NoExecute (evicts pods that do not tolerate it)"
    )
    drain_deadline_s: float = setting(
        "GPUHEAL_K8S_DRAIN_DEADLINE_S", 300.0, "how long PDB-blocked evictions are retried", gt=0
    )
    on_pdb_timeout: Literal["delete", "hold"] = setting(
        "GPUHEAL_K8S_ON_PDB_TIMEOUT",
        "hold",
        "then: `hold` the incident for a human's approve/abort, or `delete` the pod anyway "
        "(needs rbac-force-delete.yaml)",
    )


class BorrowPolicy(Frozen):
    """When no spare exists: borrow a GPU node from an inference pool in Kubernetes, never taking
    a Deployment there below its PodDisruptionBudget or below `floor` ready replicas."""

    pool: str = Field(
        pattern=r"^[A-Za-z0-9._-]{1,63}$",
        description="no spare: borrow a node from the inference pool with this `gpuheal.io/pool` label",
        json_schema_extra={"env": "GPUHEAL_BORROW_POOL", "unset": "none: no borrowing"},
    )
    floor: int = setting(
        "GPUHEAL_BORROW_FLOOR", 1, "never take an inference Deployment below this many ready replicas", ge=0
    )
    give_back_wait_s: float = setting(
        "GPUHEAL_BORROW_GIVE_BACK_WAIT_S",
        86400.0,
        "how long a borrowed node may wait, drained, for its last jobs to leave before it goes back"
        " (it never goes back with a job on it: past this, a person decides)",
        gt=0,
    )


# Declared once, held twice: by the incident's settings and by the job recovery's it passes on.
def _verify_timeout_s() -> Any:
    return setting(
        "GPUHEAL_VERIFY_TIMEOUT_S", 1800.0, "how long a requeued job may take to train past its checkpoint", gt=0
    )


def _gpus_per_node() -> Any:
    return setting("GPUHEAL_GPUS_PER_NODE", 8, "GPUs per node, for the GPU-time-lost figure", ge=1)


class JobRecoverySettings(Frozen):
    gather_s: float = setting(
        "GPUHEAL_JOB_GATHER_S", 2.0, "a job recovery waits this long for incidents on the job's other nodes", ge=0
    )
    verify_timeout_s: float = _verify_timeout_s()
    retry_budget: int = setting("GPUHEAL_JOB_RETRY_BUDGET", 3, "requeues by gpuheal of one job ...", ge=1)
    retry_window_s: float = setting(
        "GPUHEAL_JOB_RETRY_WINDOW_S", 24 * 3600.0, "... within this window; one more failure holds the job", gt=0
    )
    gpus_per_node: int = _gpus_per_node()


class RemediationSettings(Frozen):
    """The worker's configuration of how remediation runs (timeouts, grace, Kubernetes): the
    incident reads it from the worker when it is admitted, so its history records it. The
    cluster's policy (mode, budget, approval, breaker) is the coordinator's: gpuheal.core.fleet."""

    kubernetes: KubernetesPolicy | None = section(only_with=("GPUHEAL_KUBECONFIG", "GPUHEAL_K8S_IN_CLUSTER"))
    borrow: BorrowPolicy | None = section(only_with=("GPUHEAL_BORROW_POOL",))
    checkpoint_grace_s: float = setting(
        "GPUHEAL_CHECKPOINT_GRACE_S", 30.0, "at most this long for each signalled job to confirm a checkpoint", ge=0
    )
    checkpoint_unconfirmed_wait_s: float = setting(
        "GPUHEAL_CHECKPOINT_UNCONFIRMED_WAIT_S",
        5.0,
        "a signalled job that publishes no progress is waited for this long",
        ge=0,
    )
    verify_timeout_s: float = _verify_timeout_s()
    # No spare: retry the replacement every capacity_retry_s, for at most capacity_wait_s.
    capacity_wait_s: float = setting(
        "GPUHEAL_CAPACITY_WAIT_S", 1800.0, "no spare: how long to keep trying for a replacement", gt=0
    )
    capacity_retry_s: float = setting("GPUHEAL_CAPACITY_RETRY_S", 60.0, "... and how often", gt=0)
    jobs: JobRecoverySettings = JobRecoverySettings()
    # The repair and replace activities' timeouts are derived from it, so the two always agree.
    provider_timeout_s: float = setting(
        "GPUHEAL_PROVIDER_TIMEOUT_S", 900.0, "how long a provider may take to repair or replace a node", gt=0
    )
    gpus_per_node: int = _gpus_per_node()
    # Before a repaired node takes jobs again: a burn-in job through Slurm on it, in a maintenance
    # reservation only gpuheal's user may use (the provider's health check alone says "Ready").
    validate_job: str | None = setting(
        "GPUHEAL_VALIDATE_JOB",
        None,
        "a batch script Slurm runs on a repaired or new node before it takes jobs (exit 0: its GPUs pass;"
        " e.g. `dcgmi diag -r 2`)",
        unset="no burn-in: the provider's health check only",
    )
    validate_timeout_s: float = setting(
        "GPUHEAL_VALIDATE_TIMEOUT_S", 1800.0, "how long the validation may run before it counts as failed", gt=0
    )


class RemediationInput(Frozen):
    """A report says what failed, never how to remediate: the policy is the cluster's."""

    report: HealthReport


class Decision(Frozen):
    """An operator's approve or abort."""

    operator: OperatorName
    reason: str = Field(min_length=1, max_length=500)


POLICY_OPERATOR = "gpuheal-policy"  # who decided when no person did in time (the policy's default)


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


class ValidateRequest(Frozen):
    node: NodeRef
    job: str  # the batch script
    timeout_s: float


class ValidationResult(Frozen):
    passed: bool
    detail: str
    job_id: int | None = None
    by_others: bool = False  # someone else drained it meanwhile: no verdict, theirs to decide


class NodeInfo(Frozen):
    name: str
    state: str
    flags: tuple[str, ...] = ()
    reason: str = ""
    partitions: tuple[str, ...] = ()

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags or self.state in {"drained", "draining"}


class JobProgress(Frozen):
    """What a job last said about its training progress (gpuheal.core.progress is the contract)."""

    step: int
    checkpoint_step: int
    checkpoint_at: float | None = None
    restart: int = 0
    signal: str | None = None  # the signal that makes it checkpoint now (its opt-in), e.g. USR1
    notify: str | None = None  # where its owner wants to hear (beside the Slurm user)


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
    account: str = ""  # the Slurm account the job runs under (a team, for owner routes)
    submit_time: int = 0  # unix time (with the id and restart count: one failure of one job)
    submit_line: str = ""  # the sbatch command line, where Slurm reports it (26.05+): --signal
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


class CheckpointAsk(Frozen):
    """One job asked to checkpoint now, with the signal it asked for."""

    job_id: int
    signal: str = Field(pattern=r"^[A-Z0-9]{2,8}$")  # e.g. USR1
    batch_only: bool = True  # the batch script (B: in --signal, and the progress contract), else its steps
    signalled_at: float = 0.0  # unix time just before the signal went


class CheckpointRequest(Frozen):
    node: str
    asks: tuple[CheckpointAsk, ...]


class CheckpointSent(Frozen):
    asks: tuple[CheckpointAsk, ...] = ()  # those signalled (still running), with the time


class CheckpointOutcome(Frozen):
    job_id: int
    signal: str | None  # None: not signalled (it did not say it handles a signal)
    confirmed: bool
    step: int | None = None
    after_s: float = 0.0
    detail: str


class CheckpointWait(Frozen):
    asks: tuple[CheckpointAsk, ...]
    deadline_at: float  # unix time: the grace ends here, confirmed or not
    unconfirmed_wait_s: float  # a job that publishes no progress is not waited for longer
    poll_interval_s: float = 0.2


class CheckpointResult(Frozen):
    outcomes: tuple[CheckpointOutcome, ...] = ()


class RequeueRequest(Frozen):
    job: JobSnapshot
    failed_node: NodeName
    also_failed: tuple[NodeName, ...] = ()  # the job's other failed nodes (a multi-node job)
    exclude_failed_node: bool = True
    # Nodes gpuheal excluded for this job after earlier failures: let back in where healthy again.
    release_nodes: tuple[NodeName, ...] = ()


class RequeueResult(Frozen):
    job_id: int
    requeued: bool
    already_requeued: bool = False
    reason: str = ""
    ended_state: str = ""  # it had ended (COMPLETED, FAILED, ...) before it could be requeued
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
    new_node: str | None  # None: no capacity now (no_capacity says why)
    already_done: bool = False
    no_capacity: str = ""
    # What the search for a new node needs on its next try, once the failed node is gone: the
    # pool it comes from and when the search began (a node made meanwhile still counts).
    pool: str | None = None
    since: datetime | None = None
    failed_uid: str | None = None  # the failed Node's UID: a new Node under its name is not it
    rejected: tuple[str, ...] = ()  # new nodes this run took that failed their GPU validation: never again

    def search(self) -> dict[str, Any]:
        """What the next try goes on from."""
        return self.model_dump(include=set(SEARCH_FIELDS))


SEARCH_FIELDS = ("pool", "since", "failed_uid", "rejected")  # a replacement's memory, from try to try


class ReplaceRequest(NodeRef):
    """A NodeRef (what earlier releases sent), plus the last try's pool, start and failed UID,
    and, where GPU validation is on, the burn-in's bound: the new node is held out of service
    (a maintenance reservation) from before it joins until its burn-in passes."""

    pool: str | None = None
    since: datetime | None = None
    failed_uid: str | None = None
    rejected: tuple[str, ...] = ()
    hold_for_validation_s: float | None = None

    def earlier(self) -> ReplacementResult | None:
        """The last try's search, for the provider; None on the first try."""
        memory = self.model_dump(include=set(SEARCH_FIELDS))
        if not any(memory.values()):
            return None
        return ReplacementResult(failed_node=self.node, new_node=None, **memory)


class EarlierReplacement(Frozen):
    """An earlier incident of this node replaced it (the most recent that did)."""

    node: str
    replacement_node: str
    incident_id: str
    run_id: str
    closed_at: datetime


class ReplacementLookup(Frozen):
    """What the incident history says of a node Slurm no longer has in service."""

    earlier: EarlierReplacement | None = None


class HealthCheckResult(Frozen):
    node: str
    healthy: bool
    detail: str


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


class BorrowRequest(Frozen):
    """Take a node from an inference pool for training, within the inference side's minimum."""

    incident_id: str
    failed: KubeNodeRef  # the failed training node: the borrowed node joins its pool
    policy: BorrowPolicy
    deadline_s: float = Field(default=120.0, gt=0)  # for the evictions (a PDB may hold them a while)


class BorrowResult(Frozen):
    node: str | None  # None: nothing could be borrowed (why says why)
    why: str = ""
    evicted: tuple[str, ...] = ()
    from_pool: str = ""
    already_done: bool = False


class BorrowedNode(Frozen):
    incident_id: str
    node: NodeName  # the Kubernetes node, and the Slurm node of the same name
    from_pool: str = ""


class NodeEmptyWait(Frozen):
    node: NodeName
    deadline_at: float  # unix time
    poll_s: float = Field(default=0.5, gt=0)  # a wait of hours asks Slurm less often
