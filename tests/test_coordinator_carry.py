"""The coordinator carried across continue-as-new from PACKED on (Temporal's time-skipping
server, the real workflow): its state goes as a compressed binary payload beside its input, the
next run decides on the same books, and both runs' histories replay. Runs are made short here
(HISTORY_LIMIT_PACKED patched) so that a few updates reach the limit."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker

from gpuheal.clients.temporal import DATA_CONVERTER
from gpuheal.core import ids
from gpuheal.core import messages as m
from gpuheal.core.fleet.policy import BreakerPolicy, BudgetPolicy, FleetPolicy
from gpuheal.workers.main import Workers
from gpuheal.workflows import fleet
from gpuheal.workflows.domain import DomainIncidentWorkflow
from gpuheal.workflows.fleet import FleetCoordinator
from tests.conftest import start_time_skipping
from tests.histories.recording import recording
from tests.holder import Holder
from tests.test_coordinator_faults import Receiver, admit, ask, coordinator, holder

# Events: HISTORY_LIMIT_PACKED here, and where its recordings replay. Each recording is named with
# the limit it ran under (short_runs_<limit>_*), since a run continues as new where its limit says;
# those named short_runs_test_* ran under the first one.
SHORT_RUNS = 60
FIRST_SHORT_RUNS = 40


def short_runs_limit(recording: str) -> int | None:
    """The HISTORY_LIMIT_PACKED a recording of this module ran under; None: not one of them."""
    match = re.match(r"short_runs_(?:(\d+)_)?", recording)
    return None if match is None else int(match[1] or FIRST_SHORT_RUNS)


POLICY = FleetPolicy(
    budget=BudgetPolicy(cluster="2", per_pool=None, node_cooldown_s=0), breaker=BreakerPolicy(max_incidents=100)
)


@pytest.fixture
async def env(request: pytest.FixtureRequest) -> AsyncIterator[WorkflowEnvironment]:
    """As tests/test_coordinator_faults.py's; its recordings are named short_runs_<limit>_* (they
    replay with HISTORY_LIMIT_PACKED at that limit, tests/test_replay.py)."""
    async for env in recording(f"short_runs_{SHORT_RUNS}_{request.node.name}", start_time_skipping):
        yield env


async def test_the_coordinator_carries_its_books_packed_into_its_next_run(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fleet, "HISTORY_LIMIT_PACKED", SHORT_RUNS)
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    workflows = [FleetCoordinator, DomainIncidentWorkflow, Holder]
    # Unsandboxed: the patched limit is this module's, not a fresh import's.
    async with Workers(
        Worker(
            env.client, task_queue=queue, workflows=workflows, activities=receiver.activities(),
            workflow_runner=UnsandboxedWorkflowRunner(),
        ),
        Worker(
            env.client, task_queue=ids.coordinator_queue(queue), workflows=workflows,
            activities=receiver.activities(), workflow_runner=UnsandboxedWorkflowRunner(),
        ),
    ):  # fmt: skip
        handle = await coordinator(env, queue, POLICY)
        first_run = (await handle.describe()).run_id
        decided: dict[str, bool] = {}
        for i in range(1, 13):
            node = f"gpu{i:02d}"
            inc, run = await holder(env, queue, node)
            await admit(handle, node, POLICY)
            latest: WorkflowHandle[object, None] = env.client.get_workflow_handle(handle.id)
            decided[inc.id] = (await m.FLEET_REQUEST_CAPACITY.execute(latest, ask(inc.id, node, run))).granted
            if (await latest.describe()).run_id != first_run:
                break
        latest = env.client.get_workflow_handle(handle.id)
        assert (await latest.describe()).run_id != first_run, "the coordinator never continued as new"
        history = await env.client.get_workflow_handle(handle.id, run_id=first_run).fetch_history()
        last = history.events[-1]
        assert last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
        inp, packed = last.workflow_execution_continued_as_new_event_attributes.input.payloads
        assert packed.metadata["encoding"] == b"binary/plain" and packed.data.startswith(b"gpuheal-fleet-state/1\n")
        assert b'"state":null' in inp.data  # the books travel packed, not twice
        status = await m.FLEET_STATUS.ask(latest)
        assert sorted(g.incident_id for g in status.out_of_service) == sorted(i for i, g in decided.items() if g)
        assert sorted(h.incident_id for h in status.held) == sorted(i for i, g in decided.items() if not g)
        assert len(status.out_of_service) == 2
        await latest.terminate("test over")
        replayer = Replayer(
            workflows=[FleetCoordinator], data_converter=DATA_CONVERTER, workflow_runner=UnsandboxedWorkflowRunner()
        )
        for run_id in (first_run, (await latest.describe()).run_id):
            await replayer.replay_workflow(
                await env.client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
            )
