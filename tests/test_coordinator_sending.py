"""The coordinator's grant notices (Temporal's time-skipping server, the real coordinator): slots
freed at once are told in one workflow task, not one task each (in a storm a task cycle is a
second, so k grants took k seconds)."""

from __future__ import annotations

import asyncio
import uuid

from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from gpuheal.core import messages as m
from gpuheal.core.fleet.policy import BudgetPolicy, FleetPolicy, PolicyChange
from tests.test_coordinator_faults import Receiver, ask, coordinator, env, holder, worker

__all__ = ["env"]  # the fixture, shared with tests/test_coordinator_faults.py
SIGNALLED = EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED


async def test_slots_freed_at_once_are_told_in_one_workflow_task(env: WorkflowEnvironment) -> None:
    """Budget 1: gpu01 granted, gpu02-05 held. The budget raised to 5 frees four slots at once:
    the four grant notices leave in the same workflow task (no task completes between them)."""
    policy = FleetPolicy(budget=BudgetPolicy(cluster="1", node_cooldown_s=0))
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    async with worker(env, queue, receiver):
        handle = await coordinator(env, queue, policy)
        runs = [await holder(env, queue, f"gpu{i:02d}") for i in range(1, 6)]
        answers = [
            await m.FLEET_REQUEST_CAPACITY.execute(handle, ask(h.id, f"gpu{i:02d}", run))
            for i, (h, run) in enumerate(runs, 1)
        ]
        assert [a.granted for a in answers] == [True, False, False, False, False]
        raised = policy.model_copy(update={"budget": BudgetPolicy(cluster="5", node_cooldown_s=0)})
        change = PolicyChange(operator="olga", reason="more spares", policy=raised, expected_version=1)
        await m.FLEET_SET_POLICY.execute(handle, change)
        status = await m.FLEET_STATUS.ask(handle)
        assert len(status.out_of_service) == 5 and not status.held
        for _ in range(100):  # until the four have gone out, however it sends them
            events = (await handle.fetch_history()).events
            told = [i for i, e in enumerate(events) if e.event_type == SIGNALLED]
            if len(told) >= 4:
                break
            await asyncio.sleep(0.1)
    assert len(told) == 4, f"{len(told)} grant notices (gpu02-05's)"
    between = events[told[0] : told[-1]]
    completed = [e for e in between if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]
    assert not completed, f"the notices went out over {len(completed) + 1} workflow tasks"
