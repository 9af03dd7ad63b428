"""Cases the coordination state machine (tests/test_coordination.py) found, kept as plain tests:
each runs the machine's steps in order, so its checks (the bound on what gpuheal drains, the
budgets, the breaker) run at every step as they did when Hypothesis found it."""

from __future__ import annotations

from hypothesis import strategies as st

from gpuheal.core.fleet import budget
from tests.test_coordination import Coordinator


class Draws:
    """The machine's `data.draw`s, answered in order."""

    def __init__(self, *values: object) -> None:
        self.values = list(values)

    def draw(self, strategy: st.SearchStrategy[object], label: str = "") -> object:
        return self.values.pop(0)


def recreated_with_a_taken_back_grant_held(m: Coordinator) -> None:
    """gpu03 granted, then taken back (the containment bound lowered to 0 meanwhile) and held with
    its node drained; the coordinator is recreated and its rebuild finds gpu03 held and drained
    (as contained while held: one over the bound of 0), gpu04 granted, gpu00 held."""
    m.an_incident_asks("gpu03")
    m.an_incident_asks("gpu04")
    m.the_containment_bound_changes("0")
    m.a_batch_of_incidents_asks(["gpu00"], when_freed=False)
    m.an_incident_confirms(Draws("gpu03"))  # type: ignore[arg-type]
    m.time_passes_while_the_loop_is_away(1, then="gpu02")
    # visible: gpu00 yes, gpu02 no, gpu03 yes, gpu04 no; the earlier run not yet
    m.the_coordinator_is_terminated_and_recreated(Draws(True, False, True, False, False))  # type: ignore[arg-type]
    m.an_operator_resumes()  # gpu00 goes: the train pool's second slot, the cluster's third


def test_a_grant_never_puts_more_out_than_the_budget_plus_the_containment_bound() -> None:
    m = Coordinator()
    recreated_with_a_taken_back_grant_held(m)
    assert len(m.drained) == 3 and "gpuheal-c-gpu03" in m.s.containing
    m.a_batch_of_incidents_asks(["gpu08"], when_freed=False)  # another pool, budget 3 of 3 with gpu03
    assert "gpuheal-c-gpu08" not in m.s.grants and len(m.drained) == 3
    (held,) = [h for h in m.s.queue if h.node == "gpu08"]
    assert "the budget plus the containment bound (3)" in held.reason


def test_a_run_from_before_the_rule_still_grants_by_the_budget_alone() -> None:
    """How a coordinator started before GRANTS_WITHIN_ALL_OUT decided (its history replays so)."""
    m = Coordinator()
    recreated_with_a_taken_back_grant_held(m)
    m.s.decide_grants_by_the_budget_alone()
    m.live["gpu08"] = ("gpuheal-c-gpu08", "9")  # admitted, asking now
    granted, _ = budget.capacity_decision(m.s, m.capacity("gpu08"), m.now)
    assert granted  # within the budget alone: the fourth node out, over the bound of 3
