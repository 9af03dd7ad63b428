"""Indexes over the coordinator's two long lists, the arrivals kept whole and the line, so that a
decision's cost does not grow with them. A 10,000-node storm keeps every arrival whole for the
hour (the breaker's and the escalation's windows) and holds thousands in line; each admission
and request used to read both whole, about 50 ms each at 6,600, and a batch of them passed the
SDK's 2 s deadlock bound and the workflow task's timeout (bench/results/README.md, Storm).

Derived, never carried: built from the lists when first asked, then kept in step with what
changed since. Both lists only grow at the end and lose their oldest from the front; anything
else (a held incident taken from the middle of the line, a list built anew) is found and the
index is built again. What an index keeps of an entry never changes while the entry is in its
list: an arrival is frozen, and a held incident is only ever replaced by a copy with another
reason (its run and place stay). Each answer is the one the whole list gives
(tests/test_fleet_index.py). Pure, no I/O."""

from __future__ import annotations

import bisect
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any, Generic, TypeVar

from gpuheal.core.fleet.keys import keys
from gpuheal.core.fleet.models import Arrival, FleetState, Held

T = TypeVar("T", Arrival, Held)


class _Synced(Generic[T]):
    """A list as it was last seen, entry by entry, with a sequence number each and a count per
    incident run (`runs`); `sync` brings it in step (the oldest gone from the front, the newest
    added at the end) or says it must be built again."""

    def __init__(self) -> None:
        self.seen: deque[T] = deque()
        self.first_seq = 0  # the sequence number of seen[0]
        self.items: Sequence[T] = ()  # the list as last synced
        self.out_of_order = 0  # neighbours in the wrong order (_before): 0, the list is in order
        self.runs: Counter[tuple[str, str]] = Counter()  # (incident, run) -> its entries

    def sync(self, items: Sequence[T]) -> bool:
        """False: the list changed otherwise, build again."""
        seen = self.seen
        while seen and (not items or seen[0] is not items[0]):
            gone = seen.popleft()
            run = (gone.incident_id, gone.run_id)
            self.runs[run] -= 1
            if not self.runs[run]:
                del self.runs[run]
            self._drop(gone)
            if seen and self._before(seen[0], gone):
                self.out_of_order -= 1
            self.first_seq += 1
        n = len(seen)
        if n > len(items) or (n and seen[-1] is not items[n - 1]):
            return False
        for item in items[n:]:
            if seen and self._before(item, seen[-1]):
                self.out_of_order += 1
            self.runs[(item.incident_id, item.run_id)] += 1
            self._add(item, self.first_seq + len(seen))
            seen.append(item)
        self.items = items
        return True

    def _before(self, a: T, b: T) -> bool:
        """Whether a must come before b (never, for a list with no order)."""
        return False

    def _add(self, item: T, seq: int) -> None:
        raise NotImplementedError

    def _drop(self, item: T) -> None:
        raise NotImplementedError


class ArrivalIndex(_Synced[Arrival]):
    """The arrivals kept whole, by incident run, by repeat key (its node, each GPU's serial and
    UUID: gpuheal.core.fleet.keys) and by domain, each in the order they came."""

    def __init__(self) -> None:
        super().__init__()
        self.by_key: dict[str, deque[Arrival]] = {}
        self.by_domain: dict[str, deque[Arrival]] = {}

    def _before(self, a: Arrival, b: Arrival) -> bool:
        return a.at < b.at

    def _add(self, a: Arrival, seq: int) -> None:
        for key in keys(a.node, a.gpu_uuids, a.gpu_serials):
            self.by_key.setdefault(key, deque()).append(a)
        for domain in dict.fromkeys(a.domains):
            self.by_domain.setdefault(domain, deque()).append(a)

    def _drop(self, a: Arrival) -> None:
        named = keys(a.node, a.gpu_uuids, a.gpu_serials)
        for book, names in ((self.by_key, named), (self.by_domain, a.domains)):
            for name in dict.fromkeys(names):
                entries = book[name]
                entries.popleft()  # the oldest of all is the oldest under each of its names
                if not entries:
                    del book[name]


class LineIndex(_Synced[Held]):
    """The line, by incident: each of its runs in line, with its place."""

    def __init__(self) -> None:
        super().__init__()
        self.by_incident: dict[str, deque[tuple[int, str]]] = {}  # incident -> (sequence number, run id)

    def _add(self, h: Held, seq: int) -> None:
        self.by_incident.setdefault(h.incident_id, deque()).append((seq, h.run_id))

    def _drop(self, h: Held) -> None:
        places = self.by_incident[h.incident_id]
        places.popleft()
        if not places:
            del self.by_incident[h.incident_id]

    def places(self, incident_id: str) -> Iterator[tuple[int, str]]:
        """Its runs in line, first first: (1-based place, run id). Each place is checked against
        the line itself; were one wrong (the line changed in a way sync cannot see), the line is
        read whole instead."""
        found = [(seq - self.first_seq + 1, run_id) for seq, run_id in self.by_incident.get(incident_id, ())]
        line = self.items
        if all((line[p - 1].incident_id, line[p - 1].run_id) == (incident_id, r) for p, r in found):
            return iter(found)
        return iter([(i + 1, h.run_id) for i, h in enumerate(line) if h.incident_id == incident_id])


I = TypeVar("I", bound=_Synced[Any])  # noqa: E741


def _in_step(kept: object, kind: type[I], items: Sequence[Any]) -> I:
    """The index kept, brought in step with the list, or a new one built from it."""
    if isinstance(kept, kind) and kept.sync(items):
        return kept
    built = kind()
    built.sync(items)
    return built


def arrivals(s: FleetState) -> ArrivalIndex:
    index = s._arrival_index = _in_step(s._arrival_index, ArrivalIndex, s.arrivals)
    return index


def line(s: FleetState) -> LineIndex:
    index = s._line_index = _in_step(s._line_index, LineIndex, s.queue)
    return index


def _within(a: Arrival, now: datetime, window_s: float) -> bool:
    return (now - a.at).total_seconds() <= window_s


def count_within(s: FleetState, now: datetime, window_s: float) -> int:
    """How many arrivals are within the window. In time order (as the coordinator's clock adds
    them), the test is false, then true: found by bisection. Out of order (a server clock that
    stepped back), each is asked, as before."""
    items = s.arrivals
    if arrivals(s).out_of_order:
        return sum(1 for a in items if _within(a, now, window_s))
    return len(items) - bisect.bisect_left(items, True, key=lambda a: _within(a, now, window_s))


def drop_outside(s: FleetState, now: datetime, window_s: float) -> None:
    """Keep only the arrivals within the window (in place while in order: the index follows)."""
    if arrivals(s).out_of_order:
        s.arrivals = [a for a in s.arrivals if _within(a, now, window_s)]
    else:
        del s.arrivals[: len(s.arrivals) - count_within(s, now, window_s)]


def within_from_the_end(s: FleetState, entries: deque[Arrival], now: datetime, window_s: float) -> Iterator[Arrival]:
    """An index's entries within the window, newest first (all of them asked when out of order)."""
    ordered = not arrivals(s).out_of_order
    for a in reversed(entries):
        if _within(a, now, window_s):
            yield a
        elif ordered:
            return
