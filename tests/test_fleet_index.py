"""The coordinator's indexes (gpuheal.core.fleet.index) answer exactly as the lists they index:
after any sequence of the changes the coordinator makes to them (an arrival or a held incident
added, the oldest dropped, one taken from the middle of the line, a held incident's reason
rewritten, a list built anew), kept in step or built again. And the windows read by bisection
are the windows the whole list gives."""

from __future__ import annotations

import itertools
from collections import Counter, deque
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.core.fleet import index, repeats, windows
from gpuheal.core.fleet.models import Arrival, FleetState, Held, Placement
from gpuheal.core.fleet.policy import FleetPolicy, VersionedPolicy

T0 = datetime(2026, 12, 5, tzinfo=UTC)
NODES = ("n1", "n2", "n3", "n4")
DOMAINS = ("rack=a", "rack=b")


def assert_index_true(s: FleetState) -> None:
    """Both indexes, as the coordinator reads them now, against the lists read whole."""
    a = index.arrivals(s)
    assert a.runs == Counter((x.incident_id, x.run_id) for x in s.arrivals)
    names = {k for x in s.arrivals for k in repeats.keys(x.node, x.gpu_uuids, x.gpu_serials)}
    assert set(a.by_key) == names
    for key in names:
        assert list(a.by_key[key]) == [x for x in s.arrivals if repeats.counts_for(x, key)], key
    assert set(a.by_domain) == {d for x in s.arrivals for d in x.domains}
    for domain, entries in a.by_domain.items():
        assert list(entries) == [x for x in s.arrivals if domain in x.domains], domain
    inversions = sum(1 for x, y in itertools.pairwise(s.arrivals) if y.at < x.at)
    assert a.out_of_order == inversions
    line = index.line(s)
    assert line.runs == Counter((h.incident_id, h.run_id) for h in s.queue)
    for incident in {h.incident_id for h in s.queue} | {"nobody"}:
        whole = [(i + 1, h.run_id) for i, h in enumerate(s.queue) if h.incident_id == incident]
        assert list(line.places(incident)) == whole, incident


def state() -> FleetState:
    policy = VersionedPolicy(version=1, policy=FleetPolicy(), changed_by="t", reason="t", at=T0)
    return FleetState(cluster="c", policy=policy)


def arrival(n: int, node: str, run: int, gpu: bool, domains: tuple[str, ...]) -> Arrival:
    return Arrival(
        at=T0 + timedelta(seconds=n),
        incident_id=f"i-{node}",
        run_id=f"r{run}",
        node=node,
        domains=domains,
        gpu_uuids=(f"GPU-{node}-0000-0000",) if gpu else (),
        gpu_serials=(f"S{node}",) if gpu else (),
    )


def held(node: str, run: int, why: str = "budget") -> Held:
    p = Placement(node=node, cluster_size=10)
    return Held(incident_id=f"i-{node}", run_id=f"r{run}", node=node, placement=p, since=T0, reason=why)


CHANGES = st.lists(
    st.tuples(
        st.sampled_from(
            ["add", "add", "add", "drop", "take", "take and add", "rewrite", "anew", "clear", "look", "look"]
        ),
        st.sampled_from(NODES),
        st.integers(0, 3),
        st.booleans(),
        st.sampled_from([(), DOMAINS[:1], DOMAINS, (DOMAINS[0], DOMAINS[0])]),
    ),
    min_size=8,
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(CHANGES)
def test_the_indexes_follow_every_change_the_coordinator_makes(changes: list) -> None:
    s = state()
    clock = 0
    for what, node, k, gpu, domains in changes:
        if what == "add":
            clock += k if gpu or k else -3  # (now and then a clock that stepped back)
            s.arrivals.append(arrival(clock, node, k, gpu, domains))
            s.queue.append(held(node, k))
        elif what == "drop":  # the oldest go (repeats.age, forget_before, a grant from the front)
            del s.arrivals[: k + 1]
            del s.queue[: k + 1]
        elif what.startswith("take") and s.queue:  # from the middle of the line (a grant, a release, a reap)
            s.queue = [h for i, h in enumerate(s.queue) if i != k % len(s.queue)]
            if what == "take and add":  # ... and another in line before the next look: as long as before
                s.queue.append(held(node, k))
        elif what == "rewrite":  # a held incident's reason rewritten (serve_queue, a domain)
            s.queue = [h.model_copy(update={"reason": f"why {k}"}) if h.node == node else h for h in s.queue]
        elif what == "anew":  # a list built anew (carried across continue-as-new)
            s.arrivals = [Arrival.model_validate(a.model_dump()) for a in s.arrivals]
            s.queue = list(s.queue)
        elif what == "clear":
            s.arrivals.clear()
            s.queue.clear()
        elif what == "look":  # the coordinator reads (and syncs) only now and then, not after each change
            assert_index_true(s)
    assert_index_true(s)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 10_000), max_size=40),
    st.booleans(),
    st.integers(0, 12_000),
    st.floats(0, 12_000, allow_nan=False),
)
def test_a_window_is_the_window_of_the_whole_list_in_order_or_not(
    at_s: list[int], in_order: bool, now_s: int, window: float
) -> None:
    """In time order (the coordinator's clock) read by bisection; out of order (a server clock
    that stepped back) each asked, as before: the same answer either way."""
    s = state()
    s.arrivals = [arrival(n, "n1", i, False, DOMAINS[:1]) for i, n in enumerate(sorted(at_s) if in_order else at_s)]
    now = T0 + timedelta(seconds=now_s)
    whole = [a for a in s.arrivals if (now - a.at).total_seconds() <= window]
    assert index.count_within(s, now, window) == len(whole)
    newest_first = list(index.within_from_the_end(s, index.arrivals(s).by_domain.get(DOMAINS[0], deque()), now, window))
    assert sorted(newest_first, key=id) == sorted(whole, key=id)
    granted = [a.at for a in s.arrivals]
    assert windows.in_rate_window(granted, now, window) == [t for t in granted if (now - t).total_seconds() < window]
    index.drop_outside(s, now, window)
    assert s.arrivals == whole
    assert_index_true(s)


def test_equal_books_are_equal_states_indexed_or_not() -> None:
    a, b = state(), state()
    a.arrivals.append(arrival(1, "n1", 1, True, DOMAINS))
    b.arrivals.append(arrival(1, "n1", 1, True, DOMAINS))
    index.arrivals(a)  # (only a is indexed)
    assert a == b
    b.arrivals.append(arrival(2, "n2", 1, False, ()))
    assert a != b
