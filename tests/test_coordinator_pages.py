"""The coordinator's payloads stay bounded however many incidents it holds (issue 36).

A workflow task's completion over gRPC's 4 MB is refused and the server then terminates the
workflow: a 10,000-report storm's coordinator was, 28 minutes in. Here, on Temporal's
time-skipping server, a coordinator holding 2,500 runs:
- looks for closed runs LOOK_PAGE at a time, one activity after another, and reaps what every
  page found (LOOK_IN_PAGES);
- answers `status` with each list cut and its whole length kept;
- has what each of its workflow tasks writes counted and said in the worker's log once it nears
  the limit (gpuheal.workers.payloads).
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from gpuheal.activities import interface as act
from gpuheal.activities.interface import implements
from gpuheal.core import ids
from gpuheal.core import messages as m
from gpuheal.core.fleet import packing, reaping
from gpuheal.core.fleet.models import Breaker, CoordinatorInput, FleetState, Held, RunRef, RunRefs
from gpuheal.core.fleet.policy import FleetPolicy, VersionedPolicy
from gpuheal.core.fleet.view import STATUS_MOST
from gpuheal.workers import payloads
from gpuheal.workers.main import Workers
from gpuheal.workers.payloads import PayloadSizes
from gpuheal.workflows.coordinator import reconcile
from gpuheal.workflows.domain import DomainIncidentWorkflow
from gpuheal.workflows.fleet import FleetCoordinator
from tests.test_coordinator_faults import Receiver, coordinator, env, placement

__all__ = ["env"]  # the fixture, shared with tests/test_coordinator_faults.py (it records histories)

HOLDING = 2_500  # three pages
T0 = datetime(2026, 12, 5, tzinfo=UTC)


def closed(ref: RunRef) -> bool:
    return int(ref.incident_id.rsplit("-", 1)[1]) % 2 == 0  # every other run has closed


class Looker(Receiver):
    """What each look was asked, page by page; `failing` pages of the look for closed runs
    fail (counted from the first page asked)."""

    def __init__(self, failing: frozenset[int] = frozenset()) -> None:
        super().__init__(up=True)
        self.pages: list[int] = []
        self.failing = failing

    def activities(self) -> list[object]:
        @implements(act.FIND_CLOSED_RUNS)
        async def find_closed(refs: RunRefs) -> RunRefs:
            self.pages.append(len(refs.runs))
            if len(self.pages) in self.failing:
                raise ApplicationError("frontend: deadline exceeded", non_retryable=True)
            return RunRefs(runs=tuple(r for r in refs.runs if closed(r)))

        @implements(act.FIND_NODES_LEFT_DRAINED)
        async def left_drained(refs: RunRefs) -> RunRefs:
            self.checked.append(len(refs.runs))
            return RunRefs()  # none still drained: every closed run's place is given back

        self.checked: list[int] = []
        names = {act.FIND_CLOSED_RUNS.name, act.FIND_NODES_LEFT_DRAINED.name}
        kept = [a for a in super().activities() if getattr(a, "__temporal_activity_definition").name not in names]
        return [*kept, find_closed, left_drained]


def holding(cluster: str, n: int) -> bytes:
    """A coordinator's carried state with n runs in line behind a tripped breaker (so none is
    granted meanwhile), never looked at for closed runs (so it looks at once)."""
    policy = VersionedPolicy(version=1, policy=FleetPolicy(), changed_by="test", reason="test", at=T0)
    s = FleetState(cluster=cluster, policy=policy)
    s.breaker = Breaker(tripped=True, at=T0, why="a test's storm", by="gpuheal")
    s.queue = [
        Held(
            incident_id=f"gpuheal-{cluster}-{i}",
            run_id=f"run-{i}",
            node=f"n{i:05d}",
            placement=placement(f"n{i:05d}"),
            since=T0,
            reason="held: breaker",
        )
        for i in range(n)
    ]
    return packing.pack(s, T0).data


async def started(env: WorkflowEnvironment, looker: Looker) -> tuple[Workers, WorkflowHandle[object, None]]:
    queue, cluster = f"tq-{uuid.uuid4()}", f"c{uuid.uuid4().hex[:8]}"
    sizes = [PayloadSizes()]
    workers = Workers(
        Worker(env.client, task_queue=queue, workflows=[DomainIncidentWorkflow], activities=looker.activities()),
        Worker(
            env.client,
            task_queue=ids.coordinator_queue(queue),
            workflows=[FleetCoordinator],
            activities=looker.activities(),
            interceptors=sizes,
        ),
    )
    await workers.__aenter__()
    handle: WorkflowHandle[object, None] = await env.client.start_workflow(
        m.COORDINATOR.name,
        args=[CoordinatorInput(cluster=cluster, seed=FleetPolicy(), on_own_queue=True), holding(cluster, HOLDING)],
        id=ids.coordinator_id(cluster),
        task_queue=ids.coordinator_queue(queue),
    )
    return workers, handle


async def test_a_look_at_thousands_of_runs_asks_in_pages_and_reaps_what_every_page_found(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(payloads, "TASK_BYTES_SAY", 50_000)  # (read as each payload is counted)
    caplog.set_level(logging.WARNING, logger="temporalio.workflow")
    looker = Looker()
    workers, handle = await started(env, looker)
    try:
        await env.sleep(timedelta(seconds=30))
        status = await m.FLEET_STATUS.ask(handle)
    finally:
        await workers.__aexit__(None, None, None)
    page = reconcile.LOOK_PAGE
    assert looker.pages == [page, page, HOLDING - 2 * page]  # one after another, none past a page
    gone = HOLDING // 2
    assert looker.checked == [page, gone - page]  # the still-drained check in pages too
    assert status.totals == {"held": HOLDING - gone} and len(status.held) == STATUS_MOST  # every page's reaped
    assert not any(closed(RunRef(incident_id=h.incident_id)) for h in status.held)
    said = [r.getMessage() for r in caplog.records if "MB of payloads" in r.getMessage()]
    assert any("activity find_closed_runs x1: " in s for s in said), said
    assert any("activity find_nodes_left_drained x1: " in s for s in said), said
    # No task wrote two pages: each said task wrote one look's page, and no more than a page.
    assert all(s.count(" x1: ") == 1 and " x2: " not in s for s in said), said
    assert all(float(s.split(" writes ")[1].split(" MB")[0]) < 0.2 for s in said), said


def test_a_run_ref_page_stays_far_below_grpcs_limit() -> None:
    """LOOK_PAGE runs of the longest names Temporal allows a workflow id (255) stay under 1 MB."""
    long = RunRef(incident_id="i" * 255, run_id=str(uuid.uuid4()), node="n" * 64)
    page = RunRefs(runs=(long,) * reconcile.LOOK_PAGE)
    assert len(page.model_dump_json()) < 1_000_000


async def test_a_page_that_fails_fails_the_look_and_the_next_look_reaps_them_all(env: WorkflowEnvironment) -> None:
    """The second page's look fails after its retries: nothing that look found is given back
    (its first page's closed runs stay in line, counted), and the next look, REAP_EVERY_S later,
    asks every page again and gives them all back."""
    looker = Looker(failing=frozenset({2}))
    workers, handle = await started(env, looker)
    try:
        await env.sleep(timedelta(seconds=30))
        first, checked = await m.FLEET_STATUS.ask(handle), list(looker.checked)
        await env.sleep(timedelta(seconds=reaping.REAP_EVERY_S + 30))
        then = await m.FLEET_STATUS.ask(handle)
    finally:
        await workers.__aexit__(None, None, None)
    page = reconcile.LOOK_PAGE
    assert looker.pages[:2] == [page, page] and checked == []  # (what its first page found: not checked, not applied)
    assert first.totals == {"held": HOLDING}  # the failed look gave nothing back
    assert looker.pages[2:] == [page, page, HOLDING - 2 * page]  # the next look, whole
    assert then.totals == {"held": HOLDING - HOLDING // 2}


async def test_a_listing_that_cannot_be_read_trips_the_breaker_and_never_fails_the_coordinator(
    env: WorkflowEnvironment,
) -> None:
    """A recreated coordinator's packed listing comes back unreadable: it is a failed rebuild
    (tripped, said, tried again), not a workflow task failing over and over."""
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    garbled = [b"gpuheal-open-incidents/1\nnot zlib at all"]

    @implements(act.FIND_OPEN_INCIDENTS_PACKED)
    async def find_open_packed(cluster: str) -> bytes:
        return garbled[0] if garbled else packing.pack_listing(receiver.open)

    served = [
        a
        for a in receiver.activities()
        if getattr(a, "__temporal_activity_definition").name != act.FIND_OPEN_INCIDENTS_PACKED.name
    ]
    async with Workers(
        Worker(
            env.client, task_queue=queue, workflows=[DomainIncidentWorkflow], activities=[*served, find_open_packed]
        ),
        Worker(
            env.client,
            task_queue=ids.coordinator_queue(queue),
            workflows=[FleetCoordinator],
            activities=[*served, find_open_packed],
        ),
    ):
        handle = await coordinator(env, queue, FleetPolicy())
        await env.sleep(timedelta(seconds=5))
        status = await m.FLEET_STATUS.ask(handle)
        assert status.breaker.tripped and "the listing is not readable" in status.breaker.why
        assert "coordinator_rebuilt" in receiver.delivered
        garbled.clear()  # readable again: the next round rebuilds
        await env.sleep(timedelta(seconds=reconcile.REBUILD_AGAIN_S + 5))
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        pending = (await handle.describe()).raw_description.pending_activities
        assert not [p for p in pending if p.activity_type.name == act.FIND_OPEN_INCIDENTS_PACKED.name]
