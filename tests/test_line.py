"""How often a held incident asks its coordinator again (gpuheal.core.fleet.line), as properties:
never sooner than the front of the line's period, never sooner further back, always within its
draw's spread, and a whole line of any length asking at a rate that grows only with its logarithm
(defect 5: 8,460 held at a fixed 300 s were 28 asks a second on one worker)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.core.fleet.line import REASK_JITTER, REASK_PER_PLACE_S, REASK_S, line_asks_per_s_most, reask_after_s

places = st.integers(min_value=1, max_value=200_000)
draws = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)


@given(places, places, draws)
def test_further_back_never_asks_sooner(a: int, b: int, draw: float) -> None:
    near, far = sorted((a, b))
    assert reask_after_s(near, draw) <= reask_after_s(far, draw)


@given(st.one_of(st.none(), places), draws)
def test_each_wait_is_its_period_within_the_spread(place: int | None, draw: float) -> None:
    period = max(REASK_S, (place or 0) * REASK_PER_PLACE_S)
    wait = reask_after_s(place, draw)
    assert period * (1 - REASK_JITTER) <= wait <= period * (1 + REASK_JITTER)
    assert wait >= REASK_S * (1 - REASK_JITTER)  # the front of the line: as before, within the draw


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=1, max_value=20_000))
def test_a_whole_line_asks_within_its_bound(held: int) -> None:
    """Every place at its shortest draw, summed: within the bound the period is built to keep."""
    rate = sum(1.0 / reask_after_s(p, 0.0) for p in range(1, held + 1))
    assert rate <= line_asks_per_s_most(held) + 1e-9


def test_ten_thousand_held_ask_a_few_times_a_second_not_tens() -> None:
    held = 10_000
    before = held / (REASK_S * (1 - REASK_JITTER))  # every REASK_S wherever in line (at its shortest)
    now = sum(1.0 / reask_after_s(p, 0.0) for p in range(1, held + 1))
    assert now <= line_asks_per_s_most(held) < 3.6 and before > 40
    assert line_asks_per_s_most(100_000) < 5.1  # ten times the line: about 1.5 more a second


@pytest.mark.parametrize("draw", [-0.1, 1.0, float("nan")])
def test_a_draw_outside_its_range_is_refused(draw: float) -> None:
    with pytest.raises(ValueError, match="draw must be in"):
        reask_after_s(1, draw)
