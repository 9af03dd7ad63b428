"""The one gate every workflow waits at: an answer that a signal or an update will bring, for at
most a bound, and what silence means when the bound runs out.

Approval, a held incident's grant, a domain incident's decision, the job recoveries' answers and
a borrowed node's early give-back all wait this way. Written once, so each waits with a durable
timer (its summary shows in the UI), and none can forget to handle the timeout.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow

T = TypeVar("T")


async def wait_for(answer: Callable[[], T | None], *, within: timedelta, summary: str) -> T | None:
    """The answer once there is one; None if `within` ran out first (`summary` names the timer)."""
    try:
        await workflow.wait_condition(lambda: answer() is not None, timeout=within, timeout_summary=summary)
    except TimeoutError:
        return None
    return answer()


async def decide(answer: Callable[[], T | None], *, within: timedelta, summary: str, otherwise: Callable[[], T]) -> T:
    """The answer, or `otherwise()` (the policy's default, recorded as such) when none came in time."""
    got = await wait_for(answer, within=within, summary=summary)
    return got if got is not None else otherwise()
