"""The errors a user can cause, as one or two plain lines and an exit code: never a traceback.

Every command runs under `explain` (cli/main.py). An error not listed here is a bug, and keeps
its traceback.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError
from temporalio.client import WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from gpuheal.core.errors import describe_error, quote

REFUSED = 1  # the incident or the coordinator said no, with its reason
BAD_INPUT = 2  # an argument or a setting is wrong
UNREACHABLE = 3  # Temporal cannot be reached
UNKNOWN = 4  # no such incident (or no coordinator yet)
CLOSED = 5  # the incident is closed: nothing left to steer
NO_WORKER = 6  # Temporal answered, no worker did


@dataclass
class Answer:
    code: int
    lines: list[str]


def explain(err: BaseException, target: str | None, address: str) -> Answer | None:
    """The answer for an error a user can cause; None for anything else (a bug)."""
    what = f"incident {target}" if target else "it"
    if isinstance(err, ValidationError):
        return Answer(BAD_INPUT, [f"gpuheal: invalid input: {describe_error(err)}"])
    if isinstance(err, WorkflowUpdateFailedError):
        cause = getattr(err.cause, "message", None) or str(err.cause)
        return Answer(REFUSED, [f"refused: {cause}"])
    if isinstance(err, RPCError):
        message = err.message
        if "already completed" in message:  # (Temporal says NOT_FOUND for it too)
            return Answer(
                CLOSED,
                [f"gpuheal: {what} is closed: nothing left to approve or abort", f"  `gpuheal status {target}`"],
            )
        if err.status == RPCStatusCode.NOT_FOUND or "not found" in message:
            return Answer(
                UNKNOWN, [f"gpuheal: no {what} in Temporal", "  `gpuheal incidents` lists the open and recent ones"]
            )
        if "no poller" in message or err.status == RPCStatusCode.DEADLINE_EXCEEDED:
            return Answer(NO_WORKER, [f"gpuheal: no worker answered for {what}: is `gpuheal worker` running?"])
        if err.status == RPCStatusCode.UNAVAILABLE:
            return Answer(UNREACHABLE, [f"gpuheal: cannot reach Temporal at {address} ({quote(message, 80)})"])
        return None
    if isinstance(err, RuntimeError) and "client connect" in str(err).lower():
        return Answer(
            UNREACHABLE,
            [
                f"gpuheal: cannot reach Temporal at {address}",
                "  start it, or set GPUHEAL_TEMPORAL_ADDRESS to where it runs",
            ],
        )
    if isinstance(err, ValueError):  # SettingsError included: it names the variable to set
        return Answer(BAD_INPUT, [f"gpuheal: {err}"])
    return None
