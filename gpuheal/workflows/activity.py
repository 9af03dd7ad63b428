"""Running an activity from a workflow: the one typed helper both workflows use.

`run(act.DRAIN_SLURM_NODE, request, summary=...)` checks at type-check time that `request` is
the activity's input model and returns its output model; the project's retry policy and
timeouts apply unless the call says otherwise. The summary shows in the Temporal UI; `task_queue`
(the workflow's own by default) sends it to another queue's workers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from gpuheal.activities.interface import Activity
    from gpuheal.core.errors import NON_RETRYABLE

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741

RETRY_FIRST_WAIT = timedelta(seconds=1)
RETRY_LONGEST_WAIT = timedelta(seconds=10)
RETRY_ATTEMPTS = 30


def retry_policy(attempts: int | None = None) -> RetryPolicy:
    """A policy made for each call: a RetryPolicy can be changed, and this module is shared by
    every workflow run in a worker (gpuheal.workers.main.SHARED_WORKFLOW_PARTS)."""
    return RetryPolicy(
        initial_interval=RETRY_FIRST_WAIT,
        backoff_coefficient=2.0,
        maximum_interval=RETRY_LONGEST_WAIT,
        maximum_attempts=RETRY_ATTEMPTS if attempts is None else attempts,
        non_retryable_error_types=list(NON_RETRYABLE),
    )


SHORT = timedelta(seconds=30)
# An incident's calls to its coordinator wait their turn in the worker's share of the updates in
# flight (GPUHEAL_COORDINATOR_UPDATES): in a storm a grant took p99 52 s (bench/storm.py), so a
# 30 s bound retried them, each retry queueing again.
COORDINATOR = timedelta(seconds=180)
# ...while the activity heartbeats (clients/proc.beating; confirm, contain and release, not the
# storm's admissions and grants: incident/capacity.py): a worker killed mid-wait is seen within
# 60 s and the call retried on another, not after the 180 s. (The SDK sends a heartbeat at most
# every 0.8 x this, 48 s: 12 s of margin for a busy server's answer.)
COORDINATOR_HEARTBEAT = timedelta(seconds=60)
# An activity that waits up to a deadline of its own (a checkpoint grace, a drain, a provider, a
# job's resume) gets that deadline plus this margin, so its own deadline always fires first and it
# answers with what it saw, rather than being timed out with nothing; it heartbeats meanwhile.
WAIT_MARGIN_S = 60.0
WAIT_HEARTBEAT = timedelta(seconds=30)


def past_deadline(deadline_s: float) -> timedelta:
    """The start-to-close timeout of an activity that waits up to `deadline_s` itself."""
    return timedelta(seconds=deadline_s + WAIT_MARGIN_S)


async def run(
    activity: Activity[I, O],
    arg: I,
    *,
    summary: str,
    timeout: timedelta = SHORT,
    heartbeat: timedelta | None = None,
    attempts: int | None = None,
    task_queue: str | None = None,
) -> O:
    retry = retry_policy(attempts)
    result: O = await workflow.execute_activity(
        activity.name,
        arg,
        result_type=activity.output,
        start_to_close_timeout=timeout,
        heartbeat_timeout=heartbeat,
        retry_policy=retry,
        summary=summary,
        task_queue=task_queue,
    )
    return result


async def ask_coordinator(activity: Activity[I, O], arg: I, *, summary: str, attempts: int | None = None) -> O:
    """An activity that waits on the cluster's coordinator: its long timeout, and a heartbeat."""
    return await run(
        activity, arg, summary=summary, timeout=COORDINATOR, heartbeat=COORDINATOR_HEARTBEAT, attempts=attempts
    )


async def run_waiting(activity: Activity[I, O], arg: I, *, summary: str, deadline_s: float) -> O:
    """An activity that waits up to `deadline_s` itself, heartbeating: timed out only past it."""
    return await run(activity, arg, summary=summary, timeout=past_deadline(deadline_s), heartbeat=WAIT_HEARTBEAT)


async def side_by_side(*steps: Coroutine[Any, Any, None]) -> None:
    """Independent steps at once, their activities in flight together. The first to fail cancels
    the others, then its error is raised: nothing goes on behind a step that failed, as nothing
    would have run after it one by one. (Tasks start in the order given: deterministic.)"""
    tasks = [asyncio.ensure_future(step) for step in steps]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
