"""The activity boundary: every activity's name, its one input model and its output, in one place.

The workflow calls activities through these references (``workflow.execute_activity`` by name,
typed by ``Activity[I, O]``), so it never imports the implementations and with them the Slurm,
Kubernetes and HTTP clients. The implementations (activities/remediation.py,
activities/kubernetes.py) and the tests' stand-ins (tests/fakes.py) declare themselves with
``@implements(REF)``; tests/test_activity_interface.py checks that every implementation's
signature matches its reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from temporalio import activity

from gpuheal.models import (
    CheckpointRequest,
    CheckpointResult,
    CordonRequest,
    CordonResult,
    DrainRequest,
    DrainResult,
    EvictRequest,
    EvictResult,
    HealthCheckResult,
    JobList,
    KubeEvent,
    KubeNodeRef,
    MapNodeRequest,
    NodeInfo,
    NodeRef,
    Notification,
    RemediationResult,
    RepairRequest,
    RepairResult,
    ReplacementResult,
    RequeueRequest,
    RequeueResult,
    VerifyRequest,
    VerifyResult,
)

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


# --- Slurm, providers, notifications (activities/remediation.py) -----------------------------
LOOK_UP_SLURM_NODE = Activity("look_up_slurm_node", NodeRef, NodeInfo)
NOTIFY_OPERATORS = Activity("notify_operators", Notification, type(None))
LIST_JOBS_ON_NODE = Activity("list_jobs_on_node", NodeRef, JobList)
REQUEST_CHECKPOINT = Activity("request_checkpoint", CheckpointRequest, CheckpointResult)
DRAIN_SLURM_NODE = Activity("drain_slurm_node", DrainRequest, DrainResult)
REQUEUE_SLURM_JOB = Activity("requeue_slurm_job", RequeueRequest, RequeueResult)
REPAIR_NODE = Activity("repair_node", RepairRequest, RepairResult)
REPLACE_NODE = Activity("replace_node", NodeRef, ReplacementResult)
CHECK_NODE_HEALTH = Activity("check_node_health", NodeRef, HealthCheckResult)
RESUME_SLURM_NODE = Activity("resume_slurm_node", NodeRef, str)
DECOMMISSION_NODE = Activity("decommission_node", NodeRef, str)
WAIT_FOR_TRAINING_PROGRESS = Activity("wait_for_training_progress", VerifyRequest, VerifyResult)
RECORD_INCIDENT_METRICS = Activity("record_incident_metrics", RemediationResult, type(None))

# --- Kubernetes (activities/kubernetes.py) ----------------------------------------------------
MAP_KUBE_NODE = Activity("map_kube_node", MapNodeRequest, KubeNodeRef)
CORDON_AND_TAINT_NODE = Activity("cordon_and_taint_node", CordonRequest, CordonResult)
EVICT_PODS = Activity("evict_pods", EvictRequest, EvictResult)
UNCORDON_NODE = Activity("uncordon_node", KubeNodeRef, str)
POST_NODE_EVENT = Activity("post_node_event", KubeEvent, type(None))

REMEDIATION = (
    LOOK_UP_SLURM_NODE,
    NOTIFY_OPERATORS,
    LIST_JOBS_ON_NODE,
    REQUEST_CHECKPOINT,
    DRAIN_SLURM_NODE,
    REQUEUE_SLURM_JOB,
    REPAIR_NODE,
    REPLACE_NODE,
    CHECK_NODE_HEALTH,
    RESUME_SLURM_NODE,
    DECOMMISSION_NODE,
    WAIT_FOR_TRAINING_PROGRESS,
    RECORD_INCIDENT_METRICS,
)
KUBERNETES = (MAP_KUBE_NODE, CORDON_AND_TAINT_NODE, EVICT_PODS, UNCORDON_NODE, POST_NODE_EVENT)
ALL = REMEDIATION + KUBERNETES
