"""The circuit breaker, domain escalation and repeat offenders: what a run of arrivals says about
the fleet, a domain or a node. Pure, no I/O (tests/test_fleet.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from datetime import datetime

from gpuheal.core.fleet import index
from gpuheal.core.fleet.models import Arrival, DomainIncident, FleetState, Placement
from gpuheal.core.fleet.policy import RepeatPolicy
from gpuheal.core.fleet.windows import within
from gpuheal.core.policy import REPEAT_OFFENDER


def escalated_domain(state: FleetState, placement: Placement) -> DomainIncident | None:
    """The open domain incident that holds this node's incidents, or None. A decided one holds
    nothing more: released, its node incidents went on; dismissed, they ended with it."""
    for domain in placement.domains:
        incident = state.domain_incidents.get(domain)
        if incident is not None and not incident.decided:
            return incident
    return None


def breaker_trip(state: FleetState, placement: Placement, now: datetime) -> str | None:
    """Why the breaker trips now (after this arrival), or None."""
    p = state.policy.policy.breaker
    recent = index.count_within(state, now, p.window_s)
    if recent > p.max_incidents:
        return f"{recent} new incidents within {p.window_s:g} s (more than {p.max_incidents})"
    by_domain = index.arrivals(state).by_domain if placement.domains else {}
    for domain, size in placement.domains.items():
        nodes = {a.node for a in index.within_from_the_end(state, by_domain.get(domain, deque()), now, p.window_s)}
        if size > 1 and len(nodes) / size > p.domain_share:
            return f"{len(nodes)} of {size} nodes of {domain} within {p.window_s:g} s (more than {p.domain_share:.0%})"
    return None


def escalation(state: FleetState, placement: Placement, now: datetime) -> tuple[str, list[str]] | None:
    """The domain (and its reporting nodes) that fails as a whole, or None."""
    p = state.policy.policy.escalation
    by_domain = index.arrivals(state).by_domain if placement.domains else {}
    for domain, size in placement.domains.items():
        earlier = state.domain_incidents.get(domain)
        if earlier is not None and not earlier.decided:
            continue  # open: it holds them already
        since = earlier.decided_at if earlier is not None else None  # decided: only what came after
        recent = index.within_from_the_end(state, by_domain.get(domain, deque()), now, p.window_s)
        nodes = sorted({a.node for a in recent if since is None or a.at > since})
        if len(nodes) >= p.min_nodes and len(nodes) >= p.domain_share * size:
            return domain, nodes
    return None


def repeat_offender(
    arrivals: Sequence[Arrival],
    node: str,
    gpu_uuids: Iterable[str],
    now: datetime,
    policy: RepeatPolicy,
    gpu_serials: Iterable[str] = (),
) -> str | None:
    """Why this is the node's (or a GPU's) `incidents`-th incident within the window, or None.
    Counts each incident once (one arrival per run of the node's workflow, however often it asks).
    Where the reports name the GPU's serial, the count follows the GPU, not the node's name: a
    board moved to another node (or a node re-imaged and renamed) keeps its record, and a node
    whose bad GPU was swapped starts afresh."""
    recent = within(arrivals, now, policy.window_s)
    serials = tuple(gpu_serials)
    for serial in serials:
        on_board = {(a.incident_id, a.run_id) for a in recent if serial in a.gpu_serials}
        if len(on_board) >= policy.incidents:
            return (
                f"{REPEAT_OFFENDER}: {len(on_board)} incidents on GPU serial {serial}"
                f" within {policy.window_s / 86400:g} days"
            )
    on_node = {(a.incident_id, a.run_id) for a in recent if a.node == node}
    if not serials and len(on_node) >= policy.incidents:
        return f"{REPEAT_OFFENDER}: {len(on_node)} incidents on {node} within {policy.window_s / 86400:g} days"
    for uuid in gpu_uuids:
        on_gpu = {(a.incident_id, a.run_id) for a in recent if uuid in a.gpu_uuids}
        if len(on_gpu) >= policy.incidents:
            return f"{REPEAT_OFFENDER}: {len(on_gpu)} incidents on GPU {uuid} within {policy.window_s / 86400:g} days"
    return None
