"""A rebuild's second look knows the runs its coordinator admitted (REBUILD_KNOWS_ITS_OWN): a
snapshot listed before they were granted, released or held again shows them as they were, and
that is no sign of a coordinator lost before this one. Any run it never saw still trips the
breaker and is counted (Hypothesis over the pure decision, gpuheal.core.fleet.reaping.rebuild)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.core.fleet import coordination, reaping
from gpuheal.core.fleet.models import (
    Admitting,
    CapacityRequest,
    FleetState,
    OpenIncident,
    OpenIncidents,
    Placement,
)
from gpuheal.core.fleet.policy import BudgetPolicy, FleetPolicy, VersionedPolicy
from gpuheal.core.models.base import ActionClass, Stage

T0 = datetime(2026, 12, 5, tzinfo=UTC)
NODES = [f"gpu{i:02d}" for i in range(1, 7)]
STAGES = [Stage.HELD, Stage.REPAIR, Stage.DRAIN, Stage.VERIFY]


def place(node: str) -> Placement:
    return Placement(node=node, cluster_size=100, pool="h100", pool_size=100)


def fresh() -> FleetState:
    seed = FleetPolicy(budget=BudgetPolicy(cluster="2", node_cooldown_s=0))
    return FleetState(cluster="c", policy=VersionedPolicy(version=1, policy=seed, changed_by="t", reason="t", at=T0))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(NODES), st.booleans()), min_size=1, max_size=6, unique_by=lambda t: t[0]),
    st.data(),
)
def test_a_snapshot_of_its_own_runs_trips_nothing_and_changes_nothing(
    runs: list[tuple[str, bool]], data: st.DataObject
) -> None:
    s, now = fresh(), T0
    for node, released in runs:  # admitted, asked for capacity (granted or held), released or not
        incident, run = f"gpuheal-c-{node}", f"r-{node}"
        coordination.admit(
            s,
            Admitting(
                incident_id=incident,
                run_id=run,
                cluster="c",
                placement=place(node),
                action=ActionClass.REPLACE_NODE,
                what="x",
            ),
            now,
            compact=True,
        )
        req = CapacityRequest(
            cluster="c", incident_id=incident, run_id=run, placement=place(node), action=ActionClass.REPLACE_NODE
        )
        coordination.request(s, req, now)
        if released:
            coordination.release(s, incident, now, run_id=run)
            assert incident not in s.grants and all(h.incident_id != incident for h in s.queue)
        now += timedelta(seconds=1)
    before = s.model_copy(deep=True)
    stale = tuple(
        OpenIncident(
            incident_id=f"gpuheal-c-{n}", run_id=f"r-{n}", placement=place(n), stage=data.draw(st.sampled_from(STAGES))
        )
        for n, _ in runs
        if data.draw(st.booleans(), label=f"{n} in the snapshot")
    )
    said = reaping.rebuild(s, OpenIncidents(incidents=stale, earlier_run=""), now, knows_its_own=True)
    assert said == [] and not s.breaker.tripped
    assert s == before, "its own runs, read from a stale snapshot, changed its books"
    unknown = OpenIncident(incident_id="gpuheal-c-gpu99", run_id="r9", placement=place("gpu99"), stage=Stage.REPAIR)
    reaping.rebuild(s, OpenIncidents(incidents=(*stale, unknown), earlier_run=""), now, knows_its_own=True)
    assert s.breaker.tripped and "gpuheal-c-gpu99" in s.grants
