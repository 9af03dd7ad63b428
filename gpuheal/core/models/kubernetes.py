"""The Kubernetes side of an incident's activities: the Node of a Slurm node, cordon, eviction,
borrowing a node from inference and giving it back.
"""

from __future__ import annotations

from pydantic import Field

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
