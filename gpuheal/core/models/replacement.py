"""Repair and replacement: what a provider is asked and answers, an earlier replacement found
again, the health check of a new node.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gpuheal.core.models.base import ActionClass, Frozen
from gpuheal.core.models.slurm import NodeRef


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
    # The incident's first run (a Temporal reset keeps it): the provider's record and the hold's
    # reservation are under it, so a reset run finds the spare its first run took.
    run_id: str | None = None

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
