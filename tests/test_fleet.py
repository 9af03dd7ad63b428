"""The coordinator's decisions (gpuheal.core.fleet): budget, rate, cooldown, breaker, escalation,
repeat offenders, modes. Pure functions of the state and the time."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from gpuheal.core.fleet import breaker, budget, coordination, reaping, steering, windows
from gpuheal.core.fleet import policy as fleet_policy
from gpuheal.core.fleet import view as fleet_view
from gpuheal.core.fleet.models import (
    AdmitRequest,
    Arrival,
    CapacityRequest,
    DomainDecision,
    FleetState,
    Grant,
    OpenIncident,
    OpenIncidents,
    OperatorAction,
    Placement,
    RunRef,
)
from gpuheal.core.fleet.policy import (
    BreakerPolicy,
    BudgetPolicy,
    EscalationPolicy,
    FleetPolicy,
    RepeatPolicy,
    VersionedPolicy,
)
from gpuheal.core.models.base import ActionClass, Stage
from gpuheal.core.models.incident import ApprovalPolicy

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def state(**policy: object) -> FleetState:
    p = FleetPolicy.model_validate(policy)
    return FleetState(cluster="c", policy=VersionedPolicy(version=1, policy=p, changed_by="t", reason="t", at=T0))


def place(node: str, pool: str = "h100", domains: dict[str, int] | None = None, size: int = 100) -> Placement:
    return Placement(node=node, cluster_size=size, pool=pool, pool_size=20, domains=domains or {})


def ask(node: str, **kw: object) -> CapacityRequest:
    return CapacityRequest(
        cluster="c", incident_id=f"i-{node}", placement=place(node, **kw), action=ActionClass.REPLACE_NODE
    )  # type: ignore[arg-type]


def grant(s: FleetState, node: str, pool: str = "h100", domains: tuple[str, ...] = ()) -> None:
    s.grants[f"i-{node}"] = Grant(incident_id=f"i-{node}", node=node, pool=pool, domains=domains, at=T0)


@pytest.mark.parametrize(
    ("spec", "total", "limit"),
    [("3", 100, 3), ("5%", 1000, 50), ("5%", 10, 1), ("0", 10, 0), ("0%", 10, 0), ("12.5%", 16, 2)],
)
def test_a_limit_is_a_count_or_a_share(spec: str, total: int, limit: int) -> None:
    assert fleet_policy.limit_of(spec, total) == limit


@pytest.mark.parametrize("spec", ["lots", "5.5", "-1", "5%%", "%", ""])
def test_a_bad_limit_is_refused_with_the_value_quoted(spec: str) -> None:
    with pytest.raises(ValueError, match=f"{re.escape(repr(spec))} is not a count"):
        BudgetPolicy(cluster=spec)


def test_the_cluster_budget_holds_the_fourth_node() -> None:
    s = state(budget=BudgetPolicy(cluster="3", rate=100, node_cooldown_s=0))
    for n in ("gpu01", "gpu02", "gpu03"):
        assert budget.capacity_decision(s, ask(n), T0)[0]
        grant(s, n)
    granted, why = budget.capacity_decision(s, ask("gpu04"), T0)
    assert not granted and why == "disruption budget: 3 of 3 nodes out of service (cluster)"


def test_pool_and_domain_budgets_hold_only_their_own() -> None:
    s = state(budget=BudgetPolicy(cluster="50%", per_pool="1", per_domain="1", rate=100, node_cooldown_s=0))
    grant(s, "gpu01", pool="h100", domains=("rack=r1",))
    held, why = budget.capacity_decision(s, ask("gpu02", pool="h100"), T0)
    assert not held and "(pool h100)" in why
    held, why = budget.capacity_decision(s, ask("gpu03", pool="a100", domains={"rack=r1": 4}), T0)
    assert not held and "(domain rack=r1)" in why
    assert budget.capacity_decision(s, ask("gpu04", pool="a100", domains={"rack=r2": 4}), T0)[0]


def test_the_rate_and_a_nodes_cooldown_hold_too() -> None:
    s = state(budget=BudgetPolicy(cluster="100", rate=2, rate_window_s=3600, node_cooldown_s=1800))
    s.remediations = [T0 - timedelta(minutes=10), T0 - timedelta(minutes=5)]
    granted, why = budget.capacity_decision(s, ask("gpu01"), T0)
    assert not granted and why.startswith("rate: 2 remediations within 3600 s")
    s.remediations = []
    s.last_release["gpu01"] = T0 - timedelta(minutes=10)
    granted, why = budget.capacity_decision(s, ask("gpu01"), T0)
    assert not granted and "cooling down" in why
    assert budget.capacity_decision(s, ask("gpu01"), T0 + timedelta(minutes=21))[0]


def arrivals(nodes: list[str], at: datetime = T0, domain: str = "") -> list[Arrival]:
    return [Arrival(at=at, incident_id=f"i-{n}", node=n, domains=(domain,) if domain else ()) for n in nodes]


def test_the_breaker_trips_on_a_burst_and_on_a_share_of_one_domain() -> None:
    s = state(breaker=BreakerPolicy(max_incidents=3, window_s=300, domain_share=0.75))
    s.arrivals = arrivals(["a", "b", "c"])
    assert breaker.breaker_trip(s, place("c"), T0) is None
    s.arrivals += arrivals(["d"])
    assert breaker.breaker_trip(s, place("d"), T0) == "4 new incidents within 300 s (more than 3)"
    s.arrivals = arrivals(["a", "b", "c", "d"], T0 - timedelta(minutes=10))  # outside the window
    assert breaker.breaker_trip(s, place("d"), T0) is None
    s = state(breaker=BreakerPolicy(max_incidents=100, domain_share=0.5))
    s.arrivals = arrivals(["a", "b", "c"], domain="rack=r1")
    why = breaker.breaker_trip(s, place("c", domains={"rack=r1": 4}), T0)
    assert why is not None and "3 of 4 nodes of rack=r1" in why


def test_half_a_domain_within_the_window_is_one_domain_incident() -> None:
    s = state(escalation=EscalationPolicy(domain_share=0.5, window_s=300, min_nodes=2))
    s.arrivals = arrivals(["gpu01"], domain="rack=r1")
    assert breaker.escalation(s, place("gpu01", domains={"rack=r1": 4}), T0) is None
    s.arrivals += arrivals(["gpu02"], domain="rack=r1")
    assert breaker.escalation(s, place("gpu02", domains={"rack=r1": 4}), T0) == ("rack=r1", ["gpu01", "gpu02"])


def test_the_third_incident_within_the_window_makes_a_repeat_offender() -> None:
    policy = RepeatPolicy(incidents=3, window_s=7 * 86400)
    # Each incident of a node is a new run of the same workflow id: runs count, not ids.
    wid = "gpuheal-c-gpu03"
    past = [
        Arrival(
            at=T0 - timedelta(days=d), incident_id=wid, run_id=f"r{d}", node="gpu03", gpu_uuids=("GPU-1",), domains=()
        )
        for d in (1, 2)
    ]
    assert breaker.repeat_offender(past, "gpu03", [], T0, policy) is None
    now = [*past, Arrival(at=T0, incident_id=wid, run_id="r0", node="gpu03", domains=())]
    assert breaker.repeat_offender([*past, past[0]], "gpu03", [], T0, policy) is None  # one run asking twice
    why = breaker.repeat_offender(now, "gpu03", [], T0, policy)
    assert why == "repeat offender: 3 incidents on gpu03 within 7 days"
    moved = [*past, Arrival(at=T0, incident_id="gpuheal-c-gpu09", node="gpu09", domains=(), gpu_uuids=("GPU-1",))]
    why = breaker.repeat_offender(moved, "gpu09", ["GPU-1"], T0, policy)  # the GPU moved: its record did too
    assert why == "repeat offender: 3 incidents on GPU GPU-1 within 7 days"
    old = [*[a.model_copy(update={"at": T0 - timedelta(days=9)}) for a in past], now[-1]]
    assert breaker.repeat_offender(old, "gpu03", [], T0, policy) is None


@pytest.mark.parametrize(
    ("mode", "action", "required", "asks"),
    [
        ("auto", ActionClass.REPLACE_NODE, (), False),
        ("auto", ActionClass.REPLACE_NODE, (ActionClass.REPLACE_NODE,), True),
        ("approve", ActionClass.RESET_GPU, (), True),
        ("approve", ActionClass.IGNORE, (), False),
    ],
)
def test_approve_mode_asks_a_human_for_every_action(
    mode: fleet_policy.Mode, action: ActionClass, required: tuple[ActionClass, ...], asks: bool
) -> None:
    assert budget.needs_approval(mode, action, ApprovalPolicy(required_for=required)) is asks


def test_old_arrivals_are_forgotten_but_what_a_window_needs_is_kept() -> None:
    s = state(repeat=RepeatPolicy(incidents=3, window_s=86400))
    s.arrivals = arrivals(["a"], T0 - timedelta(days=2)) + arrivals(["b"], T0 - timedelta(hours=2))
    windows.forget_before(s, T0)
    assert [a.node for a in s.arrivals] == ["b"]


def test_what_the_coordinator_shows_is_computed_on_the_real_cluster() -> None:
    """`gpuheal fleet` and the budget gauges: a share of the cluster the placements reported (not
    of one node), and every pool and domain budget with its limit and use."""
    s = state(budget=BudgetPolicy(cluster="10%", per_pool="25%", per_domain="1"))
    for node, pool, rack in (("gpu01", "h100", "rack=r1"), ("gpu02", "a100", "rack=r2")):
        where = Placement(node=node, cluster_size=200, pool=pool, pool_size=40, domains={rack: 8})
        coordination.request(
            s,
            CapacityRequest(cluster="c", incident_id=f"i-{node}", placement=where, action=ActionClass.REPLACE_NODE),
            T0,
        )
    shown = {u.name: (u.used, u.limit) for u in budget.budget_uses(s)}
    assert shown == {
        "cluster": (2, 20),
        "pool a100": (1, 10),
        "pool h100": (1, 10),
        "domain rack=r1": (1, 1),
        "domain rack=r2": (1, 1),
    }


def test_the_view_in_the_memo_cuts_its_lists_but_never_its_counts() -> None:
    """The memo goes into the coordinator's history with every change, so its lists are cut; the
    counts, the cluster's and pools' budgets and every domain budget in use stay whole."""
    s = state(budget=BudgetPolicy(cluster="10", per_pool="25%", per_domain="1"))
    for i in range(40):
        where = place(f"gpu{i:02d}", domains={f"rack=r{i}": 4})
        req = CapacityRequest(cluster="c", incident_id=f"i-{i}", placement=where, action=ActionClass.REPLACE_NODE)
        coordination.request(s, req, T0)
    st = fleet_view.status(s, T0)
    v = fleet_view.view(st, T0)
    assert (v.out, v.held) == (len(s.grants), len(s.queue)) == (5, 35)  # the rate's 5 granted
    assert len(v.out_nodes) == 5 and len(v.held_nodes) == fleet_view.VIEW_NODES
    assert [x.incident_id for x in v.held_nodes] == [h.incident_id for h in st.held[: fleet_view.VIEW_NODES]]
    shown = {u.name for u in v.budget}
    assert {"cluster", "pool h100"} <= shown and v.budgets_not_shown == len(st.budget) - len(v.budget)
    assert all(u.used > 0 for u in v.budget if u.name.startswith("domain "))
    whole = fleet_view.view(st, T0, cut=None)
    assert whole.whole and len(whole.held_nodes) == 35 and whole.budget == st.budget


def test_the_status_query_answers_within_grpcs_limit_however_long_the_line() -> None:
    """A query's answer goes back in a workflow task's completion, which gRPC caps at 4 MB (the
    server then terminates the workflow): each list is cut to STATUS_MOST, its length kept, and
    the view drawn from it counts the whole line and says it is not whole."""
    s = state(budget=BudgetPolicy(cluster="1"))
    for i in range(25):
        req = CapacityRequest(
            cluster="c", incident_id=f"i-{i}", placement=place(f"gpu{i:02d}"), action=ActionClass.REPLACE_NODE
        )
        coordination.request(s, req, T0)
    st = fleet_view.status(s, T0, most=10)
    assert (len(st.out_of_service), len(st.held), st.totals) == (1, 10, {"held": 24})
    assert [h.incident_id for h in st.held] == [h.incident_id for h in s.queue[:10]]
    live = fleet_view.view(st, T0, cut=None)
    assert (live.held, len(live.held_nodes), live.whole) == (24, 10, False)
    assert fleet_view.status(s, T0, most=24).totals == {}  # whole: nothing said
    assert fleet_view.view(fleet_view.status(s, T0, most=24), T0, cut=None).whole


@pytest.mark.parametrize("decision", ["release", "dismiss"])
def test_a_decided_domain_incident_holds_nothing_more_and_the_domain_may_escalate_again(decision: str) -> None:
    s = state(escalation=EscalationPolicy(domain_share=0.5, window_s=300, min_nodes=2))
    rack = {"rack=r1": 4}
    for node in ("gpu01", "gpu02"):
        req = AdmitRequest(
            incident_id=f"i-{node}",
            cluster="c",
            placement=place(node, domains=rack),
            action=ActionClass.REPLACE_NODE,
            what="XID 79",
            seed=s.policy.policy,
        )
        coordination.admit(s, req, T0)
    opened = s.domain_incidents["rack=r1"]
    assert breaker.escalated_domain(s, place("gpu03", domains=rack)) == opened  # open: it holds the rack's incidents
    d = DomainDecision(domain="rack=r1", decision=decision, operator="alice", reason="switch replaced")  # type: ignore[arg-type]
    steering.domain_decision(s, d, T0 + timedelta(seconds=60))
    assert breaker.escalated_domain(s, place("gpu03", domains=rack)) is None  # decided: later incidents go on
    assert steering.domain_decision(s, d, T0 + timedelta(seconds=61))[0] == f"rack=r1: already {decision}"
    # The reports before the decision do not count again; two new ones within the window do.
    later = T0 + timedelta(seconds=120)
    assert breaker.escalation(s, place("gpu03", domains=rack), later) is None
    s.arrivals += arrivals(["gpu03", "gpu04"], at=later, domain="rack=r1")
    assert breaker.escalation(s, place("gpu04", domains=rack), later) == ("rack=r1", ["gpu03", "gpu04"])


def test_incidents_taken_back_while_out_never_block_each_other() -> None:
    """Two grants taken back by the breaker stay counted (their nodes are drained); with the
    budget lowered below them meanwhile, both still go on after the resume: a node out already
    takes no more capacity (found by the coordinator's state machine, tests/test_coordination.py)."""
    s = state(budget=BudgetPolicy(cluster="2", rate=100, node_cooldown_s=0))
    by = OperatorAction(operator="alice", reason="test")
    for node in ("gpu01", "gpu02"):
        assert coordination.request(s, ask(node), T0)[0].granted
    steering.pause(s, by, T0)
    for node in ("gpu01", "gpu02"):
        assert not coordination.confirm(s, ask(node), T0)[0].granted
    assert set(s.contained) == {"i-gpu01", "i-gpu02"}
    assert [(u.used, u.limit) for u in budget.budget_uses(s)] == [(2, 2)]  # still out, still counted
    lowered = s.policy.policy.model_copy(update={"budget": BudgetPolicy(cluster="1", rate=100, node_cooldown_s=0)})
    steering.set_policy(s, lowered, "bob", "smaller", T0)
    _, out = steering.resume(s, by, T0)
    assert set(s.grants) == {"i-gpu01", "i-gpu02"} and not s.queue and not s.contained
    assert [i for i, n in out.signals if n.granted] == ["i-gpu01", "i-gpu02"]


def test_a_recreated_coordinator_rebuilds_from_the_open_incidents_and_starts_tripped() -> None:
    """Terminated by hand and started afresh by the next incident: it must not let new ones
    through past the budget it no longer knows is used, nor reset its breaker by forgetting."""
    s = state(budget=BudgetPolicy(cluster="1"))
    open_now = [
        OpenIncident(incident_id="i-gpu01", run_id="r1", placement=place("gpu01"), stage=Stage.APPROVAL),
        OpenIncident(incident_id="i-gpu02", run_id="r2", placement=place("gpu02"), stage=Stage.HELD, contained=True),
        OpenIncident(incident_id="i-gpu03", run_id="r3", placement=place("gpu03"), stage=Stage.TRIAGE),  # asks later
    ]
    notes = reaping.rebuild(s, OpenIncidents(incidents=tuple(open_now), earlier_run="Terminated at 12:00"), T0)
    assert list(s.grants) == ["i-gpu01"] and [h.incident_id for h in s.queue] == ["i-gpu02"]
    assert list(s.containing) == ["i-gpu02"]
    assert s.breaker.tripped and "recreated (its earlier run: Terminated at 12:00) with 2 open" in s.breaker.why
    assert s.breaker.nodes == ("gpu01", "gpu02") and [n[0] for n in notes] == ["coordinator_rebuilt"]
    decision, _ = coordination.request(s, ask("gpu03"), T0)
    assert not decision.granted and "circuit breaker tripped" in decision.reason
    # The cluster's first coordinator: the incident that started it asked it already.
    fresh = state()
    coordination.request(fresh, ask("gpu04"), T0)
    found = [OpenIncident(incident_id="i-gpu04", run_id="", placement=place("gpu04"), stage=Stage.DRAIN)]
    assert reaping.rebuild(fresh, OpenIncidents(incidents=tuple(found)), T0) == []
    assert not fresh.breaker.tripped


def test_a_held_node_is_contained_within_its_own_bound_and_never_while_tripped() -> None:
    s = state(budget=BudgetPolicy(cluster="1"), containment_limit="2")
    grant(s, "gpu00")
    held = [ask(f"gpu0{i}") for i in (1, 2, 3)]
    for req in held:
        coordination.request(s, req, T0)
    answers = [coordination.contain(s, req, T0)[0] for req in held]
    assert [a.granted for a in answers] == [True, True, False]
    assert "2 of 2 held nodes drained already (containment bound)" in answers[2].reason
    assert budget.containment_use(s).used == 2 and budget.budget_uses(s)[0].used == 1  # outside the budget
    steering.pause(s, OperatorAction(operator="alice", reason="storm"), T0)
    coordination.release(s, "i-gpu01", T0)  # a slot frees, but the breaker is tripped
    again, _ = coordination.contain(s, held[2], T0)
    assert not again.granted and "circuit breaker tripped" in again.reason


def test_a_node_a_terminated_run_left_drained_stays_counted_until_it_is_back() -> None:
    """The reaper must not fail open: a closed run's grant is given back, but a node Slurm
    still shows drained by it stays counted against the budget until it is back in service."""
    s = state(budget=BudgetPolicy(cluster="1", node_cooldown_s=0))
    a = ask("gpu01").model_copy(update={"run_id": "r1"})
    assert coordination.request(s, a, T0)[0].granted
    dead = RunRef(incident_id="i-gpu01", run_id="r1", node="gpu01")
    out = coordination.reap(s, [dead], [dead], [dead], T0)  # terminated; Slurm: still drained by it
    assert not s.grants and list(s.left) == ["gpu01"] and "counted against the budget" in out.notes[0][2]
    held, _ = coordination.request(s, ask("gpu02").model_copy(update={"run_id": "r2"}), T0)
    assert not held.granted and "disruption budget: 1 of 1" in held.reason
    out = coordination.reap(s, [], reaping.left_refs(s), [], T0)  # the next look: an operator resumed gpu01
    assert not s.left and [i for i, _ in out.signals] == ["i-gpu02"]  # the line moves
    # A node's next incident takes over what the closed run left: no second slot.
    t = state(budget=BudgetPolicy(cluster="1", node_cooldown_s=0))
    coordination.request(t, a, T0)
    coordination.reap(t, [dead], [dead], [dead], T0)
    again, _ = coordination.request(t, ask("gpu01").model_copy(update={"run_id": "r3"}), T0)
    assert again.granted and "taken over" in again.reason and not t.left and list(t.grants) == ["i-gpu01"]


def test_an_incident_ending_with_its_node_still_drained_gives_back_its_place_not_the_node() -> None:
    """Not granted after a containment, no capacity for a replacement, aborted after the drain:
    the node is still out, so it stays counted (left) and the next held one is not drained in
    its slot; nothing more than the budget plus the containment bound is ever out."""
    s = state(budget=BudgetPolicy(cluster="1", node_cooldown_s=0), containment_limit="1")
    a, b, c = (ask(n).model_copy(update={"run_id": "r"}) for n in ("gpu01", "gpu02", "gpu03"))
    assert coordination.request(s, a, T0)[0].granted
    for req in (b, c):
        coordination.request(s, req, T0)
    assert coordination.contain(s, b, T0)[0].granted  # 2 out: the budget's 1 and the bound's 1
    said, _ = coordination.release(s, "i-gpu01", T0, "r", left_drained=True)  # no capacity: still drained
    assert "still drained" in said and list(s.left) == ["gpu01"]
    said, _ = coordination.release(s, "i-gpu02", T0, "r", left_drained=True)  # not granted: still drained
    assert sorted(s.left) == ["gpu01", "gpu02"] and not s.containing
    refused, _ = coordination.contain(s, c, T0)  # the containment slot is free, but 2 are out
    assert not refused.granted and "the budget plus the containment bound (2)" in refused.reason
    assert not coordination.request(s, c, T0)[0].granted
    # A late release of another run of gpu03's incident frees nothing of this one's.
    said, _ = coordination.release(s, "i-gpu03", T0, "other-run")
    assert [h.incident_id for h in s.queue] == ["i-gpu03"] and "nothing held by run" not in said


def test_a_recreated_coordinator_counts_the_nodes_ended_incidents_left_drained() -> None:
    s = state(budget=BudgetPolicy(cluster="2"))
    gone = OpenIncident(incident_id="i-gpu07", run_id="", placement=place("gpu07"), stage=Stage.DONE)
    reaping.rebuild(s, OpenIncidents(incidents=(), earlier_run="Terminated at x", left=(gone,)), T0)
    assert list(s.left) == ["gpu07"] and budget.budget_uses(s)[0].used == 1 and s.breaker.tripped
    assert "1 nodes left drained" in s.breaker.why


def test_a_pools_budget_bounds_its_contained_nodes_too() -> None:
    s = state(budget=BudgetPolicy(cluster="100", per_pool="2"), containment_limit="50")
    grant(s, "gpu00")  # one out in pool h100 (of 2)
    s.sizes["cluster"] = 100
    held = [ask(f"gpu0{i}") for i in (1, 2)]
    for req in held:
        s.queue.append(coordination._held(req, T0, "test: held"))
    answers = [coordination.contain(s, req, T0)[0] for req in held]
    assert [a.granted for a in answers] == [True, False]
    assert "2 of 2 nodes out in pool h100" in answers[1].reason
