"""The soak's own patience: an hour's records are not lost to a minute in which the machine or
Temporal does not answer (the hour on e06ed70 stopped on one timed-out look while settling)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from temporalio.service import RPCError, RPCStatusCode

from infra.soak import run
from infra.soak.invariants import Records


class Listing:
    """`client.list_workflows`' iterator: it fails when it is first read, as the SDK's does."""

    def __init__(self, fail: bool, status: RPCStatusCode = RPCStatusCode.CANCELLED) -> None:
        self.fail, self.status = fail, status

    def __aiter__(self) -> Listing:
        return self

    async def __anext__(self) -> Any:
        if self.fail:
            raise RPCError("Timeout expired", self.status, b"")
        raise StopAsyncIteration


class Client:
    def __init__(self, failures: int, status: RPCStatusCode = RPCStatusCode.CANCELLED) -> None:
        self.failures, self.looks, self.status = failures, 0, status

    def list_workflows(self, query: str) -> Listing:
        self.looks += 1
        return Listing(self.looks <= self.failures, self.status)


def test_settling_looks_again_after_temporal_does_not_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "SETTLE_LOOK_S", 0.01)
    client = Client(failures=2)
    world = SimpleNamespace(clusters={"east": None})
    asyncio.run(run.settled(world, client, time.time() + 30))  # type: ignore[arg-type]
    assert client.looks == 3  # two looks failed, the third found nothing open
    refused = Client(failures=1, status=RPCStatusCode.INVALID_ARGUMENT)
    with pytest.raises(RPCError):  # a query Temporal refuses is not waited out
        asyncio.run(run.settled(world, refused, time.time() + 30))  # type: ignore[arg-type]


def test_the_records_are_read_again_and_a_lasting_failure_is_raised() -> None:
    tries: list[int] = []
    records = Records(end=0.0, events=[], samples=[], runs=[])

    async def read() -> Records:
        tries.append(1)
        if len(tries) < 3:
            raise RPCError("Timeout expired", RPCStatusCode.CANCELLED, b"")
        return records

    assert asyncio.run(run.gathered(read, pause_s=0.0)) is records and len(tries) == 3

    async def never() -> Records:
        raise RPCError("Timeout expired", RPCStatusCode.CANCELLED, b"")

    with pytest.raises(RPCError):
        asyncio.run(run.gathered(never, pause_s=0.0))
