"""The activity boundary: every activity's name, its one input model and its output, in one place.

The workflows call activities through these references (``workflow.execute_activity`` by name,
typed by ``Activity[I, O]``), so it never imports the implementations and with them the Slurm,
Kubernetes and HTTP clients. The implementations (activities/remediation.py,
activities/kubernetes.py) and the tests' stand-ins (tests/fakes.py) declare themselves with
``@implements(REF)``; tests/test_layers.py checks that every implementation's signature
matches its reference. The workflows' own names and messages are declared the same way, in
gpuheal.core.messages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from temporalio import activity

from gpuheal.core.app_faults import AppFaults, AppFaultsRequest
from gpuheal.core.fleet.models import (
    AdmitAnswer,
    AdmitAsk,
    CapacityDecision,
    CapacityRequest,
    DomainDecisionFor,
    DomainIncident,
    OpenIncidents,
    ReleaseRequest,
    RunRefs,
)
from gpuheal.core.jobs import (
    HoldRequest,
    JobHistory,
    JobHistoryRequest,
    OwnerNotice,
    RecoveryHandoff,
    RecoveryJoin,
    VerifyJobRequest,
    VerifyOutcome,
)
from gpuheal.core.models.kubernetes import (
    BorrowedGiveBack,
    BorrowedNode,
    BorrowRequest,
    BorrowResult,
    CordonRequest,
    CordonResult,
    EvictRequest,
    EvictResult,
    KubeEvent,
    KubeNodeRef,
    MapNodeRequest,
    NodeEmptyWait,
    RejectNodeRequest,
)
from gpuheal.core.models.replacement import (
    HealthCheckResult,
    RepairRequest,
    RepairResult,
    ReplacementLookup,
    ReplacementResult,
    ReplaceRequest,
)
from gpuheal.core.models.result import Notification, RemediationResult
from gpuheal.core.models.slurm import (
    CheckpointRequest,
    CheckpointResult,
    CheckpointSent,
    CheckpointWait,
    DrainRequest,
    DrainResult,
    JobList,
    NodeInfo,
    NodeRef,
    RequeueRequest,
    RequeueResult,
    ValidateRequest,
    ValidationResult,
)
from gpuheal.core.rma import RmaEvidence, RmaRequest

I = TypeVar("I")  # noqa: E741  (input, output: the usual names for an activity's two types)
O = TypeVar("O")  # noqa: E741
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Activity(Generic[I, O]):
    name: str
    input: type[I]
    output: type[O]


def implements(ref: Activity[Any, Any]) -> Callable[[F], F]:
    """Register a function or method as the implementation of `ref` (its Temporal name)."""

    def register(fn: F) -> F:
        return activity.defn(name=ref.name)(fn)

    return register


def implementations(*served: object) -> dict[str, Callable[..., Any]]:
    """Every activity the given objects (or classes) implement, by its Temporal name: collected from
    their `@implements` methods, so a worker registers what its classes declare, never a hand list."""
    found: dict[str, Callable[..., Any]] = {}
    for obj in served:
        for attr in dir(obj):
            fn = getattr(obj, attr)
            defn = getattr(fn, "__temporal_activity_definition", None)
            if defn is not None:
                if defn.name in found:
                    raise ValueError(f"activity {defn.name} is implemented twice")
                found[defn.name] = fn
    return found


# --- Slurm nodes, providers, notifications (activities/remediation.py) -----------------------
LOOK_UP_SLURM_NODE = Activity("look_up_slurm_node", NodeRef, NodeInfo)
FIND_EARLIER_REPLACEMENT = Activity("find_earlier_replacement", NodeRef, ReplacementLookup)
NOTIFY_OPERATORS = Activity("notify_operators", Notification, type(None))
LIST_JOBS_ON_NODE = Activity("list_jobs_on_node", NodeRef, JobList)
DRAIN_SLURM_NODE = Activity("drain_slurm_node", DrainRequest, DrainResult)
REPAIR_NODE = Activity("repair_node", RepairRequest, RepairResult)
REPLACE_NODE = Activity("replace_node", ReplaceRequest, ReplacementResult)
CHECK_NODE_HEALTH = Activity("check_node_health", NodeRef, HealthCheckResult)
RESUME_SLURM_NODE = Activity("resume_slurm_node", NodeRef, str)
VALIDATE_NODE_GPUS = Activity("validate_node_gpus", ValidateRequest, ValidationResult)
DECOMMISSION_NODE = Activity("decommission_node", NodeRef, str)
RECORD_INCIDENT_METRICS = Activity("record_incident_metrics", RemediationResult, type(None))
ADOPT_BORROWED_NODE = Activity("adopt_borrowed_node", BorrowedNode, str)
RELEASE_BORROWED_NODE = Activity("release_borrowed_node", BorrowedNode, str)

# --- jobs: checkpoint, requeue, verify, owners, recoveries (activities/jobs.py) -------------
REQUEST_CHECKPOINT = Activity("request_checkpoint", CheckpointRequest, CheckpointSent)
WAIT_FOR_CHECKPOINTS = Activity("wait_for_checkpoints", CheckpointWait, CheckpointResult)
FIND_JOBS = Activity("find_jobs", JobList, JobList)
WAIT_FOR_NODE_EMPTY = Activity("wait_for_node_empty", NodeEmptyWait, JobList)
REQUEUE_SLURM_JOB = Activity("requeue_slurm_job", RequeueRequest, RequeueResult)
HOLD_SLURM_JOB = Activity("hold_slurm_job", HoldRequest, str)
WAIT_FOR_JOB_RESUME = Activity("wait_for_job_resume", VerifyJobRequest, VerifyOutcome)
NOTIFY_JOB_OWNER = Activity("notify_job_owner", OwnerNotice, str)
START_JOB_RECOVERY = Activity("start_job_recovery", RecoveryJoin, RecoveryHandoff)
JOB_RECOVERY_HISTORY = Activity("job_recovery_history", JobHistoryRequest, JobHistory)

# --- the cluster's coordinator (activities/fleet.py) ------------------------------------------
ADMIT_INCIDENT = Activity("admit_incident", AdmitAsk, AdmitAnswer)
REQUEST_CAPACITY = Activity("request_capacity", CapacityRequest, CapacityDecision)
CONFIRM_CAPACITY = Activity("confirm_capacity", CapacityRequest, CapacityDecision)
RELEASE_CAPACITY = Activity("release_capacity", ReleaseRequest, str)
CONTAIN_WHILE_HELD = Activity("contain_while_held", CapacityRequest, CapacityDecision)
FIND_CLOSED_RUNS = Activity("find_closed_runs", RunRefs, RunRefs)
GIVE_BACK_BORROWED_OF_ENDED_RUNS = Activity("give_back_borrowed_of_ended_runs", str, BorrowedGiveBack)
FIND_NODES_LEFT_DRAINED = Activity("find_nodes_left_drained", RunRefs, RunRefs)  # Slurm: still drained by them
FIND_OPEN_INCIDENTS = Activity("find_open_incidents", str, OpenIncidents)  # the cluster's
# The same, packed (gpuheal.core.fleet.packing.pack_listing): within Temporal's 2 MiB at 10,000
FIND_OPEN_INCIDENTS_PACKED = Activity("find_open_incidents_packed", str, bytes)
# The coordinator's state compressed beside its workflow task (a local activity: activities/carrying.py)
PACK_FLEET_STATE = Activity("pack_fleet_state", bytes, bytes)
OPEN_DOMAIN_INCIDENT = Activity("open_domain_incident", DomainIncident, str)
DECIDE_DOMAIN = Activity("decide_domain", DomainDecisionFor, str)

# --- Kubernetes (activities/kubernetes.py) ----------------------------------------------------
MAP_KUBE_NODE = Activity("map_kube_node", MapNodeRequest, KubeNodeRef)
MARK_REJECTED_NODE = Activity("mark_rejected_node", RejectNodeRequest, str)
CORDON_AND_TAINT_NODE = Activity("cordon_and_taint_node", CordonRequest, CordonResult)
EVICT_PODS = Activity("evict_pods", EvictRequest, EvictResult)
UNCORDON_NODE = Activity("uncordon_node", KubeNodeRef, str)
RETURN_UNFINISHED_BORROW = Activity("return_unfinished_borrow", BorrowRequest, BorrowResult)
POST_NODE_EVENT = Activity("post_node_event", KubeEvent, type(None))
BORROW_INFERENCE_NODE = Activity("borrow_inference_node", BorrowRequest, BorrowResult)
GIVE_BACK_NODE = Activity("give_back_node", BorrowedNode, str)

REMEDIATION = (
    LOOK_UP_SLURM_NODE,
    FIND_EARLIER_REPLACEMENT,
    NOTIFY_OPERATORS,
    LIST_JOBS_ON_NODE,
    DRAIN_SLURM_NODE,
    REPAIR_NODE,
    REPLACE_NODE,
    CHECK_NODE_HEALTH,
    RESUME_SLURM_NODE,
    DECOMMISSION_NODE,
    RECORD_INCIDENT_METRICS,
    ADOPT_BORROWED_NODE,
    RELEASE_BORROWED_NODE,
)
VALIDATION = (VALIDATE_NODE_GPUS,)
GATHER_RMA_EVIDENCE = Activity("gather_rma_evidence", RmaRequest, RmaEvidence)
FILE_RMA = Activity("file_rma", RmaEvidence, str)
FIND_APPLICATION_FAULTS = Activity("find_application_faults", AppFaultsRequest, AppFaults)
RMA = (GATHER_RMA_EVIDENCE, FILE_RMA, FIND_APPLICATION_FAULTS)
JOBS = (
    REQUEST_CHECKPOINT,
    WAIT_FOR_CHECKPOINTS,
    FIND_JOBS,
    WAIT_FOR_NODE_EMPTY,
    REQUEUE_SLURM_JOB,
    HOLD_SLURM_JOB,
    WAIT_FOR_JOB_RESUME,
    NOTIFY_JOB_OWNER,
    START_JOB_RECOVERY,
    JOB_RECOVERY_HISTORY,
)
FLEET_INCIDENT = (  # an incident's side
    ADMIT_INCIDENT,
    REQUEST_CAPACITY,
    CONFIRM_CAPACITY,
    RELEASE_CAPACITY,
    CONTAIN_WHILE_HELD,
)
FLEET = (
    *FLEET_INCIDENT,
    OPEN_DOMAIN_INCIDENT,
    DECIDE_DOMAIN,
    FIND_CLOSED_RUNS,
    FIND_NODES_LEFT_DRAINED,
    FIND_OPEN_INCIDENTS,
    FIND_OPEN_INCIDENTS_PACKED,
)
BORROWED = (GIVE_BACK_BORROWED_OF_ENDED_RUNS,)  # the coordinator's, served by every worker (activities/borrowed.py)
CARRYING = (PACK_FLEET_STATE,)  # the coordinator's, a local activity (activities/carrying.py)
KUBERNETES = (
    MAP_KUBE_NODE,
    CORDON_AND_TAINT_NODE,
    MARK_REJECTED_NODE,
    EVICT_PODS,
    UNCORDON_NODE,
    POST_NODE_EVENT,
    BORROW_INFERENCE_NODE,
    RETURN_UNFINISHED_BORROW,
    GIVE_BACK_NODE,
)
ALL = REMEDIATION + JOBS + FLEET + KUBERNETES + BORROWED + CARRYING
# What every worker serves; KUBERNETES only where a cluster is configured (GPUHEAL_KUBECONFIG).
WORKER = REMEDIATION + JOBS + FLEET + VALIDATION + RMA + BORROWED + CARRYING
