"""The line, from a held incident's side: how long it waits before asking its coordinator again.

A held incident asks again now and then so that a coordinator recreated without it in its line, or
one that lost its place, decides it afresh (the request is keyed by the incident's run: asked
again, it is the same request, counted once). A fixed period made the whole line ask at a rate that
grows with its length: 8,460 held incidents every 300 s were 28 asks a second, each two workflow
tasks and an activity, and swamped the incidents' worker (bench/results/README.md, defect 5). An
incident far back in line gains nothing by asking often (its grant is far off, and a grant comes
as a notice anyway), so the period grows with its place; a draw spreads incidents held together
in a burst, so they do not ask in waves.
"""

from __future__ import annotations

import math

# The period of the first places in line: the re-ask that catches a lost place soonest.
REASK_S = 300.0
# Past the first REASK_S / REASK_PER_PLACE_S places, an incident at place p asks every
# p * REASK_PER_PLACE_S seconds: a line of N then asks about (1 + ln(N / 150)) / 2 times a
# second (2.6 at 10,000; at most 3.5, every wait at its shortest draw), not N / 300 (33).
REASK_PER_PLACE_S = 2.0
# Each wait is drawn within +-REASK_JITTER of its period.
REASK_JITTER = 0.25


def reask_after_s(place: int | None, draw: float) -> float:
    """Seconds a held incident at `place` in line (1: next; None: not said, as by a coordinator
    before positions were answered) waits before asking again; `draw` in [0, 1) (the workflow's
    seeded random: replayed as drawn)."""
    if not 0.0 <= draw < 1.0:
        raise ValueError(f"draw must be in [0, 1), not {draw!r}")
    base = max(REASK_S, (place or 0) * REASK_PER_PLACE_S)
    return base * (1.0 - REASK_JITTER + 2.0 * REASK_JITTER * draw)


def line_asks_per_s_most(held: int) -> float:
    """The most re-asks a second a line of `held` incidents makes together (each at its shortest
    draw): the bound the period is built to keep."""
    first = min(held, int(REASK_S / REASK_PER_PLACE_S))
    rest = math.log(held / first) / REASK_PER_PLACE_S if held > first else 0.0
    return (first / REASK_S + rest) / (1.0 - REASK_JITTER)
