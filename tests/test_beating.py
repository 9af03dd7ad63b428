"""`beating`: an activity waiting on something slow (the cluster's coordinator) heartbeats
meanwhile, so a worker killed mid-wait is seen within the heartbeat timeout; cancelled, it
cancels what it waited for."""

from __future__ import annotations

import asyncio

import pytest
from temporalio import activity
from temporalio.testing import ActivityEnvironment

from gpuheal.clients.proc import beating


async def test_a_long_wait_heartbeats_and_returns_the_answer() -> None:
    beats: list[object] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(details)

    async def slow() -> str:
        await asyncio.sleep(0.35)
        return "granted"

    @activity.defn
    async def wait() -> str:
        return await beating(slow(), "waiting for the coordinator", every_s=0.1)

    assert await env.run(wait) == "granted"
    assert len(beats) >= 2 and all(b == ("waiting for the coordinator",) for b in beats)


async def test_a_quick_answer_sends_no_heartbeat() -> None:
    beats: list[object] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(details)

    @activity.defn
    async def wait() -> int:
        return await beating(asyncio.sleep(0, result=7), "x", every_s=0.1)

    assert await env.run(wait) == 7 and beats == []


async def test_a_cancelled_activity_cancels_what_it_waited_for() -> None:
    env = ActivityEnvironment()
    cancelled = asyncio.Event()

    async def never() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    @activity.defn
    async def wait() -> None:
        await beating(never(), "x", every_s=0.05)

    running = asyncio.ensure_future(env.run(wait))
    await asyncio.sleep(0.2)
    env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert cancelled.is_set()
