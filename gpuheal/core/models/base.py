"""The names and vocabulary every layer speaks: validated node and cluster names, the frozen base
model, action classes, stages, node states, outcomes. Every model in gpuheal.core.models crosses a
Temporal boundary, carried by the SDK's pydantic data converter; validation happens where data enters.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal, NamedTuple

from pydantic import AfterValidator, BaseModel, ConfigDict, StringConstraints

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
# node and in which incident; nothing touched), not_in_service (Slurm has the node, not in service:
# a spare, or a replacement still joining; said, nothing touched), failed_validation (repaired, but its GPUs failed
# the validation run before it would take jobs: drained and out, for the vendor), followed_up (a
# more severe report came once its plan had left the node in service: a follow-up run of the same
# incident, started as this one closed, acts on it), unvalidated (a burn-in gave no verdict: it
# never ran to an end, so it says nothing of the GPUs; the node it was for, repaired or the
# replacement, is kept drained for a person to validate; nothing is condemned).
Outcome = Literal[
    "resolved",
    "ignored",
    "aborted",
    "no_capacity",
    "observed",
    "escalated",
    "not_granted",
    "already_replaced",
    "not_in_service",
    "failed_validation",
    "followed_up",
    "unvalidated",
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

    # Nothing was done to it: ignored, observed, aborted before the drain, or an application restart
    # on a node drained already (by an earlier run, or someone else: the detail says which).
    UNTOUCHED = "untouched"
    IN_SERVICE = "in_service"  # the action needed no drain (restart the app), and Slurm shows it in service
    DRAINED = "drained"  # drained by this incident and left so (aborted, not granted): a person resumes it
    BLOCKED = "blocked"  # drained and cordoned, pods a PodDisruptionBudget protects still on it
    ESCALATED = "escalated"  # its domain incident handles it with the rest of its domain
    AWAITING_REPLACEMENT = "awaiting_replacement"  # drained and out, no capacity for a replacement
    RETURNED = "returned"  # repaired, health check passed, back in service
    LEFT_DRAINED = "left_drained"  # repaired, but someone else drained it before us: left as they had it
    REPLACED = "replaced"  # out of the cluster, a new node in its place
    FAILED_VALIDATION = "failed_validation"  # repaired, its GPUs failed validation: drained and out
    UNVALIDATED = "unvalidated"  # repaired, its burn-in gave no verdict: kept drained for a person
    ALREADY_REPLACED = "already_replaced"  # gone before this (late) report: an earlier incident replaced it
    UNKNOWN = "unknown"  # recorded by a release before the states were named (its detail has the words)


class NodeAt(NamedTuple):
    """A node state and its words, decided together (gpuheal.core.render)."""

    state: NodeState
    detail: str
