"""A rebuilt coordinator keys an open incident's grant by its chain's first run, as the incident
asks (workflow.info().first_execution_run_id). Temporal's visibility leaves first_run_id empty on
the dev server and on the cluster with PostgreSQL: keyed by a later run of a continue-as-new chain,
the grant was reaped at the next look as a closed run's, and a person could return the node its
incident still held (issue 37's hour, after a coordinator was terminated). On the real dev server."""

from __future__ import annotations

import asyncio
import uuid

from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Worker

from gpuheal.activities.fleet import first_run_id
from tests.conftest import start_dev_server


@workflow.defn(sandboxed=False)
class Chain:
    """Continues as new `n` times, then waits: an incident followed up by a later report."""

    @workflow.run
    async def run(self, n: int) -> None:
        if n > 0:
            workflow.continue_as_new(n - 1)
        await workflow.wait_condition(lambda: False)


async def listed(client: Client, workflow_id: str, first: str) -> object:
    """Its listing row once a later run of the chain is the one running (visibility lags)."""
    for _ in range(100):
        current = (await client.get_workflow_handle(workflow_id).describe()).run_id
        if current != first:
            async for wf in client.list_workflows(f'WorkflowId="{workflow_id}" AND ExecutionStatus="Running"'):
                if wf.run_id == current:
                    return wf
        await asyncio.sleep(0.1)
    raise AssertionError(f"no later run of {workflow_id} listed running")


async def test_a_chains_first_run_is_read_when_visibility_leaves_it_out() -> None:
    env = await start_dev_server()
    try:
        queue, wid = f"q-{uuid.uuid4()}", f"gpuheal-c-gpu01-{uuid.uuid4().hex[:6]}"
        async with Worker(env.client, task_queue=queue, workflows=[Chain]):
            first = await env.client.start_workflow(Chain.run, 2, id=wid, task_queue=queue)
            wf = await listed(env.client, wid, first.first_execution_run_id or "")
            assert await first_run_id(env.client, wf, asyncio.Semaphore(1)) == first.first_execution_run_id
            await first.terminate("done")
    finally:
        await env.shutdown()
