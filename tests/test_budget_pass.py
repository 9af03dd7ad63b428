"""A pass over the line decides as every held incident's decision read whole would (issue 36).

serve_queue counts what every decision of one pass reads alike (budget.Pass: the rate window, what
is out by pool and domain) once, and again after each grant it makes. Hypothesis builds states
with names shared across the books (an incident granted and left, two runs on one node, a
grant's domains repeated) and checks the counts against the budget's rule read from the books
one grant at a time (`read_whole`, the scan budget_uses made before it counted through Pass), and
a whole pass against the same pass deciding each held incident from the state read whole.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.core.fleet import budget, coordination
from gpuheal.core.fleet.models import BudgetUse, CapacityRequest, FleetState, Grant, Held, Placement
from gpuheal.core.fleet.policy import BudgetPolicy, FleetPolicy, VersionedPolicy, limit_of
from gpuheal.core.models.base import ActionClass

T0 = datetime(2026, 12, 5, tzinfo=UTC)
NODES = [f"n{i}" for i in range(8)]
POOLS = ["h100", "a100"]
DOMAINS = ["rack=r1", "rack=r2", "block=b1"]

grants = st.builds(
    Grant,
    incident_id=st.sampled_from([f"i-{n}" for n in NODES]),
    run_id=st.sampled_from(["", "r1", "r2"]),
    node=st.sampled_from(NODES),
    pool=st.sampled_from(POOLS),
    domains=st.lists(st.sampled_from(DOMAINS), max_size=3).map(tuple),
    at=st.just(T0),
)
placements = st.builds(
    Placement,
    node=st.sampled_from(NODES),
    cluster_size=st.integers(4, 40),
    pool=st.sampled_from(POOLS),
    pool_size=st.integers(2, 20),
    domains=st.dictionaries(st.sampled_from(DOMAINS), st.integers(1, 8), max_size=3),
)
policies = st.builds(
    BudgetPolicy,
    cluster=st.sampled_from(["2", "3", "25%"]),
    per_pool=st.sampled_from([None, "1", "50%"]),
    per_domain=st.sampled_from([None, "1", "2"]),
    rate=st.integers(1, 6),
    rate_window_s=st.just(600.0),
    node_cooldown_s=st.just(0.0),
)


def fleet(
    policy: BudgetPolicy, out: list[Grant], contained: list[Grant], left: list[Grant], ages: list[int]
) -> FleetState:
    p = FleetPolicy(budget=policy)
    s = FleetState(cluster="c", policy=VersionedPolicy(version=1, policy=p, changed_by="t", reason="t", at=T0))
    s.grants = {g.incident_id: g for g in out}
    s.contained = {g.incident_id: g for g in contained}
    s.left = {g.node: g for g in left}
    s.remediations = sorted(T0 + timedelta(seconds=a) for a in ages)
    s.sizes = {"cluster": 40, **{f"pool {p}": 20 for p in POOLS}, **{f"domain {d}": 8 for d in DOMAINS}}
    return s


states = st.builds(
    fleet,
    policies,
    st.lists(grants, max_size=6),
    st.lists(grants, max_size=3),
    st.lists(grants, max_size=3),
    st.lists(st.integers(0, 1200), max_size=8),
)


def read_whole(s: FleetState, where: Placement | None, asking: str = "", asking_node: str = "") -> list[BudgetUse]:
    """The budget's rule, read from the books one grant at a time: every node out (granted,
    contained, left), less the asking incident's own, against each limit that applies to
    `where` (or, with none, to every pool and domain the coordinator has seen)."""
    b = s.policy.policy.budget
    out = (*s.grants.values(), *s.contained.values(), *s.left.values())
    others = [g for g in out if g.incident_id != asking and g.node != asking_node]
    if where is not None:
        size, pools, domains = where.cluster_size, [(where.pool, where.pool_size)], list(where.domains.items())
    else:
        size = s.sizes.get("cluster", 1)
        pools = sorted((k.removeprefix("pool "), v) for k, v in s.sizes.items() if k.startswith("pool "))
        domains = sorted((k.removeprefix("domain "), v) for k, v in s.sizes.items() if k.startswith("domain "))
    uses = [BudgetUse(name="cluster", used=len(others), limit=limit_of(b.cluster, size))]
    if b.per_pool is not None:
        for pool, n in pools:
            used = sum(g.pool == pool for g in others)
            uses.append(BudgetUse(name=f"pool {pool}", used=used, limit=limit_of(b.per_pool, n)))
    if b.per_domain is not None:
        for domain, n in domains:
            used = sum(domain in g.domains for g in others)
            uses.append(BudgetUse(name=f"domain {domain}", used=used, limit=limit_of(b.per_domain, n)))
    return uses


@settings(max_examples=400, deadline=None)
@given(states, placements, st.sampled_from(["", *(f"i-{n}" for n in NODES)]))
def test_a_pass_counts_what_every_decision_reads_as_the_books_read_whole_say(
    s: FleetState, where: Placement, asking: str
) -> None:
    seen = budget.Pass(s, T0 + timedelta(seconds=1300))
    for node in ("", where.node):
        assert seen.uses(where, asking, node) == read_whole(s, where, asking, node)
        assert budget.budget_uses(s, where, asking=asking, asking_node=node) == read_whole(s, where, asking, node)
    assert budget.budget_uses(s) == read_whole(s, None)  # the whole cluster, as `gpuheal fleet` shows it


def whole(s: FleetState, now: datetime) -> tuple[list[Held], list[str]]:
    """serve_queue as it decided before Pass: each held incident from the state read whole."""
    still, told = [], []
    for held in s.queue:
        req = CapacityRequest(
            cluster=s.cluster, incident_id=held.incident_id, placement=held.placement, action=ActionClass.REPLACE_NODE
        )
        granted, why = budget.capacity_decision(s, req, now)
        if granted:
            coordination.grant(s, held.incident_id, held.run_id, held.placement, now)
            told.append(held.incident_id)
        else:
            still.append(held if held.reason == why else held.model_copy(update={"reason": why}))
    s.queue = still
    return still, told


@settings(max_examples=300, deadline=None)
@given(states, st.lists(st.tuples(st.sampled_from(NODES), placements), max_size=8), st.integers(600, 1900))
def test_a_pass_over_the_line_decides_as_each_decision_read_whole(
    s: FleetState, line: list[tuple[str, Placement]], later: int
) -> None:
    s.queue = [
        Held(incident_id=f"h-{i}-{n}", run_id="r", node=p.node, placement=p, since=T0, reason="held")
        for i, (n, p) in enumerate(line)
    ]
    now = T0 + timedelta(seconds=later)
    before = copy.deepcopy(s)
    out = coordination.serve_queue(s, now)
    still, told = whole(before, now)
    assert s.queue == still
    assert [incident for incident, _ in out.signals] == told
    assert (s.grants, s.contained, s.containing, s.left, s.remediations) == (
        before.grants,
        before.contained,
        before.containing,
        before.left,
        before.remediations,
    )
