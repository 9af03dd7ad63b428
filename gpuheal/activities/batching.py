"""A worker's line to a workflow's updates: `Batcher` sends requests that queued meanwhile
together, as one batched update, within the worker's update slots (a semaphore it shares).

Generic over the update's input and output: activities/fleet.py keeps one per cluster and kind
of request (admissions, capacity requests) to the cluster's coordinator, and its docstring says
why a storm needs it (Temporal accepts at most 10 updates in flight per workflow).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from temporalio.client import WorkflowUpdateFailedError

from gpuheal.core.fleet.models import BATCH_MOST

REPROBE_S = 60.0  # a coordinator found without the batched update is asked again after this
# Under load (the last batch held more than one request), a sender waits this long for more to
# join before it sends (or until the batch is full): a storm's batches grow to tens, and a lone
# request never waits. It costs a storm's requests this much latency, to cut its updates (each
# one a slot of the ten Temporal allows in flight, and two events of the coordinator's history).
LINGER_S = 0.25
LOAD_SEEN_S = 1.0  # a batch of more than one this recent is load (a lone request after a storm goes at once)
I = TypeVar("I")  # noqa: E741  (an update's input and output, as in core.messages)
O = TypeVar("O")  # noqa: E741


def unknown_update(err: WorkflowUpdateFailedError, name: str) -> bool:
    """The coordinator runs on a worker of an earlier release, which lacks this update."""
    why = str(err.cause or err)
    return "not found" in why and name in why


def refused_field(err: WorkflowUpdateFailedError, field: str) -> bool:
    """The coordinator runs on a worker of an earlier release, whose model forbids this field.
    It is named deep in the failure (the SDK's "Failed decoding arguments" wraps the model's
    error), so the whole chain of causes is read."""
    said: list[str] = []
    cause: BaseException | None = err
    while cause is not None and len(said) < 8:
        said.append(str(cause))
        cause = getattr(cause, "cause", None) or cause.__cause__
    return any(field in text for text in said)


class Batcher(Generic[I, O]):
    """One worker's requests to its coordinator, sent together: each caller waits for one of the
    worker's update slots, and whoever gets one sends the front of the line (at most `most`
    requests) as one batched update; each caller gets its own answer, first come first decided.

    One batch of a line is in flight at a time: what arrives meanwhile goes in the next, so
    batches grow with the load; under load a sender also lingers (LINGER_S) for more to join.

    A request goes alone, in its own update and slot: when it is all there is (unless
    `one_via_many`: then in a batch of one, the batched update being the newer, compact one);
    when the coordinator lacks the batched update (a worker of the release before runs it; asked
    again after REPROBE_S); when it was in a batch the coordinator refused as a whole (each of
    that batch then goes alone, so a refusal is only its own request's). A sender cancelled
    mid-send puts its batch back at the front of the line; a caller cancelled while its request
    is in another's batch is dropped from it (every decision is idempotent per incident run, so
    a request sent again is answered as before)."""

    def __init__(
        self,
        gate: asyncio.Semaphore,
        many: tuple[str, Callable[[list[I]], Awaitable[list[O]]]],
        one: Callable[[I], Awaitable[O]],
        most: int = BATCH_MOST,
        one_via_many: bool = False,
        linger_s: float = LINGER_S,
    ) -> None:
        self._gate, (self._name, self._many), self._one, self._most = gate, many, one, most
        self._one_via_many, self._linger_s = one_via_many, linger_s
        self._turn = asyncio.Lock()  # one batch of this line in flight at a time
        self._last, self._last_at = 0, 0.0  # how many the last batch held (more than one is load), when
        self._joined = asyncio.Event()  # set as a request joins the line
        self._line: list[tuple[I, asyncio.Future[O]]] = []
        self._came: dict[asyncio.Future[O], int] = {}  # each request's place in arrival order
        self._arrivals = itertools.count()
        self._alone: set[asyncio.Future[O]] = set()  # requests of a refused batch
        self._back = asyncio.Event()  # set when requests go back in line
        self._singly_until = 0.0  # monotonic: the coordinator lacked the batched update

    async def ask(self, item: I) -> O:
        mine: asyncio.Future[O] = asyncio.get_running_loop().create_future()
        self._came[mine] = next(self._arrivals)
        self._line.append((item, mine))
        self._joined.set()
        try:
            while not mine.done():
                if self._queued(mine):
                    # One batch (or one request of a refused batch) at a time while batched; to a
                    # coordinator without the batched update, singles go side by side within the
                    # gate, as they always did: one found waiting for the turn after the flip leaves it.
                    if not self.batched:
                        async with self._gate:
                            if self._queued(mine) and not self.batched:  # (else the turn's, as a batch)
                                await self._send()
                        continue
                    async with self._turn:
                        if self._queued(mine) and self.batched:  # not taken meanwhile, nor found old
                            await self._linger()
                            async with self._gate:
                                if self._queued(mine):
                                    await self._send()
                    continue
                # On its way in another caller's update: its answer, or back in line.
                back: asyncio.Future[Any] = asyncio.ensure_future(self._back.wait())
                try:
                    await asyncio.wait([mine, back], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    back.cancel()
            return await mine
        finally:
            self._line = [(i, f) for i, f in self._line if f is not mine]
            self._alone.discard(mine)
            self._came.pop(mine, None)
            if not mine.done():  # cancelled: a sender drops it, nobody waits for its answer
                mine.cancel()

    @property
    def batched(self) -> bool:
        return time.monotonic() >= self._singly_until

    async def _linger(self) -> None:
        """Under load (the last batch, within the last second, held more than one), until the
        batch is full or LINGER_S passed: more join meanwhile."""
        loaded = self._last > 1 and time.monotonic() - self._last_at < LOAD_SEEN_S
        if not loaded or self._linger_s <= 0 or not self.batched:
            return
        until = time.monotonic() + self._linger_s
        while len(self._line) < self._most and (left := until - time.monotonic()) > 0:
            self._joined.clear()
            try:
                await asyncio.wait_for(self._joined.wait(), left)
            except TimeoutError:
                return

    def _queued(self, mine: asyncio.Future[O]) -> bool:
        return not mine.done() and any(f is mine for _, f in self._line)

    def _take(self) -> list[tuple[I, asyncio.Future[O]]]:
        """The front of the line: a batch of requests that may go together, or one alone."""
        live = [(i, f) for i, f in self._line if not f.done()]
        n = 1
        if self.batched:
            while n < min(len(live), self._most) and not {live[0][1], live[n][1]} & self._alone:
                n += 1
        batch, self._line = live[:n], live[n:]
        self._last, self._last_at = len(batch), time.monotonic()
        return batch

    def _requeue(self, batch: list[tuple[I, asyncio.Future[O]]]) -> None:
        """Back in line, in the order they came (batches in flight come back in any order, and the
        coordinator's line, first come first decided, follows the order they are sent in)."""
        back = [(i, f) for i, f in batch if not f.done()] + self._line
        self._line = sorted(back, key=lambda entry: self._came.get(entry[1], -1))
        self._back.set()  # wakes the callers whose requests were in it
        self._back = asyncio.Event()

    async def _send(self) -> None:
        batch = self._take()
        try:
            if len(batch) > 1 or (self._one_via_many and self.batched and not {f for _, f in batch} & self._alone):
                try:
                    answers = await self._many([i for i, _ in batch])
                except WorkflowUpdateFailedError as err:
                    if unknown_update(err, self._name):
                        self._singly_until = time.monotonic() + REPROBE_S
                    else:
                        self._alone.update(f for _, f in batch)
                    self._requeue(batch)
                    return
                for (_, f), a in zip(batch, answers, strict=True):
                    if not f.done():
                        f.set_result(a)
                return
            for i, f in batch:
                try:
                    answer = await self._one(i)
                except asyncio.CancelledError:
                    raise
                except Exception as err:  # its caller's activity fails with it
                    if not f.done():
                        f.set_exception(err)
                else:
                    if not f.done():
                        f.set_result(answer)
        except asyncio.CancelledError:
            self._requeue(batch)
            raise
        except Exception as err:  # the batch failed on its way: each caller's activity retries
            for _, f in batch:
                if not f.done():
                    f.set_exception(err)
