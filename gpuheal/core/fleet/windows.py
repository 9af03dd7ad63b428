"""Time windows over the coordinator's books: what is recent, what is still counted, what time has
freed. One test for the rate window and the cooldown (still_counted), used by forgetting and waking
alike, so they cannot disagree.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable
from datetime import datetime

from gpuheal.core.fleet import index, repeats
from gpuheal.core.fleet.models import Arrival, FleetState


def within(arrivals: Iterable[Arrival], now: datetime, window_s: float) -> list[Arrival]:
    """The arrivals within the window (a list read whole: for a count, index.count_within)."""
    return [a for a in arrivals if (now - a.at).total_seconds() <= window_s]


def forget_before(state: FleetState, now: datetime, compact: bool = False) -> bool:
    """Keep only what a window can still need (the state is carried across continue-as-new).
    True when a remediation left the rate's window or a node's cooldown ended: a held incident
    may go now. With `compact`, arrivals past the short windows move to the repeat window's
    compact books (gpuheal.core.fleet.repeats); before, they were all kept whole for a week."""
    p = state.policy.policy
    if compact:
        repeats.age(state, now)
    else:
        keep_s = max(p.repeat.window_s, p.breaker.window_s, p.escalation.window_s)
        index.drop_outside(state, now, keep_s)
    freed = time_freed(state, now)
    state.remediations, state.last_release = still_counted(state, now)
    return freed


def still_counted(state: FleetState, now: datetime) -> tuple[list[datetime], dict[str, datetime]]:
    """The remediations still in the rate's window, and the nodes still cooling down, at `now`."""
    b = state.policy.policy.budget
    recent = in_rate_window(state.remediations, now, b.rate_window_s)
    cooling = {n: t for n, t in state.last_release.items() if (now - t).total_seconds() < b.node_cooldown_s}
    return recent, cooling


def in_rate_window(remediations: list[datetime], now: datetime, window_s: float) -> list[datetime]:
    """The remediations within the rate's window. Kept in the order they were granted, the test is
    false, then true: found by bisection (a storm's hundreds are not each asked). Out of order (a
    server clock that stepped back), each is asked, as before."""
    if any(b < a for a, b in itertools.pairwise(remediations)):
        return [t for t in remediations if (now - t).total_seconds() < window_s]
    first = bisect.bisect_left(remediations, True, key=lambda t: (now - t).total_seconds() < window_s)
    return remediations[first:]


def time_freed(state: FleetState, now: datetime) -> bool:
    """Whether time has freed something forget_before has not yet forgotten: a remediation left
    the rate's window, or a node's cooldown ended."""
    recent, cooling = still_counted(state, now)
    return len(recent) != len(state.remediations) or len(cooling) != len(state.last_release)
