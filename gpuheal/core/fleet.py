"""Fleet safety: the decisions the cluster's coordinator takes, under its policy
(gpuheal.core.fleet_policy). Pure, no I/O.

One coordinator per cluster (workflows/fleet.py) holds the cluster's policy and answers every
incident: may it take capacity out of service now (the disruption budget: nodes out at once, as a
count and a share, per cluster, pool and topology domain; a rate; a cooldown per node), is the
circuit breaker tripped, is the node's domain failing as a whole (escalation), is the node a
repeat offender. Everything here is a function of the coordinator's state and the time it is
given, so every decision is replay-safe and unit-tested (tests/test_fleet.py). The messages and
the state they decide over are gpuheal.core.fleet_models.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from gpuheal.core.fleet_models import (
    Arrival,
    BudgetUse,
    CapacityRequest,
    DomainIncident,
    FleetState,
    Placement,
)
from gpuheal.core.fleet_policy import Mode, RepeatPolicy, limit_of
from gpuheal.core.models import (
    ActionClass,
    ApprovalPolicy,
)

# --- decisions ----------------------------------------------------------------------------------


def budget_uses(
    state: FleetState, placement: Placement | None = None, asking: str = "", asking_node: str = ""
) -> list[BudgetUse]:
    """Use against every limit that applies: to `placement` (a decision), or, with none, to the
    whole cluster as the coordinator knows it (every pool and domain it has seen: what it shows)."""
    b = state.policy.policy.budget
    # Every node out of service because of gpuheal; the asking incident's own (contained) node is
    # not in the way of its own grant.
    out = (*state.grants.values(), *state.contained.values(), *state.left.values())
    grants = [g for g in out if g.incident_id != asking and g.node != asking_node]
    if placement is not None:
        size, pools, domains = placement.cluster_size, {placement.pool: placement.pool_size}, placement.domains
    else:
        size = state.sizes.get("cluster", 1)
        pools = {k.removeprefix("pool "): v for k, v in state.sizes.items() if k.startswith("pool ")}
        domains = {k.removeprefix("domain "): v for k, v in state.sizes.items() if k.startswith("domain ")}
    uses = [BudgetUse(name="cluster", used=len(grants), limit=limit_of(b.cluster, size))]
    if b.per_pool is not None:
        for pool, psize in sorted(pools.items()):
            used = sum(1 for g in grants if g.pool == pool)
            uses.append(BudgetUse(name=f"pool {pool}", used=used, limit=limit_of(b.per_pool, psize)))
    if b.per_domain is not None:
        for domain, dsize in sorted(domains.items()) if placement is None else domains.items():
            used = sum(1 for g in grants if domain in g.domains)
            uses.append(BudgetUse(name=f"domain {domain}", used=used, limit=limit_of(b.per_domain, dsize)))
    return uses


def containment_use(state: FleetState, size: int | None = None) -> BudgetUse:
    """Held incidents' nodes drained as containment, against their own bound."""
    total = size if size is not None else state.sizes.get("cluster", 1)
    limit = limit_of(state.policy.policy.containment_limit, total)
    return BudgetUse(name="containment", used=len(state.containing), limit=limit)


def containment_decision(state: FleetState, req: CapacityRequest, total_bound: bool = True) -> tuple[bool, str]:
    """(drain, why): may a held incident drain its node so nothing new lands on it? Never while
    the breaker is tripped (a storm of false alerts must not drain the fleet), never past the
    containment bound, and only where the policy contains at all."""
    policy = state.policy.policy
    if policy.containment_while_held == "none":
        return False, "the policy contains nothing while held (GPUHEAL_HELD_CONTAINMENT=none)"
    if state.breaker.tripped:
        return False, f"not contained: circuit breaker tripped ({state.breaker.why}); nothing new is drained"
    domain = escalated_domain(state, req.placement)
    if domain is not None:  # a suspected switch or power fault: its nodes are likely fine
        return False, f"not contained: held by domain incident {domain.incident_id} ({domain.domain})"
    use = containment_use(state, req.placement.cluster_size)
    if use.used >= use.limit:
        return False, f"not contained: {use.used} of {use.limit} held nodes drained already (containment bound)"
    # Everything gpuheal has out (granted, contained, left drained by ended runs) stays within the
    # budget plus the containment bound: a slot freed by a containment that ended with its node
    # still drained (left) is not a slot to drain another node with.
    cluster = budget_uses(state, req.placement)[0]
    if total_bound and cluster.used + use.used >= cluster.limit + use.limit:
        total = cluster.used + use.used
        return (
            False,
            f"not contained: {total} nodes out, the budget plus the containment bound ({cluster.limit + use.limit})",
        )
    # A pool's or a domain's own budget bounds everything out in it, contained nodes too: the
    # cluster-wide bound alone would let one pool be drained whole.
    for b in budget_uses(state, req.placement)[1:]:
        kind, name = b.name.split(" ", 1)
        inside = sum(1 for g in state.containing.values() if (g.pool == name if kind == "pool" else name in g.domains))
        if b.used + inside >= b.limit:
            return False, f"not contained: {b.used + inside} of {b.limit} nodes out in {b.name}"
    return True, "contained while held (nothing new lands on it)"


def note_sizes(state: FleetState, placement: Placement) -> None:
    """Remember the sizes a placement reports (the cluster, its pool, its domains)."""
    state.sizes["cluster"] = placement.cluster_size
    state.sizes[f"pool {placement.pool}"] = placement.pool_size
    for domain, dsize in placement.domains.items():
        state.sizes[f"domain {domain}"] = dsize


def capacity_decision(state: FleetState, req: CapacityRequest, now: datetime) -> tuple[bool, str]:
    """(granted, why): the breaker, the node's cooldown, the rate, then every budget limit."""
    policy = state.policy.policy
    if state.breaker.tripped:
        return False, f"circuit breaker tripped ({state.breaker.why}); `gpuheal resume` resets it"
    domain = escalated_domain(state, req.placement)
    if domain is not None:
        return (
            False,
            f"held by domain incident {domain.incident_id} ({domain.domain}: suspected switch, power or cooling)",
        )
    last = state.last_release.get(req.placement.node)
    cooldown = policy.budget.node_cooldown_s
    if last is not None and (now - last).total_seconds() < cooldown:
        ready = last + timedelta(seconds=cooldown)
        return False, f"{req.placement.node} is cooling down after its last remediation (until {ready:%H:%M:%S})"
    recent = [t for t in state.remediations if (now - t).total_seconds() < policy.budget.rate_window_s]
    if len(recent) >= policy.budget.rate:
        return (
            False,
            f"rate: {len(recent)} remediations within {policy.budget.rate_window_s:g} s (limit {policy.budget.rate})",
        )
    if req.incident_id in state.contained:  # its node is out already: a grant takes no more capacity
        return True, "its node is out of service already (taken back before; granted again)"
    if req.placement.node in state.left:
        return True, "its node is out of service already (left drained by an earlier incident; taken over)"
    for use in budget_uses(state, req.placement, asking=req.incident_id, asking_node=req.placement.node):
        if use.used >= use.limit:
            return False, f"disruption budget: {use.used} of {use.limit} nodes out of service ({use.name})"
    return True, "within the disruption budget"


def escalated_domain(state: FleetState, placement: Placement) -> DomainIncident | None:
    """The open domain incident that holds this node's incidents, or None. A decided one holds
    nothing more: released, its node incidents went on; dismissed, they ended with it."""
    for domain in placement.domains:
        incident = state.domain_incidents.get(domain)
        if incident is not None and not incident.decided:
            return incident
    return None


def within(arrivals: Iterable[Arrival], now: datetime, window_s: float) -> list[Arrival]:
    return [a for a in arrivals if (now - a.at).total_seconds() <= window_s]


def breaker_trip(state: FleetState, placement: Placement, now: datetime) -> str | None:
    """Why the breaker trips now (after this arrival), or None."""
    p = state.policy.policy.breaker
    recent = within(state.arrivals, now, p.window_s)
    if len(recent) > p.max_incidents:
        return f"{len(recent)} new incidents within {p.window_s:g} s (more than {p.max_incidents})"
    for domain, size in placement.domains.items():
        nodes = {a.node for a in recent if domain in a.domains}
        if size > 1 and len(nodes) / size > p.domain_share:
            return f"{len(nodes)} of {size} nodes of {domain} within {p.window_s:g} s (more than {p.domain_share:.0%})"
    return None


def escalation(state: FleetState, placement: Placement, now: datetime) -> tuple[str, list[str]] | None:
    """The domain (and its reporting nodes) that fails as a whole, or None."""
    p = state.policy.policy.escalation
    recent = within(state.arrivals, now, p.window_s)
    for domain, size in placement.domains.items():
        earlier = state.domain_incidents.get(domain)
        if earlier is not None and not earlier.decided:
            continue  # open: it holds them already
        since = earlier.decided_at if earlier is not None else None  # decided: only what came after
        nodes = sorted({a.node for a in recent if domain in a.domains and (since is None or a.at > since)})
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
                f"repeat offender: {len(on_board)} incidents on GPU serial {serial}"
                f" within {policy.window_s / 86400:g} days"
            )
    on_node = {(a.incident_id, a.run_id) for a in recent if a.node == node}
    if not serials and len(on_node) >= policy.incidents:
        return f"repeat offender: {len(on_node)} incidents on {node} within {policy.window_s / 86400:g} days"
    for uuid in gpu_uuids:
        on_gpu = {(a.incident_id, a.run_id) for a in recent if uuid in a.gpu_uuids}
        if len(on_gpu) >= policy.incidents:
            return f"repeat offender: {len(on_gpu)} incidents on GPU {uuid} within {policy.window_s / 86400:g} days"
    return None


def forget_before(state: FleetState, now: datetime) -> bool:
    """Keep only what a window can still need (the state is carried across continue-as-new).
    True when a remediation left the rate's window or a node's cooldown ended: a held incident
    may go now."""
    p = state.policy.policy
    keep_s = max(p.repeat.window_s, p.breaker.window_s, p.escalation.window_s)
    state.arrivals = within(state.arrivals, now, keep_s)
    freed = time_freed(state, now)
    state.remediations, state.last_release = still_counted(state, now)
    return freed


def still_counted(state: FleetState, now: datetime) -> tuple[list[datetime], dict[str, datetime]]:
    """The remediations still in the rate's window, and the nodes still cooling down, at `now`."""
    b = state.policy.policy.budget
    recent = [t for t in state.remediations if (now - t).total_seconds() < b.rate_window_s]
    cooling = {n: t for n, t in state.last_release.items() if (now - t).total_seconds() < b.node_cooldown_s}
    return recent, cooling


def time_freed(state: FleetState, now: datetime) -> bool:
    """Whether time has freed something forget_before has not yet forgotten: a remediation left
    the rate's window, or a node's cooldown ended."""
    recent, cooling = still_counted(state, now)
    return len(recent) != len(state.remediations) or len(cooling) != len(state.last_release)


def needs_approval(mode: Mode, action: ActionClass, approval: ApprovalPolicy) -> bool:
    """`approve` mode: every action class waits for a human; `auto`: those the policy names."""
    if action == ActionClass.IGNORE:
        return False
    return mode == "approve" or action in approval.required_for
