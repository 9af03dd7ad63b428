"""What the coordinator holds, checked against the incidents really open: rebuilt from them when
it starts afresh, and given back by closed runs, looked for beside the loop while any holds
something (gpuheal.core.fleet.reaping decides; here are the activities that look)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

from gpuheal.workflows.activity import run
from gpuheal.workflows.coordinator import sending
from gpuheal.workflows.coordinator.state import CoordinatorState
from gpuheal.workflows.coordinator.versions import (
    BOOKS,
    BORROWED_GO_BACK,
    LOOK_IN_PAGES,
    LOOK_UNTIL_SEEN,
    REBUILD_KNOWS_ITS_OWN,
    REBUILD_PACKED,
)

with workflow.unsafe.imports_passed_through():
    from gpuheal.activities import interface as act
    from gpuheal.core import render
    from gpuheal.core.fleet import coordination, domain_reaping, packing, reaping
    from gpuheal.core.fleet.coordination import Effects
    from gpuheal.core.fleet.models import Breaker, DomainIncident, OpenIncidents, RunRef, RunRefs

# A look for closed runs: describes, 16 at a time, of every holder (thousands in a storm).
LOOK: Mapping[str, Any] = MappingProxyType({"timeout": timedelta(minutes=3), "attempts": 3})
# Runs asked in one activity (from LOOK_IN_PAGES): about 110 KB of input, and a page's describes
# well inside LOOK's timeout on a loaded server. Part of the replay contract: a look in flight
# when a build with another page size takes over replays only with the same pages (change it
# behind a marker of its own).
LOOK_PAGE = 1_000
# The rebuild lists every open incident and asks each its status (thousands in a storm, on a
# loaded server): a long bound, kept alive by its heartbeat, tried again until it succeeds.
REBUILD: Mapping[str, Any] = MappingProxyType(
    {"timeout": timedelta(minutes=10), "heartbeat": timedelta(seconds=60), "attempts": 3}
)
REBUILD_AGAIN_S = 30.0  # between rounds of attempts while the rebuild fails
# How long an update waits for a rebuild that is under way before it is decided behind a tripped
# breaker (held): waiting updates hold Temporal's ten in-flight slots. Long: in a storm the
# listing waits behind the storm's activities (bench/results/storm.md, beside the test suite: a
# 60 s bound tripped a fresh cluster's breaker). A rebuild that fails stops the waits at once.
REBUILD_WAIT_S = 600.0
# A rebuild that did not see its earlier run and said nothing (found nothing out: no incident
# holding capacity, nothing drained) may have come within visibility's lag of a termination (an
# admission recreates the coordinator within a second): it looks once more this much later,
# beside the loop, and trips the breaker if an earlier run shows then (its books were true:
# nothing was out; an operator's pause is what could be lost).
VISIBILITY_LAG_S = 15.0


async def rebuild(c: CoordinatorState) -> None:
    """Started afresh: incidents of the cluster may be open already (this coordinator was
    terminated by hand, or its namespace restored). What they hold is rebuilt from them
    (gpuheal.core.fleet.reaping.rebuild). Nothing is decided until it has succeeded (requests
    wait, `gpuheal resume` is refused): books rebuilt from nothing would grant a full budget on
    top of what is still drained. While it fails, the breaker is tripped and the operators told."""
    if not workflow.patched(BOOKS):
        return await _rebuild_once(c)
    told = False
    while True:
        try:
            found = await _open_incidents(c, "rebuild from the open incidents")
        except (ActivityError, packing.UnreadableState) as err:  # (unreadable: as failed, never a failed task)
            if not told:
                why = (
                    f"rebuilding from the open incidents failed ({_why(err)}); nothing is granted until it "
                    f"succeeds (tried again every {REBUILD_AGAIN_S:g} s)"
                )
                c.fleet.breaker = Breaker(tripped=True, at=workflow.now(), why=why, by="gpuheal")
                c.notes.append(("coordinator_rebuilt", "critical", why))
                c.rebuild_failing = True  # waiting updates go on now, held behind the breaker
                await sending.send(c)
                told = True
            await workflow.sleep(timedelta(seconds=REBUILD_AGAIN_S), summary="rebuild again")
            continue
        said = reaping.rebuild(c.fleet, found, workflow.now(), knows_its_own=workflow.patched(REBUILD_KNOWS_ITS_OWN))
        c.apply(Effects(notes=said))
        if _looks_again(found, tripped=bool(said)):
            c.look_again = asyncio.ensure_future(_look_again(c))
        return


async def _open_incidents(c: CoordinatorState, summary: str) -> OpenIncidents:
    """The cluster's open incidents, packed from REBUILD_PACKED on (a fleet's worth within
    Temporal's limit on an activity's result), as JSON before."""
    if workflow.patched(REBUILD_PACKED):
        data = await run(
            act.FIND_OPEN_INCIDENTS_PACKED, c.fleet.cluster, summary=summary, **REBUILD, task_queue=c.own_queue
        )
        return packing.unpack_listing(data)
    return await run(act.FIND_OPEN_INCIDENTS, c.fleet.cluster, summary=summary, **REBUILD, task_queue=c.own_queue)


def _why(err: Exception) -> BaseException:
    return (err.cause if isinstance(err, ActivityError) else None) or err


def _looks_again(found: OpenIncidents, tripped: bool) -> bool:
    """Whether the rebuild looks once more after VISIBILITY_LAG_S: whenever its earlier run did
    not show and it has not tripped the breaker saying it was recreated (a second trip would
    undo a resume given meanwhile and send the notice again). Before LOOK_UNTIL_SEEN, only when
    it found nothing at all: open incidents holding nothing stopped the second look."""
    if found.earlier_run:
        return False
    if workflow.patched(LOOK_UNTIL_SEEN):
        return not tripped
    return not (found.incidents or found.left)


def not_rebuilt_yet(c: CoordinatorState) -> None:
    """An update waited REBUILD_WAIT_S for the rebuild: the breaker is tripped (once), so what it
    decides now is held, never granted on books that do not know what is out."""
    if c.fleet.breaker.tripped:
        return
    why = (
        f"the coordinator has not rebuilt its books from the open incidents within {REBUILD_WAIT_S:g} s: "
        "nothing is granted until it has and a person resumes (`gpuheal fleet`)"
    )
    c.fleet.breaker = Breaker(tripped=True, at=workflow.now(), why=why, by="gpuheal")
    c.notes.append(("coordinator_rebuilt", "critical", why))
    c.view_changed()


async def _look_again(c: CoordinatorState) -> None:
    """The second look of a rebuild that saw no earlier run and said nothing (see
    VISIBILITY_LAG_S): what shows now is rebuilt too (what the coordinator knows since is left as
    it is)."""
    await workflow.sleep(timedelta(seconds=VISIBILITY_LAG_S), summary="look again for an earlier run")
    try:
        found = await _open_incidents(c, "rebuild: look again")
    except (ActivityError, packing.UnreadableState) as err:
        c.undelivered.append(f"second look for an earlier run failed: {_why(err)}")
        c.view_changed()
        return
    knows = workflow.patched(REBUILD_KNOWS_ITS_OWN)
    c.apply(Effects(notes=reaping.rebuild(c.fleet, found, workflow.now(), knows_its_own=knows)))


async def _rebuild_once(c: CoordinatorState) -> None:
    """How coordinators before BOOKS rebuilt (their histories replay so)."""
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


def check_left_at(c: CoordinatorState) -> datetime | None:
    """When to ask Slurm about the left nodes for a held incident (coordinators from BOOKS on)."""
    if c.reaping:
        return None
    return reaping.left_check_due(c.fleet, workflow.now())


def _domain_refs(c: CoordinatorState) -> list[RunRef]:
    """The undecided domain incidents whose workflow was started (not those still to open)."""
    opening = [d.incident_id for d in (*c.domains, *c.on_way.values()) if isinstance(d, DomainIncident)]
    return domain_reaping.undecided_refs(c.fleet, opening)


async def _give_back_borrowed(c: CoordinatorState) -> None:
    """Borrowed nodes whose run crashed out without returning them go back (activities/borrowed.py);
    the operators hear which, and which wait, drained, for their jobs."""
    try:
        back = await run(
            act.GIVE_BACK_BORROWED_OF_ENDED_RUNS,
            c.fleet.cluster,
            summary="give back borrowed nodes of runs that crashed out",
            **LOOK,
            task_queue=c.own_queue,
        )
    except ActivityError as err:
        c.undelivered.append(f"giving back borrowed nodes failed: {err.cause or err}")
        c.view_changed()
        return
    if back.given_back or (back.waiting and back.waiting != c.borrowed_waiting):  # (told once, not each look)
        c.apply(Effects(notes=[("borrowed_given_back", "warning", render.borrowed_given_back(back))]))
    c.borrowed_waiting = back.waiting


def reap(c: CoordinatorState, runs: list[RunRef], closed_runs: bool = True) -> None:
    """Look for closed runs among those holding something, beside the loop, and give back
    what they hold (gpuheal.core.fleet.reaping.reap): their nodes that Slurm still shows drained
    by them stay counted. Without `closed_runs`, only the nodes left drained are asked about (a
    held incident's check). A look that fails is said in the details and made again at the
    next one; it never fails the coordinator."""
    c.reaping, c.reap_now = True, False
    books = workflow.patched(BOOKS)
    domains = _domain_refs(c) if books and closed_runs else []

    async def look() -> None:
        try:
            closed = RunRefs()
            if closed_runs:
                closed = await _in_pages(c, act.FIND_CLOSED_RUNS, [*runs, *domains], "look for closed runs")
            ended = [r for r in closed.runs if r in domains]
            closed = RunRefs(runs=tuple(r for r in closed.runs if r not in domains))
            # The left nodes as they are now, after the first look: those left since are asked too.
            check = asked = RunRefs(runs=(*closed.runs, *reaping.left_refs(c.fleet)))
            try:
                drained = check
                if check.runs:
                    drained = await _in_pages(c, act.FIND_NODES_LEFT_DRAINED, list(check.runs), "still drained?")
            except ActivityError:  # Slurm not answering: every node counts as still drained
                drained = check
                # ...and the left nodes as not asked (no answer is no "still drained": a returned
                # node's resume may have landed); before RETURN_KEEPS_COUNT nothing read the difference
                asked = RunRefs(runs=closed.runs)
            if books:
                c.apply(coordination.reap(c.fleet, closed.runs, asked.runs, drained.runs, workflow.now()))
                c.apply(domain_reaping.reap_domains(c.fleet, ended, workflow.now()))
                c.apply(domain_reaping.release_overdue(c.fleet, workflow.now()))
            else:  # before BOOKS: every left node not shown drained was dropped, even one left meanwhile
                asked_before = (*closed.runs, *(r for r in reaping.left_refs(c.fleet)))
                c.apply(coordination.reap(c.fleet, closed.runs, asked_before, drained.runs, workflow.now()))
            if closed_runs and workflow.patched(BORROWED_GO_BACK):
                await _give_back_borrowed(c)
        except ActivityError as err:
            c.undelivered.append(f"look for closed runs failed: {err.cause or err}")
            c.view_changed()
        finally:
            c.reaping = False

    c.look = asyncio.ensure_future(look())


async def _in_pages(
    c: CoordinatorState, look: act.Activity[RunRefs, RunRefs], refs: list[RunRef], what: str
) -> RunRefs:
    """What a look at these runs finds, asked LOOK_PAGE runs at a time (one activity after another,
    so no workflow task carries more than one page) from LOOK_IN_PAGES on; in one activity before,
    and whenever they fit one page. A page that fails fails the look, as a whole look did."""
    if len(refs) <= LOOK_PAGE or not workflow.patched(LOOK_IN_PAGES):
        return await run(look, RunRefs(runs=tuple(refs)), summary=what, **LOOK, task_queue=c.own_queue)
    found: list[RunRef] = []
    pages = range(0, len(refs), LOOK_PAGE)
    for n, at in enumerate(pages, 1):
        page = RunRefs(runs=tuple(refs[at : at + LOOK_PAGE]))
        summary = f"{what} ({n} of {len(pages)})"
        found += (await run(look, page, summary=summary, **LOOK, task_queue=c.own_queue)).runs
    return RunRefs(runs=tuple(found))
