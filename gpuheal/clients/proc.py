"""Running other programs: the one helper every subprocess goes through.

Each program runs in a session of its own, so that on a timeout the whole process group is
killed (a hook script's children included) and reaped, never left running behind a retried
activity. Arguments go to the program as argv elements, never through a shell.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from temporalio import activity


class CommandFailed(RuntimeError):
    """The program exited non-zero; the message carries its stderr."""


class CommandTimedOut(RuntimeError):
    """The program ran past its time limit and was killed with its process group."""


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


async def run(
    argv: list[str],
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    what: str | None = None,
    heartbeat_s: float = 10.0,
    stdin: bytes | None = None,
) -> Completed:
    """Run argv to completion within timeout_s. `what` names it in errors (default: argv[0]).
    Inside an activity, a long run heartbeats every heartbeat_s, so Temporal knows it is alive."""
    name = what or argv[0]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        env=dict(env) if env is not None else None,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    talking = asyncio.ensure_future(proc.communicate(stdin))
    try:
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise CommandTimedOut(f"{name} timed out after {timeout_s:.0f} s (killed)")
            finished, _ = await asyncio.wait({talking}, timeout=min(remaining, heartbeat_s))
            if finished:
                break
            heartbeat(f"{name} running for {timeout_s - remaining:.0f} s")
    except BaseException:  # timeout or cancellation: never leave the program behind
        _kill_group(proc.pid)
        talking.cancel()
        await proc.wait()
        raise
    out, err = talking.result()
    done = Completed(proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace").strip())
    if check and done.returncode != 0:
        raise CommandFailed(f"{name} failed (exit {done.returncode}): {done.stderr[-500:]}")
    return done


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def heartbeat(detail: object) -> None:
    """Tell Temporal a long wait is still alive (a no-op outside an activity, e.g. in tools)."""
    if activity.in_activity():
        activity.heartbeat(detail)


T = TypeVar("T")
BEAT_EVERY_S = 5.0


async def beating(waited: Awaitable[T], detail: object, every_s: float = BEAT_EVERY_S) -> T:
    """`waited`'s result, heartbeating every `every_s` meanwhile: when the worker dies mid-wait,
    Temporal sees it within the activity's heartbeat timeout and retries on another worker,
    instead of after the whole start-to-close timeout (minutes, for a coordinator's answer)."""
    task = asyncio.ensure_future(waited)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=every_s)
            if done:
                return task.result()
            heartbeat(detail)
    finally:
        if not task.done():  # the activity was cancelled: so is what it waited for
            task.cancel()
