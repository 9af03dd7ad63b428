"""The coordinator's state is packed beside its workflow task when it carries on (issue 36, run
D: bz2 on a storm's megabytes of JSON in the task passed the SDK's 2 s bound on every attempt, and
nothing was decided for 13 minutes). The real workflow on Temporal's dev server (real time: a
local activity that takes a while lets the run's waiting events in at the task's heartbeat), a
coordinator holding runs, started on the cluster's queue by the release before so that it carries
its state on at once (its move to its own queue):
- the state goes out through the local activity (bz2) and comes back whole in the next run;
- a local activity that fails leaves the state packed in the task, with the quick codec;
- a run that moves while the local activity packs (an update let in by the task's heartbeat)
  never carries what was packed before it: the next run has the update's change, and its notice.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from gpuheal.activities import interface as act
from gpuheal.activities.carrying import StatePacking
from gpuheal.activities.interface import implements
from gpuheal.clients.temporal import DATA_CONVERTER
from gpuheal.core import ids
from gpuheal.core import messages as m
from gpuheal.core.fleet import packing
from gpuheal.core.fleet.models import CoordinatorInput
from gpuheal.core.fleet.policy import FleetPolicy, ModeChange
from gpuheal.workers.main import Workers
from gpuheal.workflows.domain import DomainIncidentWorkflow
from gpuheal.workflows.fleet import FleetCoordinator
from tests.conftest import start_dev_server
from tests.histories.recording import recording
from tests.test_coordinator_faults import Receiver, admit
from tests.test_coordinator_pages import HOLDING, T0, holding

BZ2 = packing.MAGIC + b"bz2\n"


class Packer(Receiver):
    """The product's local activity, watched (what it packed, in order): `fails` makes it
    raise; `hold` keeps its first call waiting until the test lets it go (`entered` says it is
    packing)."""

    def __init__(self, fails: bool = False, hold: bool = False) -> None:
        super().__init__(up=True)
        self.fails, self.hold, self.calls = fails, hold, 0
        self.entered, self.go = asyncio.Event(), asyncio.Event()
        self.packed: list[bytes] = []

    def activities(self) -> list[object]:
        @implements(act.PACK_FLEET_STATE)
        async def pack_state(text: bytes) -> bytes:
            self.calls += 1
            if self.fails:
                raise ApplicationError("out of memory", non_retryable=True)
            if self.hold and self.calls == 1:
                self.entered.set()
                await self.go.wait()
            self.packed.append(await StatePacking().pack_fleet_state(text))
            return self.packed[-1]

        name = act.PACK_FLEET_STATE.name
        kept = [a for a in super().activities() if getattr(a, "__temporal_activity_definition").name != name]
        return [*kept, pack_state]


@pytest.fixture
async def dev(request: pytest.FixtureRequest) -> AsyncIterator[WorkflowEnvironment]:
    """A dev server of the test's own; with GPUHEAL_RECORD_HISTORIES its coordinators are saved
    as replay material (they ran with every default: they replay as recorded)."""
    async for env in recording(request.node.name, start_dev_server):
        yield env


def serving(env: WorkflowEnvironment, queue: str, packer: Packer) -> Workers:
    workflows, activities = [FleetCoordinator, DomainIncidentWorkflow], packer.activities()
    return Workers(
        Worker(env.client, task_queue=queue, workflows=workflows, activities=activities),
        Worker(env.client, task_queue=ids.coordinator_queue(queue), workflows=workflows, activities=activities),
    )


HELD = 100  # runs the coordinator holds (any size is packed beside the task)


async def moving(env: WorkflowEnvironment, queue: str) -> WorkflowHandle[object, None]:
    """A coordinator of the release before, on the cluster's queue, holding HELD runs: it
    moves to its own queue at once, carrying its state. A short workflow task timeout, so that a
    local activity that takes a while lets the events waiting for the run in (at 80 % of it)."""
    cluster = f"c{uuid.uuid4().hex[:8]}"
    return await env.client.start_workflow(
        m.COORDINATOR.name,
        args=[CoordinatorInput(cluster=cluster, seed=FleetPolicy(), on_own_queue=False), holding(cluster, HELD)],
        id=ids.coordinator_id(cluster),
        task_queue=queue,
        task_timeout=timedelta(seconds=2),
    )


async def carried_on(env: WorkflowEnvironment, handle: WorkflowHandle[object, None]) -> bytes:
    """The packed state the first run carried on (once it has), its history replayed."""
    for _ in range(300):
        history = await env.client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id).fetch_history()
        last = history.events[-1]
        if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the coordinator never carried on")
    _, packed = last.workflow_execution_continued_as_new_event_attributes.input.payloads
    await Replayer(workflows=[FleetCoordinator], data_converter=DATA_CONVERTER).replay_workflow(history)
    return packed.data


async def test_the_state_is_packed_beside_the_task_and_carried_whole(dev: WorkflowEnvironment) -> None:
    packer, queue = Packer(), f"tq-{uuid.uuid4()}"
    async with serving(dev, queue, packer):
        handle = await moving(dev, queue)
        data = await carried_on(dev, handle)
        status = await m.FLEET_STATUS.ask(dev.client.get_workflow_handle(handle.id))
        await dev.client.get_workflow_handle(handle.id).terminate("test over")
    # What the local activity packed. (Packed again if the server refused the task that carried
    # on, for events that came meanwhile: UNHANDLED_COMMAND, as for any continue-as-new.)
    assert data in packer.packed and data.startswith(BZ2)
    assert len(status.held) == HELD and status.breaker.tripped  # the same books, whole


async def test_a_pack_that_fails_beside_the_task_is_packed_in_it_quickly(dev: WorkflowEnvironment) -> None:
    packer, queue = Packer(fails=True), f"tq-{uuid.uuid4()}"
    async with serving(dev, queue, packer):
        handle = await moving(dev, queue)
        data = await carried_on(dev, handle)
        status = await m.FLEET_STATUS.ask(dev.client.get_workflow_handle(handle.id))
        await dev.client.get_workflow_handle(handle.id).terminate("test over")
    assert packer.calls >= 1 and not packer.packed  # (packed in the task, and carried)
    assert len(packing.unpack(data).queue) == HELD
    assert len(status.held) == HELD and status.breaker.tripped


@pytest.mark.parametrize("meanwhile", ["admit", "set_mode"])
async def test_a_run_that_moves_while_it_packs_never_carries_the_pack_made_before(
    dev: WorkflowEnvironment, meanwhile: str
) -> None:
    """An admission changes the books alone (the pack is checked against the state it was
    given); a mode change also has a notice to send (the run carries on only once nothing is
    left to send: the notice goes out)."""
    packer, queue = Packer(hold=True), f"tq-{uuid.uuid4()}"
    async with serving(dev, queue, packer):
        handle = await moving(dev, queue)
        await asyncio.wait_for(packer.entered.wait(), 30)
        # Let in by the task's heartbeat, the pack still running.
        if meanwhile == "admit":
            await admit(handle, "gpu-late", FleetPolicy())
        else:
            change = ModeChange(operator="alice", reason="observe while we look", mode="observe")
            await m.FLEET_SET_MODE.execute(handle, change)
        packer.go.set()
        data = await carried_on(dev, handle)
        for _ in range(100):  # the notice, sent by one run or the next
            if "policy_changed" in packer.delivered:
                break
            await asyncio.sleep(0.1)
        await dev.client.get_workflow_handle(handle.id).terminate("test over")
    assert data != packer.packed[0]  # packed again, in the task, with what came meanwhile
    state = packing.unpack(data)
    if meanwhile == "admit":
        assert "gpu-late" in state.model_dump_json(), "the late admission was lost with the first pack"
    else:
        assert state.policy.policy.mode == "observe", "the mode change was lost with the first pack"
        assert "policy_changed" in packer.delivered, f"the mode change's notice was lost: {packer.delivered}"


async def test_a_pack_past_what_one_task_may_write_twice_comes_back_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """The local activity's result rides in the same task's completion as the continue-as-new
    that carries it again: past packing.BESIDE_MOST it returns nothing (a small marker), and the
    coordinator packs in its task (as for a failure, above)."""
    text = packing.prepare(packing.unpack(holding("c", HOLDING)), T0)
    packed = await StatePacking().pack_fleet_state(text)
    assert packed.startswith(BZ2) and packing.unpack(packed).model_dump_json().encode() == text
    monkeypatch.setattr(packing, "BESIDE_MOST", len(packed) - 1)
    assert await StatePacking().pack_fleet_state(text) == b""
