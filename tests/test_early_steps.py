"""The early steps side by side (issue 36, lever 5): the remediating notice, the drain and the
checkpoint ask go at once, so the node is drained while its jobs checkpoint (no new job lands on
a failing GPU during the grace) and the requeue follows the checkpoint at once. Time-skipping
server, stand-in activities (tests/fakes.py)."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from gpuheal.core.models.base import Stage
from gpuheal.workflows.remediation import GpuRemediationWorkflow
from tests.fakes import FakeCluster
from tests.test_workflow import env, report, settings, start_or_join, until_true, worker

__all__ = ["env"]  # the fixture, shared


async def test_the_node_is_drained_while_its_jobs_checkpoint(env: WorkflowEnvironment) -> None:
    """The checkpoint is held open: the drain is done meanwhile (before, it waited for the
    checkpoint), once; the requeue's second look at the node comes after the checkpoint."""
    fake, s = FakeCluster(), settings()
    fake.checkpoint_gate = asyncio.Event()
    async with worker(env, s, fake):
        handle = await start_or_join(env.client, s, report(79))

        async def drained_while_checkpointing() -> bool:
            status = await handle.query(GpuRemediationWorkflow.status)
            return any(r.stage == Stage.DRAIN and r.ended_at is not None for r in status.stages)

        await until_true(drained_while_checkpointing, "the drain done while the checkpoint is held open")
        status = await handle.query(GpuRemediationWorkflow.status)
        protect = [r for r in status.stages if r.stage == Stage.PROTECT]
        assert len(protect) == 1 and protect[0].ended_at is None  # (the gate holds it)
        assert not any(r.stage == Stage.REQUEUE for r in status.stages)
        fake.checkpoint_gate.set()
        result = await handle.result()
    assert result.outcome == "resolved", result.reason
    assert fake.calls.count("drain") == 1
    assert [i for i, c in enumerate(fake.calls) if c == "list_jobs"][1] > fake.calls.index("confirm")
    stages = {r.stage: r for r in result.stages}
    assert stages[Stage.DRAIN].ended_at <= stages[Stage.PROTECT].ended_at  # type: ignore[operator]


async def test_a_drain_slurm_refuses_stops_the_checkpoint_wait_beside_it(env: WorkflowEnvironment) -> None:
    """Nothing goes on behind a step that failed: the incident ends with the drain's error while
    the checkpoint is still unconfirmed (not waited out), nothing requeued."""
    fake, s = FakeCluster(), settings()
    fake.checkpoint_gate, fake.drain_gate, fake.drain_fails = asyncio.Event(), asyncio.Event(), True
    async with worker(env, s, fake):
        handle = await start_or_join(env.client, s, report(79))
        await until_true(lambda: "confirm" in fake.calls, "the checkpoint wait")
        fake.drain_gate.set()  # refused only once the checkpoint is being waited for
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
        history = await handle.fetch_history()
    assert "refused to drain" in str(failed.value.cause.cause)  # type: ignore[union-attr]
    assert "confirm" in fake.calls and not any(c.startswith("requeue") for c in fake.calls)
    waits = [
        e.event_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "wait_for_checkpoints"
    ]
    completed = {
        e.activity_task_completed_event_attributes.scheduled_event_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
    }
    assert len(waits) == 1 and waits[0] not in completed  # it did not wait the checkpoint out
