"""The coordinator's state stays bounded at fleet scale (issue 33): a 10,000-node fleet's worst
week is carried across continue-as-new far below Temporal's 2 MiB, whole, and the repeat window
still counts what it counted. The decisions' cost on that state is bench/fleet_state.py's."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.fleet_state import GOAL_BYTES, HELD, OUT, Week, worst_week
from gpuheal.core.fleet import coordination, packing, repeats
from gpuheal.core.fleet.models import AdmitRequest, Arrival, FleetState, OpenIncident, OpenIncidents, Placement
from gpuheal.core.fleet.policy import FleetPolicy, RepeatPolicy, VersionedPolicy
from gpuheal.core.models.base import ActionClass, Stage

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def pack(s: FleetState, now: datetime, most: int = packing.MOST_BYTES) -> bytes:
    return packing.pack(s, now, most).data


@pytest.fixture(scope="module")
def week() -> Week:
    return worst_week(seed=33)


def test_the_worst_week_is_carried_far_below_temporals_limit_and_whole(week: Week) -> None:
    s = week.state
    packed = pack(s, week.now)
    assert len(packed) < GOAL_BYTES, f"{len(packed)} bytes carried"
    back = packing.unpack(packed)
    assert (len(back.grants), len(back.queue)) == (OUT, HELD)
    assert back.grants == s.grants and back.queue == s.queue and back.past == s.past
    assert sum(len(v) for k, v in back.past.items() if k.startswith("node:")) + len(back.arrivals) == 10_000


def test_a_node_seen_this_week_is_still_counted_after_the_state_is_carried(week: Week) -> None:
    """The week's first arrival, six days old, still counts for its node and its board."""
    s = packing.unpack(pack(week.state.model_copy(deep=True), week.now))
    (node_key, entries), *_ = ((k, v) for k, v in s.past.items() if k.startswith("node:"))
    assert repeats.count(s, node_key, week.now, s.policy.policy.repeat.window_s) == len(entries) >= 1
    assert repeats.seen(s, "gpuheal-c-x", week.runs[0], _node_of(s, week.runs[0]), week.now)


def _node_of(s: FleetState, run: str) -> str:
    key = repeats.run_key(run)
    return next(
        k.removeprefix("node:") for k, v in s.past.items() if k.startswith("node:") and any(r == key for _, r in v)
    )


def admit(s: FleetState, node: str, run: str, at: datetime, serial: str = "") -> str | None:
    req = AdmitRequest(
        incident_id=f"gpuheal-c-{node}", run_id=run, cluster="c", placement=Placement(node=node, cluster_size=100),
        action=ActionClass.REPLACE_NODE, what="XID 79", seed=s.policy.policy, gpu_serials=(serial,) if serial else (),
    )  # fmt: skip
    answer, _ = coordination.admit(s, req, at, compact=True)
    return answer.repeat_offender


def fresh() -> FleetState:
    p = FleetPolicy(repeat=RepeatPolicy(incidents=3, window_s=7 * 86400))
    return FleetState(cluster="c", policy=VersionedPolicy(version=1, policy=p, changed_by="t", reason="t", at=T0))


def test_the_repeat_window_counts_across_days_and_carries_once_per_run() -> None:
    """Three runs of a node over five days make it a repeat offender, through two carries; an
    admission asked again (a retry days later) counts once; a board moved keeps its record."""
    s = fresh()
    assert admit(s, "gpu01", "run-a", T0, serial="S1") is None
    s = packing.unpack(pack(s, T0 + timedelta(days=1)))
    assert admit(s, "gpu01", "run-b", T0 + timedelta(days=2), serial="S1") is None
    assert admit(s, "gpu01", "run-a", T0 + timedelta(days=3), serial="S1") is None  # asked again: once
    s = packing.unpack(pack(s, T0 + timedelta(days=4)))
    why = admit(s, "gpu02", "run-c", T0 + timedelta(days=5), serial="S1")  # the board, on another node
    assert why == "repeat offender: 3 incidents on GPU serial S1 within 7 days"
    # a week after the first two, they have aged out: only run-c and this one count
    s = packing.unpack(pack(s, T0 + timedelta(days=9, hours=1)))
    assert admit(s, "gpu03", "run-d", T0 + timedelta(days=9, hours=2), serial="S1") is None


def test_a_state_too_big_to_carry_forgets_the_oldest_days_first_never_the_books(week: Week) -> None:
    s = week.state.model_copy(deep=True)
    packed = pack(s, week.now, most=300 * 1024)
    assert len(packed) <= 300 * 1024
    back = packing.unpack(packed)
    assert back.grants == week.state.grants and back.queue == week.state.queue
    assert back.past and min(t for v in back.past.values() for t, _ in v) > int(T0.timestamp()) + 86400


def test_a_fleets_worth_of_open_incidents_is_listed_within_temporals_limit_and_whole() -> None:
    """A recreated coordinator's rebuild reads every open incident as one activity's result, which
    Temporal refuses over 2 MiB: 10,000 of them (a whole fleet failing) packed stay far below it,
    though their JSON does not."""
    where = {"rack=r1": 40, "block=b1": 400}
    found = OpenIncidents(
        incidents=tuple(
            OpenIncident(
                incident_id=f"gpuheal-west-fleet{i:05d}",
                run_id=str(uuid.UUID(int=i)),
                placement=Placement(
                    node=f"fleet{i:05d}", cluster_size=10_000, pool="h100", pool_size=10_000, domains=where
                ),
                stage=Stage.HELD,
                contained=i % 10 == 0,
                since=T0 + timedelta(seconds=i),
            )
            for i in range(10_000)
        )
    )
    assert len(found.model_dump_json()) > 2 * 1024 * 1024  # (why it is packed)
    packed = packing.pack_listing(found)
    assert len(packed) < 1024 * 1024, f"{len(packed)} bytes"
    assert packing.unpack_listing(packed) == found
    with pytest.raises(packing.UnreadableState, match="gpuheal-fleet-state/1"):
        packing.unpack_listing(
            packing.pack(
                FleetState(
                    cluster="west",
                    policy=VersionedPolicy(version=1, policy=FleetPolicy(), changed_by="t", reason="t", at=T0),
                ),
                T0,
            ).data
        )


def test_a_state_this_build_cannot_read_is_refused_by_name() -> None:
    with pytest.raises(packing.UnreadableState, match="gpuheal-fleet-state/2"):
        packing.unpack(b"gpuheal-fleet-state/2\n...")


# node, serial ("" none), UUID ("" none), how many of its reports name that UUID, hours later, an
# earlier run asking again (its index; -1 none)
Step = tuple[str, str, str, int, float, int]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["gpu01", "gpu02", "gpu03"]),
            st.sampled_from(["", "S1", "S2"]),
            st.sampled_from(["", "GPU-aaaaaaaa-0000", "GPU-bbbbbbbb-0000"]),
            st.integers(min_value=1, max_value=3),
            st.floats(min_value=0, max_value=72),
            st.integers(min_value=-1, max_value=5),
        ),
        max_size=25,
    ),
    st.lists(st.booleans(), max_size=25),
)
def test_the_compact_books_say_what_the_whole_arrivals_said(steps: list[Step], carries: list[bool]) -> None:
    """Any run of arrivals (nodes, boards named by serial or UUID, days apart, admissions asked
    again, reports naming the serial, the UUID or both, one GPU in several reports), carried across
    continue-as-new at any step: the compact books name the same repeat offenders as the week of
    whole arrivals did."""
    whole, compact = fresh(), fresh()
    at, runs = T0, []
    for i, (node, serial, uuid_, reports, hours, again) in enumerate(steps):
        at += timedelta(hours=hours)
        if 0 <= again < len(runs):
            node, serial, uuid_, reports, run = runs[again]
        else:
            run = f"0190b2c4-{i:04d}-7000-8000-00000000{i:04d}"  # UUIDv7-like: one time head
            runs.append((node, serial, uuid_, reports, run))
        req = AdmitRequest(
            incident_id=f"gpuheal-c-{node}", run_id=run, cluster="c", placement=Placement(node=node, cluster_size=100),
            action=ActionClass.REPLACE_NODE, what="XID 79", seed=whole.policy.policy,
            gpu_serials=(serial,) if serial else (), gpu_uuids=(uuid_,) * reports if uuid_ else (),
        )  # fmt: skip
        said, _ = coordination.admit(whole, req, at)
        now_said, _ = coordination.admit(compact, req, at, compact=True)
        assert now_said.repeat_offender == said.repeat_offender, f"step {i}"
        if i < len(carries) and carries[i]:
            compact = packing.unpack(pack(compact, at))


@given(
    node=st.sampled_from(["gpu01", "gpu02"]),
    uuids=st.lists(st.sampled_from(["GPU-aaaa-bbbb-cccc-dddd", "GPU-1111-2222-3333-4444", "x"]), max_size=2),
    serials=st.lists(st.sampled_from(["S1", "S2", "node:gpu01"]), max_size=2),
    key=st.sampled_from(
        [
            "node:gpu01",
            "node:gpu02",
            "serial:S1",
            "serial:S2",
            "uuid:aaaabbbbcccc",
            "uuid:111122223333",
            "uuid:x",
            "x",
            "gpu:x",
        ]
    ),
)
def test_an_arrival_counts_for_exactly_its_keys(node: str, uuids: list[str], serials: list[str], key: str) -> None:
    """The storm's fast test of a key (repeats.counts_for) says what building its keys says."""
    a = Arrival(
        at=datetime(2026, 12, 1, tzinfo=UTC),
        incident_id="i",
        node=node,
        domains=(),
        gpu_uuids=tuple(uuids),
        gpu_serials=tuple(serials),
    )
    assert repeats.counts_for(a, key) == (key in repeats.keys(node, uuids, serials))
