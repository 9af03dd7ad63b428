"""The Kubernetes side of an incident's activities: the Node of a Slurm node, cordon, eviction,
borrowing a node from inference and giving it back.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from gpuheal.core.models.base import Frozen, NodeName
from gpuheal.core.models.incident import BorrowPolicy
from gpuheal.core.models.slurm import NodeRef


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


class RejectNodeRequest(Frozen):
    """A replacement's new node whose burn-in ran and failed (or gave no verdict: kept out for a
    person): out of Kubernetes' scheduling too."""

    node: KubeNodeRef
    detail: str  # the burn-in's verdict, in words
    no_verdict: bool = False


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
    # The incident's first run: written on the node, so a node whose run crashed out is given
    # back (activities/borrowed.py). The pool it joins, where the incident knows it (a replacement
    # searched it): the failed Node may be gone by then (the Kubernetes provider deleted it).
    # Each sent only when set (a worker of the release before forbids unknown fields).
    run_id: str | None = None
    training_pool: str | None = None

    @model_serializer(mode="wrap")
    def _set_fields_only(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for name in ("run_id", "training_pool"):
                if getattr(self, name) is None:
                    data.pop(name, None)
        return data


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


class BorrowedGiveBack(Frozen):
    """Borrowed nodes of ended runs: given back to their inference pool, or drained and waiting
    for the jobs still on them (never killed) until a later look."""

    given_back: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()


class NodeEmptyWait(Frozen):
    node: NodeName
    deadline_at: float  # unix time
    poll_s: float = Field(default=0.5, gt=0)  # a wait of hours asks Slurm less often
