"""Fleet safety: the decisions the cluster's coordinator takes, under its policy
(gpuheal.core.fleet_policy). Pure, no I/O.

One coordinator per cluster (workflows/fleet.py) holds the cluster's policy and answers every
incident: may it take capacity out of service now (the disruption budget: nodes out at once, as a
count and a share, per cluster, pool and topology domain; a rate; a cooldown per node), is the
circuit breaker tripped, is the node's domain failing as a whole (escalation), is the node a
repeat offender. Everything here is a function of the coordinator's state and the time it is
given, so every decision is replay-safe and unit-tested (tests/test_fleet.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, Field

from gpuheal.core.fleet_policy import FleetPolicy, Mode, RepeatPolicy, VersionedPolicy, limit_of
from gpuheal.core.models import (
    ActionClass,
    ApprovalPolicy,
    Frozen,
    NodeName,
    OperatorName,
    RemediationSettings,
    Severity,
    Stage,
)

# --- what the coordinator is told about a node ------------------------------------------------


class Placement(Frozen):
    """Where a node sits: its pool, its topology domains, and the sizes the shares are of."""

    node: NodeName
    cluster_size: int = Field(ge=1)
    pool: str = "default"
    pool_size: int = Field(default=1, ge=1)
    domains: dict[str, int] = {}  # domain name ("rack=r1") -> how many nodes it has


class AdmitRequest(Frozen):
    incident_id: str
    run_id: str = ""  # one incident of the node (its workflow id is the node's, run after run)
    cluster: str
    placement: Placement
    action: ActionClass
    what: str  # the failure, for the breaker's and the escalation's notices
    gpu_uuids: tuple[str, ...] = ()
    seed: FleetPolicy  # the worker's configured policy: the coordinator's first, if it is new


class Admission(Frozen):
    """What the cluster says to a new incident: its policy and what it knows of the node."""

    policy: VersionedPolicy
    repeat_offender: str | None = None  # why the node (or GPU) must be replaced this time
    domain_incident: str | None = None  # the node's domain is failing as a whole: held there
    breaker: str | None = None  # tripped: why


class AdmitAsk(Frozen):
    """An incident introducing itself to its cluster's coordinator."""

    incident_id: str
    run_id: str = ""
    cluster: str
    node: NodeName
    action: ActionClass
    what: str
    gpu_uuids: tuple[str, ...] = ()


class AdmitAnswer(Frozen):
    admission: Admission
    settings: RemediationSettings  # the worker's (timeouts, grace, Kubernetes): not the policy
    placement: Placement


class CapacityRequest(Frozen):
    cluster: str
    incident_id: str
    placement: Placement
    action: ActionClass
    # The incident's run (its first run id): what it holds is its run's, never its node's, so a
    # later incident on the same node does not find an earlier, dead run's grant as its own.
    run_id: str = ""


class RunRef(Frozen):
    """One incident run that holds something of the coordinator's (a grant, a place in line)."""

    incident_id: str
    run_id: str = ""  # "" for what coordinators of an earlier release recorded: the latest run
    node: str = ""


class RunRefs(Frozen):
    runs: tuple[RunRef, ...] = ()


class OpenIncident(Frozen):
    """A running incident of the cluster, as visibility and its status query show it: what a
    recreated coordinator rebuilds its grants and its line from."""

    incident_id: str
    run_id: str
    placement: Placement
    stage: Stage
    contained: bool = False  # held, with its node drained as containment
    takes_capacity: bool = True  # its action drains or repairs (an application restart takes none)


class OpenIncidents(Frozen):
    incidents: tuple[OpenIncident, ...] = ()
    # How the coordinator's earlier run ended ("Terminated at 2026-12-01 12:00:00"), if it had
    # one: then this one is a recreation, not the cluster's first.
    earlier_run: str = ""


class ReleaseRequest(Frozen):
    cluster: str
    incident_id: str
    run_id: str = ""  # "" from incidents of an earlier release: whatever the incident holds


class CapacityDecision(Frozen):
    granted: bool
    reason: str
    position: int | None = None  # in line, while held
    already: bool = False


class Grant(Frozen):
    incident_id: str
    run_id: str = ""
    node: str
    pool: str
    domains: tuple[str, ...]
    at: datetime
    override: str | None = None  # operator: reason, when granted past the budget


class Held(Frozen):
    incident_id: str
    run_id: str = ""
    node: str
    placement: Placement
    since: datetime
    reason: str


class Arrival(Frozen):
    at: datetime
    incident_id: str
    run_id: str = ""
    node: str
    domains: tuple[str, ...]
    gpu_uuids: tuple[str, ...] = ()


class Breaker(Frozen):
    tripped: bool = False
    at: datetime | None = None
    why: str = ""
    nodes: tuple[str, ...] = ()
    by: str = ""  # "gpuheal" (it tripped) or the operator who paused or resumed


class DomainIncident(Frozen):
    cluster: str
    domain: str
    incident_id: str  # the domain incident's workflow id
    nodes: tuple[str, ...]
    opened_at: datetime
    decided: Literal["", "release", "dismiss"] = ""
    decided_at: datetime | None = None  # from then on it holds nothing, and only newer reports count


class OperatorAction(Frozen):
    operator: OperatorName
    reason: str = Field(min_length=1, max_length=500)


class Override(Frozen):
    incident_id: str
    operator: OperatorName
    reason: str = Field(min_length=1, max_length=500)


class DomainDecision(Frozen):
    domain: str
    decision: Literal["release", "dismiss"]
    operator: OperatorName
    reason: str = Field(min_length=1, max_length=500)


class DomainDecisionFor(Frozen):
    cluster: str
    decision: DomainDecision


class GrantNotice(Frozen):
    """The coordinator to a held incident: go (granted), or stop (its domain incident dismissed it)."""

    granted: bool
    reason: str


class BudgetUse(Frozen):
    name: str
    used: int
    limit: int


class FleetState(BaseModel):
    """The coordinator's state: carried whole across continue-as-new."""

    cluster: str
    policy: VersionedPolicy
    breaker: Breaker = Breaker()
    grants: dict[str, Grant] = {}
    # Grants taken back before a replacement (breaker, domain incident): the node stays drained
    # and out of service, so it counts against every budget until its incident releases it.
    contained: dict[str, Grant] = {}
    # Held incidents' nodes drained as containment (nothing new lands on them): outside the
    # budget, within a bound of their own (the policy's containment_limit), none while tripped.
    containing: dict[str, Grant] = {}
    queue: list[Held] = []
    arrivals: list[Arrival] = []  # within the longest window that needs them
    remediations: list[datetime] = []  # grants, for the rate
    last_release: dict[str, datetime] = {}  # node -> when gpuheal last gave it back (cooldown)
    domain_incidents: dict[str, DomainIncident] = {}
    decisions: int = 0
    # The sizes the shares are of, as the latest placements said ("cluster", "pool P", "domain D"),
    # so that what the coordinator shows is computed on the real cluster, not on one node.
    sizes: dict[str, int] = {}
    reaped_at: datetime | None = None  # when the coordinator last looked for closed runs
    # Nodes closed runs left drained (node -> the grant): still out, still counted (gpuheal.core.reaping).
    left: dict[str, Grant] = {}
    configured: str = ""  # the digest of the last configuration a worker offered (steering.configure)


class FleetStatus(Frozen):
    cluster: str
    mode: Mode
    policy_version: int
    breaker: Breaker
    out_of_service: tuple[Grant, ...]
    held: tuple[Held, ...]
    budget: tuple[BudgetUse, ...]
    domain_incidents: tuple[DomainIncident, ...]
    remediations_in_window: int
    containment: BudgetUse | None = None  # held nodes drained as containment, and their bound
    containing: tuple[Grant, ...] = ()
    left: tuple[Grant, ...] = ()  # drained by incident runs that closed without giving back: counted


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


def containment_decision(state: FleetState, req: CapacityRequest) -> tuple[bool, str]:
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
    arrivals: Sequence[Arrival], node: str, gpu_uuids: Iterable[str], now: datetime, policy: RepeatPolicy
) -> str | None:
    """Why this is the node's (or a GPU's) `incidents`-th incident within the window, or None.
    Counts each incident once (one arrival per run of the node's workflow, however often it asks)."""
    recent = within(arrivals, now, policy.window_s)
    on_node = {(a.incident_id, a.run_id) for a in recent if a.node == node}
    if len(on_node) >= policy.incidents:
        return f"repeat offender: {len(on_node)} incidents on {node} within {policy.window_s / 86400:g} days"
    for uuid in gpu_uuids:
        on_gpu = {(a.incident_id, a.run_id) for a in recent if uuid in a.gpu_uuids}
        if len(on_gpu) >= policy.incidents:
            return f"repeat offender: {len(on_gpu)} incidents on GPU {uuid} within {policy.window_s / 86400:g} days"
    return None


def forget_before(state: FleetState, now: datetime) -> None:
    """Keep only what a window can still need (the state is carried across continue-as-new)."""
    p = state.policy.policy
    keep_s = max(p.repeat.window_s, p.breaker.window_s, p.escalation.window_s)
    state.arrivals = within(state.arrivals, now, keep_s)
    state.remediations = [t for t in state.remediations if (now - t).total_seconds() < p.budget.rate_window_s]
    cooldown = p.budget.node_cooldown_s
    state.last_release = {n: t for n, t in state.last_release.items() if (now - t).total_seconds() < cooldown}


def needs_approval(mode: Mode, action: ActionClass, approval: ApprovalPolicy) -> bool:
    """`approve` mode: every action class waits for a human; `auto`: those the policy names."""
    if action == ActionClass.IGNORE:
        return False
    return mode == "approve" or action in approval.required_for


# --- the workflows' inputs (their names and messages: gpuheal.core.messages; ids: gpuheal.core.ids)


Note = tuple[str, Severity, str]  # a notice to the operators: event, severity, message


class CoordinatorInput(Frozen):
    cluster: str
    seed: FleetPolicy
    # The starting worker's configuration digest (policy_file.digest, computed where the
    # configuration was read: what it set, not its defaults), so a restart of it changes nothing.
    seed_digest: str = ""
    state: FleetState | None = None  # carried across continue-as-new
    notes: tuple[Note, ...] = ()  # ... with the notices still on their way
    domains: tuple[DomainIncident, ...] = ()  # ... and the domain incidents not yet opened


class DomainIncidentInput(Frozen):
    cluster: str
    incident: DomainIncident
    decide_within_s: float = 3600.0
    default: Literal["release", "dismiss"] = "release"


class DomainIncidentResult(Frozen):
    domain: str
    nodes: tuple[str, ...]
    decision: DomainDecision
    coordinator: str
