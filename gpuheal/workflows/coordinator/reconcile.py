"""What the coordinator holds, checked against the incidents really open: rebuilt from them when
it starts afresh, and given back by closed runs, looked for beside the loop while any holds
something (gpuheal.core.fleet.reaping decides; here are the activities that look)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

from gpuheal.workflows.activity import run
from gpuheal.workflows.coordinator.state import CoordinatorState

with workflow.unsafe.imports_passed_through():
    from gpuheal.activities import interface as act
    from gpuheal.core.fleet import coordination, reaping
    from gpuheal.core.fleet.coordination import Effects
    from gpuheal.core.fleet.models import Breaker, RunRef, RunRefs

# A look for closed runs: describes, 16 at a time, of every holder (thousands in a storm).
LOOK: dict[str, Any] = {"timeout": timedelta(minutes=3), "attempts": 3}


async def rebuild(c: CoordinatorState) -> None:
    """Started afresh: incidents of the cluster may be open already (this coordinator was
    terminated by hand, or its namespace restored). What they hold is rebuilt from them
    (gpuheal.core.fleet.reaping.rebuild); one that cannot be listed trips the breaker too."""
    try:
        found = await run(
            act.FIND_OPEN_INCIDENTS, c.fleet.cluster, summary="rebuild from the open incidents", attempts=5
        )
    except ActivityError as err:
        why = f"could not list the open incidents to rebuild from ({err.cause or err}): check them (`gpuheal fleet`)"
        c.fleet.breaker = Breaker(tripped=True, at=workflow.now(), why=why, by="gpuheal")
        c.notes.append(("coordinator_rebuilt", "critical", why))
        return
    c.apply(Effects(notes=reaping.rebuild(c.fleet, found, workflow.now())))


def reap_at(c: CoordinatorState) -> datetime | None:
    if c.reaping:
        return None
    return workflow.now() if c.reap_now else reaping.reap_due(c.fleet, workflow.now())


def reap(c: CoordinatorState, runs: list[RunRef]) -> None:
    """Look for closed runs among those holding something, beside the loop, and give back
    what they hold (gpuheal.core.fleet.reaping.reap): their nodes that Slurm still shows drained
    by them stay counted. A look that fails is said in the details and made again at the
    next one; it never fails the coordinator."""
    c.reaping, c.reap_now = True, False

    async def look() -> None:
        try:
            closed = await run(act.FIND_CLOSED_RUNS, RunRefs(runs=tuple(runs)), summary="look for closed runs", **LOOK)
            check = RunRefs(runs=(*closed.runs, *reaping.left_refs(c.fleet)))
            try:
                drained = check
                if check.runs:
                    drained = await run(act.FIND_NODES_LEFT_DRAINED, check, summary="still drained?", **LOOK)
            except ActivityError:  # Slurm not answering: every node counts as still drained
                drained = check
            c.apply(coordination.reap(c.fleet, closed.runs, drained.runs, workflow.now()))
        except ActivityError as err:
            c.undelivered.append(f"look for closed runs failed: {err.cause or err}")
            c.view_changed()
        finally:
            c.reaping = False

    c.look = asyncio.ensure_future(look())
