"""How often a held incident asks its coordinator again (gpuheal.core.fleet.line), as properties:
never sooner than the front of the line's period, never sooner further back, always within its
draw's spread and its cap (at least three asks within any hold bound of 20 minutes or more, so a
coordinator that lost the incident is asked again in time), and a whole line asking at a rate
that stays a few a second at 10,000 (defect 5: 8,460 held at a fixed 300 s were 28 asks a second
on one worker)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.core.fleet.line import (
    REASK_JITTER,
    REASK_MOST_S,
    REASK_S,
    line_asks_per_s,
    reask_after_s,
    reask_period_s,
)
from gpuheal.core.fleet.policy import FleetPolicy

places = st.one_of(st.none(), st.integers(min_value=1, max_value=200_000))
holds = st.floats(min_value=60.0, max_value=7 * 86400.0)
draws = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)
DEFAULT_HOLD = FleetPolicy().max_hold_s


@given(places, places, holds, draws)
def test_further_back_never_asks_sooner(a: int | None, b: int | None, hold: float, draw: float) -> None:
    near, far = sorted((a or 0, b or 0))
    assert reask_after_s(near, hold, draw) <= reask_after_s(far, hold, draw)


@given(places, holds, draws)
def test_each_wait_is_within_its_spread_and_its_cap(place: int | None, hold: float, draw: float) -> None:
    period = reask_period_s(place, hold)
    wait = reask_after_s(place, hold, draw)
    assert period * (1 - REASK_JITTER) <= wait <= period * (1 + REASK_JITTER)
    assert REASK_S <= period <= max(REASK_S, min(REASK_MOST_S, hold / 4))


@given(places, st.floats(min_value=1200.0, max_value=7 * 86400.0), st.lists(draws, min_size=3, max_size=3))
def test_a_held_incident_asks_again_at_least_three_times_within_its_bound(
    place: int | None, hold: float, drawn: list[float]
) -> None:
    """The safety net: wherever it is in line, a lost incident is asked about again in time
    (the workflow's loop: a wait is the last when what is left of the bound is no longer)."""
    at = 0.0
    for draw in drawn:
        wait = reask_after_s(place, hold, draw)
        assert hold - at > wait, (at, wait)  # not the last wait: it asks again
        at += wait


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=1, max_value=20_000), st.sampled_from([1200.0, 3600.0, DEFAULT_HOLD, math.inf]))
def test_a_whole_line_asks_as_its_rate_says(held: int, hold: float) -> None:
    """Every place at its shortest draw, summed: within the most line_asks_per_s gives."""
    rate = sum(1.0 / reask_after_s(p, hold, 0.0) for p in range(1, held + 1))
    assert rate <= line_asks_per_s(held, hold, shortest=True) + 1e-9


def test_ten_thousand_held_ask_a_few_times_a_second_not_tens() -> None:
    held = 10_000
    before = held / REASK_S  # every REASK_S wherever in line
    assert line_asks_per_s(held, DEFAULT_HOLD) < 4.1 and before > 33
    assert line_asks_per_s(held, DEFAULT_HOLD, shortest=True) < 5.4


@pytest.mark.parametrize("draw", [-0.1, 1.0, float("nan")])
def test_a_draw_outside_its_range_is_refused(draw: float) -> None:
    with pytest.raises(ValueError, match="draw must be in"):
        reask_after_s(1, DEFAULT_HOLD, draw)
