"""The disruption budget: nodes out at once (a count and a share, per cluster, pool and topology
domain), containment, a rate, a cooldown per node, and whether a decision needs a human. Pure, no I/O:
a function of the coordinator's state and the time it is given (tests/test_fleet.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta

from gpuheal.core.fleet import windows
from gpuheal.core.fleet.breaker import escalated_domain
from gpuheal.core.fleet.models import BudgetUse, CapacityRequest, FleetState, Grant, Placement
from gpuheal.core.fleet.policy import Mode, limit_of
from gpuheal.core.models.base import ActionClass
from gpuheal.core.models.incident import ApprovalPolicy

# --- decisions ----------------------------------------------------------------------------------


def budget_uses(
    state: FleetState, placement: Placement | None = None, asking: str = "", asking_node: str = ""
) -> list[BudgetUse]:
    """Use against every limit that applies: to `placement` (a decision), or, with none, to the
    whole cluster as the coordinator knows it (every pool and domain it has seen: what it shows).
    Counted by one scan of what is out, against the rule a pass over the line counts for each
    held incident (Pass, with indexes): one rule, `_against`."""
    out = _out(state)
    mine = [g for g in out if g.incident_id == asking or g.node == asking_node]
    if placement is not None:
        size, pools = placement.cluster_size, [(placement.pool, placement.pool_size)]
        domains = list(placement.domains.items())
    else:  # every pool and domain seen, by name
        size, seen = state.sizes.get("cluster", 1), sorted(state.sizes.items())
        pools = [(k.removeprefix("pool "), v) for k, v in seen if k.startswith("pool ")]
        domains = [(k.removeprefix("domain "), v) for k, v in seen if k.startswith("domain ")]
    return _against(
        state,
        size,
        pools,
        domains,
        len(out),
        lambda pool: sum(1 for g in out if g.pool == pool),
        lambda domain: sum(1 for g in out if domain in g.domains),
        mine,
    )


def _out(state: FleetState) -> tuple[Grant, ...]:
    """Every node out of service because of gpuheal: granted, contained while held, left drained."""
    return (*state.grants.values(), *state.contained.values(), *state.left.values())


def _against(
    state: FleetState,
    size: int,
    pools: list[tuple[str, int]],
    domains: list[tuple[str, int]],
    out: int,
    in_pool: Callable[[str], int],
    in_domain: Callable[[str], int],
    mine: list[Grant],
) -> list[BudgetUse]:
    """The budget's rule: what is out, less the asking incident's own nodes (contained, or
    held by its earlier run: not in the way of its own grant), against each limit that applies."""
    b = state.policy.policy.budget
    uses = [BudgetUse(name="cluster", used=out - len(mine), limit=limit_of(b.cluster, size))]
    if b.per_pool is not None:
        for pool, psize in pools:
            used = in_pool(pool) - sum(1 for g in mine if g.pool == pool)
            uses.append(BudgetUse(name=f"pool {pool}", used=used, limit=limit_of(b.per_pool, psize)))
    if b.per_domain is not None:
        for domain, dsize in domains:
            used = in_domain(domain) - sum(1 for g in mine if domain in g.domains)
            uses.append(BudgetUse(name=f"domain {domain}", used=used, limit=limit_of(b.per_domain, dsize)))
    return uses


class Pass:
    """What every held incident's decision in one pass over the line reads alike (serve_queue):
    the rate window's count and what is out, by pool and domain, counted once per pass instead
    of once per held incident, and counted again after each grant the pass makes. Counted per
    held incident, a pass over 9,400 held took seconds of one workflow task, past the SDK's 2 s
    deadlock bound, and the coordinator's task failed over and over (issue 36's 10,000-report
    run). The decisions are the same as without it (tests/test_budget_pass.py)."""

    def __init__(self, state: FleetState, now: datetime) -> None:
        self.state, self.now = state, now
        self.refresh()

    def refresh(self) -> None:
        s = self.state
        self.recent = len(windows.in_rate_window(s.remediations, self.now, s.policy.policy.budget.rate_window_s))
        self.out = _out(s)
        self.by_pool = Counter(g.pool for g in self.out)
        self.by_domain = Counter(d for g in self.out for d in set(g.domains))
        self.of_incident: dict[str, list[int]] = {}
        self.of_node: dict[str, list[int]] = {}
        for at, g in enumerate(self.out):
            self.of_incident.setdefault(g.incident_id, []).append(at)
            self.of_node.setdefault(g.node, []).append(at)

    def uses(self, placement: Placement, asking: str, asking_node: str) -> list[BudgetUse]:
        """budget_uses(state, placement, asking, asking_node), from the counts."""
        mine = [self.out[at] for at in {*self.of_incident.get(asking, ()), *self.of_node.get(asking_node, ())}]
        return _against(
            self.state,
            placement.cluster_size,
            [(placement.pool, placement.pool_size)],
            list(placement.domains.items()),
            len(self.out),
            self.by_pool.__getitem__,
            self.by_domain.__getitem__,
            mine,
        )


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
        inside = _contained_in(state, b.name)
        if b.used + inside >= b.limit:
            return False, f"not contained: {b.used + inside} of {b.limit} nodes out in {b.name}"
    return True, "contained while held (nothing new lands on it)"


def note_sizes(state: FleetState, placement: Placement) -> None:
    """Remember the sizes a placement reports (the cluster, its pool, its domains)."""
    state.sizes["cluster"] = placement.cluster_size
    state.sizes[f"pool {placement.pool}"] = placement.pool_size
    for domain, dsize in placement.domains.items():
        state.sizes[f"domain {domain}"] = dsize


def capacity_decision(
    state: FleetState, req: CapacityRequest, now: datetime, seen: Pass | None = None
) -> tuple[bool, str]:
    """(granted, why): the breaker, the node's cooldown, the rate, then every budget limit.
    `seen`: a pass over the line's counts, at this `now` (serve_queue)."""
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
    if req.placement.node in state.returning:  # granted now, its drain would be undone by the resume
        return False, f"{req.placement.node} is being returned by an operator: decided once a look sees it in Slurm"
    if seen is not None:
        recent = seen.recent
    else:
        recent = len(windows.in_rate_window(state.remediations, now, policy.budget.rate_window_s))
    if recent >= policy.budget.rate:
        return (
            False,
            f"rate: {recent} remediations within {policy.budget.rate_window_s:g} s (limit {policy.budget.rate})",
        )
    if req.incident_id in state.contained:  # its node is out already: a grant takes no more capacity
        return True, "its node is out of service already (taken back before; granted again)"
    if req.placement.node in state.left:
        return True, "its node is out of service already (left drained by an earlier incident; taken over)"
    if seen is not None:
        uses = seen.uses(req.placement, req.incident_id, req.placement.node)
    else:
        uses = budget_uses(state, req.placement, asking=req.incident_id, asking_node=req.placement.node)
    for use in uses:
        if use.used >= use.limit:
            return False, f"disruption budget: {use.used} of {use.limit} nodes out of service ({use.name})"
    # Its own contained node moves from the containment to the budget: nothing more goes out.
    if state.grants_within_all_out and req.incident_id not in state.containing:
        why = _over_with_contained(state, req, uses)
        if why:
            return False, why
    return True, "within the disruption budget"


def _over_with_contained(state: FleetState, req: CapacityRequest, uses: list[BudgetUse]) -> str:
    """Why a grant would put more out than the limits allow once held incidents' contained nodes
    are counted too ("" when it would not): the cluster's budget plus the containment bound, and
    each pool's or domain's own budget (as containment_decision counts them). Only more contained
    than the bound allows now (lowered since, or found drained by a recreated coordinator's
    rebuild) can reach them after the budget itself let the grant through."""
    contained = containment_use(state, req.placement.cluster_size)
    cluster = uses[0]
    if cluster.used + contained.used >= cluster.limit + contained.limit:
        return (
            f"{cluster.used} out under the budget (limit {cluster.limit}) and {contained.used} held nodes contained "
            f"(bound {contained.limit}): nothing more goes out until a contained node is granted or back in service"
        )
    for use in uses[1:]:
        inside = _contained_in(state, use.name)
        if use.used + inside >= use.limit:
            return (
                f"{use.used} out under the budget of {use.name} and {inside} held nodes contained there "
                f"(limit {use.limit}): nothing more goes out there until one is back"
            )
    return ""


def _contained_in(state: FleetState, use_name: str) -> int:
    """Held incidents' contained nodes in a pool or domain ("pool P", "domain D")."""
    kind, name = use_name.split(" ", 1)
    return sum(1 for g in state.containing.values() if (g.pool == name if kind == "pool" else name in g.domains))


def needs_approval(mode: Mode, action: ActionClass, approval: ApprovalPolicy) -> bool:
    """`approve` mode: every action class waits for a human; `auto`: those the policy names."""
    if action == ActionClass.IGNORE:
        return False
    return mode == "approve" or action in approval.required_for
