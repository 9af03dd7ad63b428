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
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from gpuheal.activities import interface as act
from gpuheal.activities.interface import implements
from gpuheal.core import ids
from gpuheal.core import messages as m
from gpuheal.core.fleet import packing
from gpuheal.core.fleet.models import Breaker, CoordinatorInput, FleetState, Held, RunRef, RunRefs
from gpuheal.core.fleet.policy import FleetPolicy, VersionedPolicy
from gpuheal.core.fleet.view import STATUS_MOST
from gpuheal.workers import payloads
from gpuheal.workers.main import Workers
from gpuheal.workers.payloads import PayloadSizes
from gpuheal.workflows.coordinator import reconcile
from gpuheal.workflows.domain import DomainIncidentWorkflow
from gpuheal.workflows.fleet import FleetCoordinator
from tests.conftest import start_time_skipping
from tests.histories.recording import Recorder, destination
from tests.test_coordinator_faults import Receiver, placement

HOLDING = 2_500  # three pages
T0 = datetime(2026, 12, 5, tzinfo=UTC)


class Looker(Receiver):
    """Every third run has closed; what each look was asked, page by page."""

    def __init__(self) -> None:
        super().__init__(up=True)
        self.pages: list[int] = []

    def activities(self) -> list[object]:
        @implements(act.FIND_CLOSED_RUNS)
        async def find_closed(refs: RunRefs) -> RunRefs:
            self.pages.append(len(refs.runs))
            return RunRefs(runs=tuple(r for r in refs.runs if int(r.incident_id.rsplit("-", 1)[1]) % 3 == 0))

        kept = [
            a
            for a in super().activities()
            if getattr(a, "__temporal_activity_definition").name != act.FIND_CLOSED_RUNS.name
        ]
        return [*kept, find_closed]


@pytest.fixture
async def env(request: pytest.FixtureRequest) -> AsyncIterator[WorkflowEnvironment]:
    recorder = Recorder()
    env = await start_time_skipping([recorder])
    yield env
    dest = destination()
    if dest is not None:
        await recorder.save(env.client, request.node.name, dest)
    await env.shutdown()


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
    closed = len(range(0, HOLDING, 3))
    assert status.totals == {"held": HOLDING - closed} and len(status.held) == STATUS_MOST  # every page's reaped
    assert all(int(h.incident_id.rsplit("-", 1)[1]) % 3 for h in status.held)
    said = [r.getMessage() for r in caplog.records if "MB of payloads" in r.getMessage()]
    assert any("activity find_closed_runs x1: " in s for s in said), said
    # No task wrote two pages: each said task wrote one look's page, and no more than a page.
    assert all(s.count(" x1: ") == 1 and " x2: " not in s for s in said), said
    assert all(float(s.split(" writes ")[1].split(" MB")[0]) < 0.2 for s in said), said


def test_a_run_ref_page_stays_far_below_grpcs_limit() -> None:
    """LOOK_PAGE runs of the longest names Temporal allows a workflow id (255) stay under 1 MB."""
    long = RunRef(incident_id="i" * 255, run_id=str(uuid.uuid4()), node="n" * 64)
    page = RunRefs(runs=(long,) * reconcile.LOOK_PAGE)
    assert len(page.model_dump_json()) < 1_000_000
