"""The line, from a held incident's side: how long it waits before asking its coordinator again.

A held incident asks again now and then so that a coordinator recreated without it in its line, or
one that lost its place, decides it afresh (the request is keyed by the incident's run: asked
again, it is the same request, counted once). A fixed period made the whole line ask at a rate that
grows with its length: 8,460 held incidents every 300 s were 28 asks a second, each two workflow
tasks and an activity, and swamped the incidents' worker (bench/results/README.md, defect 5). An
incident further back in line gains less by asking often (its grant is further off, and a grant
comes as a notice anyway), so the period grows with its place, up to a cap that keeps the safety
net: a period of at most an hour and a quarter of the hold bound, so every incident asks again
at least three times within a bound of 20 minutes or more, whatever the draw. A draw spreads
incidents held together in a burst, so they do not ask in waves.

These numbers decide, in a running incident, whether its next wait is its last before the bound:
they are replayed under the marker REASK_BY_PLACE (gpuheal.workflows.incident.capacity), so a
change to them needs a marker of its own.
"""

from __future__ import annotations

import math

# The period of the first places in line: the re-ask that catches a lost place soonest.
REASK_S = 300.0
# Past the first REASK_S / REASK_PER_PLACE_S (150) places, an incident at place p asks every
# p * REASK_PER_PLACE_S seconds, up to the cap.
REASK_PER_PLACE_S = 2.0
# The cap: a period of at most an hour, and of at most a quarter of the hold bound (never below
# REASK_S).
# A line of 10,000 then asks about 4 times a second together (line_asks_per_s), not 33.
REASK_MOST_S = 3600.0
REASK_PER_HOLD = 4
# Each wait is drawn within +-REASK_JITTER of its period.
REASK_JITTER = 0.25


def reask_period_s(place: int | None, hold_s: float) -> float:
    """The period of an incident at `place` in line (1: next; None: not said, as when a later run
    of the incident asked since) held for at most `hold_s`."""
    return max(REASK_S, min((place or 0) * REASK_PER_PLACE_S, _cap_s(hold_s)))


def _cap_s(hold_s: float) -> float:
    """The longest period within a hold bound of `hold_s`."""
    return max(REASK_S, min(REASK_MOST_S, hold_s / REASK_PER_HOLD))


def reask_after_s(place: int | None, hold_s: float, draw: float) -> float:
    """Seconds it waits before asking again; `draw` in [0, 1) (the workflow's seeded random:
    replayed as drawn)."""
    if not 0.0 <= draw < 1.0:
        raise ValueError(f"draw must be in [0, 1), not {draw!r}")
    return reask_period_s(place, hold_s) * (1.0 - REASK_JITTER + 2.0 * REASK_JITTER * draw)


def line_asks_per_s(held: int, hold_s: float = math.inf, shortest: bool = False) -> float:
    """About how many re-asks a second a line of `held` incidents makes together, each at its
    nominal period (or, `shortest`, each at its shortest draw: the most): what the period is
    built to bound, a cluster's line on its incidents' worker."""
    cap = _cap_s(hold_s)
    front = min(held, int(REASK_S / REASK_PER_PLACE_S))  # at REASK_S
    ramp_end = min(held, int(cap / REASK_PER_PLACE_S))  # growing with the place
    ramp = math.log(ramp_end / front) / REASK_PER_PLACE_S if ramp_end > front else 0.0
    rate = front / REASK_S + ramp + max(0, held - ramp_end) / cap  # at the cap
    return rate / (1.0 - REASK_JITTER) if shortest else rate
