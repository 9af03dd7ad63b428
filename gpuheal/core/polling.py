"""How activities wait on Slurm: fast at first, where the recovery's seconds are (a checkpoint
lands in tens of milliseconds, a requeued job's first steps within a second of it running), then
backing off to the request's interval, so a long wait (a slow job, a held one) costs the
controller no more queries than a fixed interval: three or four more in a wait's first second.
A wait never asks more often than its last question took to answer (`after`): on a controller
slow to list its queue (22.05 lists all of it for one job) a waiter keeps it busy half the time
at most, however fast it would like to go."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

FIRST_POLL_S = 0.05
GROWTH = 1.5


def after(delay: float, last_took: float) -> float:
    """The pause before the next question: the pace's, or as long as the last one took."""
    return max(delay, last_took)


def delays(most: float, first: float = FIRST_POLL_S, fast_for: float = 0.0) -> Iterator[float]:
    """first (every pause of the first `fast_for` seconds), first x 1.5, ... up to `most`, then
    `most` for ever."""
    d = min(first, most)
    for _ in range(round(fast_for / d) - 1 if d > 0 and fast_for >= d else 0):
        yield d
    while True:
        yield d
        d = min(most, d * GROWTH)


class Pace:
    """One wait's questions: `asking()` before each, `await sleep()` after; the pause is the
    next of `delays`, never shorter than the question took (`after`); a wait whose answer is
    likely within its first moments asks at the first pace for `fast_for` seconds. `restart()`
    goes back to the fast start; `slept` is the pause so far."""

    def __init__(self, most: float, fast_for: float = 0.0) -> None:
        self.most, self.slept, self._fast_for = most, 0.0, fast_for
        self._delays = delays(most, fast_for=fast_for)
        self._asked = time.monotonic()

    def restart(self) -> None:
        self._delays = delays(self.most, fast_for=self._fast_for)

    def slower(self, most: float) -> None:
        """Pause up to `most` from now on, growing to it (a wait past its likely end asks less)."""
        if most > self.most:
            self._delays = delays(most, first=self.most)
            self.most = most

    def asking(self) -> None:
        self._asked = time.monotonic()

    async def sleep(self) -> None:
        pause = after(next(self._delays), time.monotonic() - self._asked)
        self.slept += pause
        await asyncio.sleep(pause)
