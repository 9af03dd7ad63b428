"""The worker's line to its coordinator (activities/batching.py: the Batcher): whatever the storm's
shape, every caller gets its own answer, within the worker's update slots, in batches of at most
BATCH_MOST in arrival order; a refused batch fails only the request the coordinator refuses; an
old coordinator without the batched update gets one request per update."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from gpuheal.activities import batching
from gpuheal.activities.batching import Batcher

MANY = "request_capacity_many"


class Refused(Exception):
    """The coordinator refused this one request."""


@dataclass
class Coordinator:
    """Answers n -> n * 10; refuses `bad` requests; optionally of a release without MANY."""

    bad: frozenset[int] = frozenset()
    knows_many: bool = True
    sends: list[list[int]] = field(default_factory=list)  # every update, as sent
    in_flight: int = 0
    most_in_flight: int = 0

    async def _enter(self, items: list[int]) -> None:
        self.sends.append(items)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.001)  # others queue meanwhile
        self.in_flight -= 1

    async def many(self, items: list[int]) -> list[int]:
        await self._enter(items)
        if not self.knows_many:
            cause = ApplicationError(f"Update handler for '{MANY}' expected but not found, known updates: [admit]")
            raise WorkflowUpdateFailedError(cause)
        if any(i in self.bad for i in items):
            raise WorkflowUpdateFailedError(ApplicationError("refused"))
        return [i * 10 for i in items]

    async def one(self, item: int) -> int:
        await self._enter([item])
        if item in self.bad:
            raise Refused(str(item))
        return item * 10


async def storm(
    c: Coordinator, callers: int, slots: int, most: int, waves: list[int], arrivals: list[int]
) -> dict[int, object]:
    """`callers` activities ask, arriving in waves (a caller sleeps its wave's ms first)."""
    line: Batcher[int, int] = Batcher(asyncio.Semaphore(slots), (MANY, c.many), c.one, most=most)
    answers: dict[int, object] = {}

    async def caller(i: int) -> None:
        await asyncio.sleep(waves[i % len(waves)] / 1000)
        arrivals.append(i)
        try:
            answers[i] = await line.ask(i)
        except Refused as err:
            answers[i] = err

    await asyncio.wait_for(asyncio.gather(*(caller(i) for i in range(callers))), 30)
    return answers


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    callers=st.integers(1, 120),
    slots=st.integers(1, 4),
    most=st.integers(1, 50),
    bad=st.frozensets(st.integers(0, 119), max_size=5),
    knows_many=st.booleans(),
    waves=st.lists(st.integers(0, 5), min_size=1, max_size=4),
)
def test_every_caller_gets_its_own_answer_within_the_slots_in_batches_in_order(
    callers: int, slots: int, most: int, bad: frozenset[int], knows_many: bool, waves: list[int]
) -> None:
    c = Coordinator(bad=bad, knows_many=knows_many)
    arrivals: list[int] = []
    answers = asyncio.run(storm(c, callers, slots, most, waves, arrivals))
    assert sorted(answers) == list(range(callers))
    for i, a in answers.items():
        if i in bad:
            assert isinstance(a, Refused) and str(a) == str(i)  # its own refusal, nobody else's
        else:
            assert a == i * 10
    assert c.most_in_flight <= slots
    assert all(1 <= len(s) <= most for s in c.sends)
    first_sent = list(dict.fromkeys(i for s in c.sends for i in s))
    assert first_sent == arrivals  # first come, first sent: across sends, not only within one
    # Each request reached an answering update once: a batch that was answered, or its own update.
    answered = [i for s in c.sends if len(s) == 1 or (knows_many and not bad & set(s)) for i in s]
    assert sorted(answered) == sorted(set(answered)) == list(range(callers))
    if not knows_many:  # found out by the batches already on their way, then one request per update
        assert sum(len(s) > 1 for s in c.sends) <= slots
    else:  # a refusal is its batch's: the requests of a refused batch, and only they, go alone
        refused = {i for s in c.sends if len(s) > 1 and bad & set(s) for i in s}
        alone = [s[0] for s in c.sends if len(s) == 1]
        assert refused <= set(alone)


async def test_a_batch_keeps_the_order_the_requests_came_in() -> None:
    c = Coordinator()
    gate = asyncio.Semaphore(1)
    line: Batcher[int, int] = Batcher(gate, (MANY, c.many), c.one, most=50)
    async with gate:  # every slot busy: all five queue
        asks = [asyncio.ensure_future(line.ask(i)) for i in (4, 2, 9, 1, 7)]
        await asyncio.sleep(0)
    assert await asyncio.gather(*asks) == [40, 20, 90, 10, 70]
    assert c.sends == [[4, 2, 9, 1, 7]]


async def queued(line: Batcher[int, int], gate: asyncio.Semaphore, items: list[int]) -> list[asyncio.Future[int]]:
    """Every slot busy while `items` ask: they queue, then the slot frees."""
    async with gate:
        asks = [asyncio.ensure_future(line.ask(i)) for i in items]
        await asyncio.sleep(0)
    return asks


async def test_a_refused_batch_goes_alone_and_later_requests_are_batched_again() -> None:
    c = Coordinator(bad=frozenset({2}))
    gate = asyncio.Semaphore(1)
    line: Batcher[int, int] = Batcher(gate, (MANY, c.many), c.one, most=50)
    first = await queued(line, gate, [1, 2, 3])
    done = await asyncio.gather(*first, return_exceptions=True)
    assert done[0] == 10 and isinstance(done[1], Refused) and done[2] == 30
    assert await asyncio.gather(*await queued(line, gate, [4, 5, 6])) == [40, 50, 60]
    assert c.sends == [[1, 2, 3], [1], [2], [3], [4, 5, 6]]


async def test_an_old_coordinator_gets_one_request_per_update_until_it_is_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(batching, "REPROBE_S", 0.5)
    c = Coordinator(knows_many=False)
    gate = asyncio.Semaphore(1)
    line: Batcher[int, int] = Batcher(gate, (MANY, c.many), c.one, most=50)
    assert await asyncio.gather(*await queued(line, gate, [1, 2])) == [10, 20]
    assert await asyncio.gather(*await queued(line, gate, [3, 4])) == [30, 40]
    assert c.sends == [[1, 2], [1], [2], [3], [4]]  # found out once, then alone
    c.knows_many = True  # the rollout finished: after REPROBE_S the next batch asks again
    await asyncio.sleep(0.5)
    assert await asyncio.gather(*await queued(line, gate, [5, 6])) == [50, 60]
    assert c.sends[-1] == [5, 6]


async def test_a_caller_cancelled_while_its_request_waits_in_line_is_never_sent() -> None:
    c = Coordinator()
    gate = asyncio.Semaphore(1)
    line: Batcher[int, int] = Batcher(gate, (MANY, c.many), c.one, most=50)
    async with gate:
        asks = [asyncio.ensure_future(line.ask(i)) for i in (1, 2, 3)]
        await asyncio.sleep(0)
        asks[1].cancel()  # its activity timed out before a slot came
        await asyncio.sleep(0)
    assert await asks[0] == 10 and await asks[2] == 30
    assert asks[1].cancelled() and c.sends == [[1, 3]]


async def test_a_sender_cancelled_mid_send_puts_the_others_back_in_line() -> None:
    c = Coordinator()
    gate = asyncio.Semaphore(1)
    started = asyncio.Event()

    async def slow_many(items: list[int]) -> list[int]:
        started.set()
        await asyncio.sleep(3600)
        return []

    line: Batcher[int, int] = Batcher(gate, (MANY, slow_many), c.one, most=50)
    async with gate:
        first = asyncio.ensure_future(line.ask(1))
        others = [asyncio.ensure_future(line.ask(i)) for i in (2, 3)]
        await asyncio.sleep(0)
    await asyncio.wait_for(started.wait(), 5)
    sender = first if not first.done() else None
    assert sender is not None
    line._many = c.many  # the coordinator answers again: the next send goes through
    sender.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sender
    assert await asyncio.wait_for(asyncio.gather(*others), 5) == [20, 30]


async def test_requests_of_refused_batches_go_again_in_the_order_they_came() -> None:
    """Batches in flight refused one after another: their requests go back in line in the order
    they came, not batch by batch (the coordinator's line is first come, first decided)."""
    sent: list[int] = []

    async def many(items: list[int]) -> list[int]:
        await asyncio.sleep(0.01 if items[0] == 0 else 0.02)  # refused, the first batch first
        raise WorkflowUpdateFailedError(ApplicationError("refused"))

    async def one(item: int) -> int:
        sent.append(item)
        await asyncio.sleep(0)
        return item * 10

    line: Batcher[int, int] = Batcher(asyncio.Semaphore(2), (MANY, many), one, most=3)
    assert await asyncio.gather(*(line.ask(i) for i in range(7))) == [i * 10 for i in range(7)]
    assert sent == list(range(7))


async def test_batches_grow_with_the_load_one_in_flight_per_line() -> None:
    """While a line's update is on its way, whatever arrives waits for the next: one update for
    all of them, not one per free slot (a storm's updates grow in size, not in number)."""
    c = Coordinator()
    started = asyncio.Event()

    async def slow_many(items: list[int]) -> list[int]:
        started.set()
        await asyncio.sleep(0.05)
        return await c.many(items)

    async def slow_one(item: int) -> int:
        started.set()
        await asyncio.sleep(0.05)
        return await c.one(item)

    line: Batcher[int, int] = Batcher(asyncio.Semaphore(8), (MANY, slow_many), slow_one, most=50, linger_s=0)
    first = asyncio.ensure_future(line.ask(0))
    await asyncio.wait_for(started.wait(), 5)
    rest = [asyncio.ensure_future(line.ask(i)) for i in range(1, 31)]
    assert await asyncio.gather(first, *rest) == [i * 10 for i in range(31)]
    assert c.sends == [[0], list(range(1, 31))]


async def test_under_load_a_sender_waits_a_moment_for_more() -> None:
    """After a batch of more than one (load), the next sender lingers (up to linger_s, or until
    the batch is full): requests arriving 20 ms apart go together, not one by one."""
    c = Coordinator()
    gate = asyncio.Semaphore(1)
    line: Batcher[int, int] = Batcher(gate, (MANY, c.many), c.one, most=50, linger_s=0.5)
    assert await asyncio.gather(*await queued(line, gate, [1, 2])) == [10, 20]  # load seen

    async def later(i: int) -> int:
        await asyncio.sleep(0.02 * (i - 3))
        return await line.ask(i)

    assert await asyncio.gather(*(later(i) for i in range(3, 8))) == [30, 40, 50, 60, 70]
    assert c.sends == [[1, 2], [3, 4, 5, 6, 7]]
    # A full batch does not wait for the rest of the moment.
    full: Batcher[int, int] = Batcher(gate, (MANY, c.many), c.one, most=3, linger_s=30)
    assert await asyncio.gather(*await queued(full, gate, [8, 9])) == [80, 90]
    assert await asyncio.wait_for(asyncio.gather(*(full.ask(i) for i in (10, 11, 12))), 5) == [100, 110, 120]


async def test_a_lone_request_goes_in_the_batched_update_when_that_is_the_newer() -> None:
    """`one_via_many` (admit_and_request_many): a lone request too, in a batch of one; the older
    update only for a coordinator without the batched one."""
    c, via = Coordinator(), []

    async def many(items: list[int]) -> list[int]:
        via.append("many")
        return await c.many(items)

    line: Batcher[int, int] = Batcher(asyncio.Semaphore(1), (MANY, many), c.one, one_via_many=True)
    assert await line.ask(4) == 40 and via == ["many"]
    old = Coordinator(knows_many=False)
    line = Batcher(asyncio.Semaphore(1), (MANY, old.many), old.one, one_via_many=True)
    assert await line.ask(5) == 50 and await line.ask(6) == 60
    assert old.sends == [[5], [5], [6]]  # found out once, then its own update
    assert c.sends == [[4]]


async def test_singles_to_a_coordinator_without_the_batched_update_go_side_by_side() -> None:
    """Found without the batched update (a rollout half done), the line sends one request per
    update, several at once within the slots: those already waiting their line's turn too."""
    c, now, most = Coordinator(knows_many=False), [0], [0]

    async def one(item: int) -> int:
        now[0] += 1
        most[0] = max(most[0], now[0])
        try:
            await asyncio.sleep(0.01)
            return item * 10
        finally:
            now[0] -= 1

    line: Batcher[int, int] = Batcher(asyncio.Semaphore(4), (MANY, c.many), one, most=3, linger_s=0)
    assert await asyncio.gather(*(line.ask(i) for i in range(12))) == [i * 10 for i in range(12)]
    assert most[0] > 1, "singles one at a time"
