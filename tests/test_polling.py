"""Activities poll Slurm fast at first, then back off to the request's interval: a recovery's
first second is watched closely, a long wait costs the controller no more than before."""

from __future__ import annotations

from itertools import islice, pairwise

from hypothesis import given
from hypothesis import strategies as st

from gpuheal.core.polling import FIRST_POLL_S, after, delays


@given(most=st.floats(0.001, 30))
def test_waits_grow_from_the_first_to_the_interval_and_stay_there(most: float) -> None:
    seen = list(islice(delays(most), 60))
    assert seen[0] == min(FIRST_POLL_S, most)
    assert all(a <= b <= most for a, b in pairwise(seen))
    assert seen[-1] == most  # within 60 polls it reaches the interval (1.5^60 > 30 / 0.05)


def test_a_half_second_interval_polls_five_times_in_its_first_second_then_twice_a_second() -> None:
    first = list(islice(delays(0.5), 12))
    assert sum(1 for t in (sum(first[: i + 1]) for i in range(12)) if t <= 1.0) == 5  # was 2
    assert first[-3:] == [0.5, 0.5, 0.5]


@given(delay=st.floats(0, 30), took=st.floats(0, 30))
def test_a_wait_never_asks_more_often_than_the_last_answer_took(delay: float, took: float) -> None:
    assert after(delay, took) >= took and after(delay, took) >= delay


async def test_a_pace_adds_up_its_pauses_and_restarts_fast() -> None:
    from gpuheal.core.polling import Pace

    pace = Pace(0.2)
    for _ in range(3):
        pace.asking()
        await pace.sleep()
    assert pace.slept >= FIRST_POLL_S * (1 + 1.5 + 2.25) - 1e-9
    pace.restart()
    pace.asking()
    before = pace.slept
    await pace.sleep()
    assert FIRST_POLL_S <= pace.slept - before < 0.2  # back to the fast start, not the interval


@given(most=st.floats(0.06, 30), fast_for=st.floats(0, 2))
def test_a_fast_window_asks_at_the_first_pace_then_grows_as_before(most: float, fast_for: float) -> None:
    seen = list(islice(delays(most, fast_for=fast_for), 200))
    fast = round(fast_for / FIRST_POLL_S) if fast_for >= FIRST_POLL_S else 0
    assert seen[:fast] == [FIRST_POLL_S] * fast  # the window, at the first pace...
    assert abs(sum(seen[:fast]) - fast * FIRST_POLL_S) < 1e-9 and sum(seen[:fast]) <= fast_for + FIRST_POLL_S / 2
    extra = max(fast - 1, 0)  # ...whose last pause is the growth's first
    assert seen[extra:] == list(islice(delays(most), 200 - extra))  # then exactly the usual growth


def test_a_checkpoint_landing_at_130_ms_is_seen_within_50_ms_not_110() -> None:
    def seen_at(pauses: list[float], lands: float) -> float:
        t = 0.0
        for p in pauses:
            if t >= lands:
                return t
            t += p
        raise AssertionError("never asked after it landed")

    assert seen_at(list(islice(delays(0.2, fast_for=0.5), 50)), 0.13) - 0.13 <= FIRST_POLL_S
    assert seen_at(list(islice(delays(0.2), 50)), 0.13) - 0.13 > 0.1  # the pace before
