"""Cases the coordination state machine (tests/test_coordination.py) found, kept as plain tests:
each runs the machine's steps in order, so its checks (the bound on what gpuheal drains, the
budgets, the breaker) run at every step as they did when Hypothesis found it."""

from __future__ import annotations

from hypothesis import strategies as st

from gpuheal.core.fleet import budget
from gpuheal.core.fleet.models import CapacityRequest, FleetState, Grant
from gpuheal.core.fleet.policy import BudgetPolicy, FleetPolicy, VersionedPolicy
from gpuheal.core.models.base import ActionClass
from tests.test_coordination import T0, Coordinator, placement


class Draws:
    """The machine's `data.draw`s, answered in order."""

    def __init__(self, *values: object) -> None:
        self.values = list(values)

    def draw(self, strategy: st.SearchStrategy[object], label: str = "") -> object:
        return self.values.pop(0)


def recreated_with_a_taken_back_grant_held(m: Coordinator) -> None:
    """gpu03 granted, then taken back (the containment bound lowered to 0 meanwhile) and held with
    its node drained; the coordinator is recreated and its rebuild finds gpu03 held and drained
    (as contained while held: one over the bound of 0), gpu04 granted, gpu00 held. (Budget 3 in
    the cluster, 2 per pool; gpu00 to gpu07 are the train pool, gpu08 to gpu11 inference.)"""
    m.an_incident_asks("gpu03")
    m.an_incident_asks("gpu04")
    m.the_containment_bound_changes("0")
    m.a_batch_of_incidents_asks([("gpu00", False)], when_freed=False)
    m.an_incident_confirms(Draws("gpu03"))  # type: ignore[arg-type]
    m.time_passes_while_the_loop_is_away(1, then="gpu02")
    # visible: gpu00 yes, gpu02 no, gpu03 yes, gpu04 no; the earlier run not yet
    m.the_coordinator_is_terminated_and_recreated(Draws(True, False, True, False, False))  # type: ignore[arg-type]
    assert m.drained == {"gpu03", "gpu04"} and "gpuheal-c-gpu03" in m.s.containing


def reason(m: Coordinator, node: str) -> str:
    (held,) = [h for h in m.s.queue if h.node == node]
    return held.reason


def test_a_grant_never_puts_more_out_than_the_budget_plus_the_containment_bound() -> None:
    m = Coordinator()
    recreated_with_a_taken_back_grant_held(m)
    m.an_operator_resumes()  # the line is served: gpu00 would be the train pool's third node out
    assert m.drained == {"gpu03", "gpu04"}
    assert "1 out under the budget of pool train and 1 held nodes contained there (limit 2)" in reason(m, "gpu00")
    m.a_batch_of_incidents_asks([("gpu08", False)], when_freed=False)  # the inference pool: the cluster's third
    # gpu03's contained node is granted with it (under the budget now: nothing more out); full.
    assert m.drained == {"gpu03", "gpu04", "gpu08"} and "gpuheal-c-gpu03" in m.s.grants
    m.a_batch_of_incidents_asks([("gpu05", False)], when_freed=False)
    assert m.drained == {"gpu03", "gpu04", "gpu08"}


def test_more_contained_than_the_bound_holds_a_grant_the_budget_alone_would_make() -> None:
    """Two granted and one contained while held, the bound lowered to 0 since: a third grant is
    within the budget (3) but would put four out against 3 + 0, and the operators read why."""
    policy = FleetPolicy(budget=BudgetPolicy(cluster="3", per_pool=None), containment_limit="0")
    state = FleetState(cluster="c", policy=VersionedPolicy(version=1, policy=policy, changed_by="t", reason="t", at=T0))

    def out(node: str) -> Grant:
        return Grant(incident_id=f"gpuheal-c-{node}", node=node, pool="train", domains=(), at=T0)

    state.grants = {g.incident_id: g for g in (out("gpu00"), out("gpu04"))}
    state.containing = {g.incident_id: g for g in (out("gpu08"),)}
    ask = CapacityRequest(
        cluster="c", incident_id="gpuheal-c-gpu05", placement=placement("gpu05"), action=ActionClass.REPLACE_NODE
    )
    granted, why = budget.capacity_decision(state, ask, T0)
    assert not granted and why.startswith("2 out under the budget (limit 3) and 1 held nodes contained (bound 0)")
    state.decide_grants_by_the_budget_alone()  # a run from before the rule
    assert budget.capacity_decision(state, ask, T0)[0]


def test_a_run_from_before_the_rule_still_grants_by_the_budget_alone() -> None:
    """How a coordinator started before GRANTS_WITHIN_ALL_OUT decided (its history replays so):
    gpu00 goes at the resume, gpu08 after it, four out against a bound of three."""
    m = Coordinator()
    recreated_with_a_taken_back_grant_held(m)
    m.s.decide_grants_by_the_budget_alone()
    m.an_operator_resumes()
    assert m.drained == {"gpu00", "gpu03", "gpu04"}
    m.live["gpu08"] = ("gpuheal-c-gpu08", "9")  # admitted, asking now
    granted, _ = budget.capacity_decision(m.s, m.capacity("gpu08"), m.now)
    assert granted
