"""What incident runs that ended without giving back still hold, and a coordinator that
starts afresh: pure functions over FleetState, below gpuheal.core.fleet.coordination.

A run terminated by hand (or failed where it could not release) runs no code to give back its
grant, containment or place in line. The coordinator looks for closed runs among the holders
every REAP_EVERY_S while any holds something (workflows/fleet.py): what a closed run held is
given back, except a node Slurm still shows drained by that incident, which stays counted
against the budget ("left", shown by `gpuheal fleet`) until it is back in service or its node's
next incident takes it over. A coordinator started afresh rebuilds from the open incidents.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from gpuheal.core.fleet import budget, index
from gpuheal.core.fleet.models import RETURN_COMMAND, Breaker, FleetState, Grant, Held, Note, OpenIncidents, RunRef
from gpuheal.core.models.base import Stage

# The coordinator looks for closed runs among those holding something this often, while any does
# (and at once when a grant notice finds its incident gone): a closed run's hold is given back
# within this long.
REAP_EVERY_S = 300.0
# An open incident in one of these stages has been granted its node (a recreated coordinator
# counts it as out of service); in HELD it waits in line; before (triage) or in observe mode it
# holds nothing yet.
GRANTED_STAGES = frozenset(Stage) - {Stage.TRIAGE, Stage.OBSERVE, Stage.HELD, Stage.CLOSE, Stage.DONE}
NOTE_NODES = 20  # a notice names this many nodes, then counts the rest


def earlier_run(held_by: str, asking: str) -> bool:
    """Whether what is held was an earlier run's (its node's workflow id is reused run after
    run, and a new run starts only once the earlier one closed). Unknown ("") is the same run."""
    return bool(held_by and asking and held_by != asking)


def holders(s: FleetState) -> list[RunRef]:
    """Every run that holds something: a grant, a grant taken back, a containment, a place in line."""
    found: dict[tuple[str, str], str] = {}
    for book in s.books():
        for g in book.values():
            found[(g.incident_id, g.run_id)] = g.node
    for h in s.queue:
        found.setdefault((h.incident_id, h.run_id), h.node)
    return [RunRef(incident_id=i, run_id=r, node=n) for (i, r), n in found.items()]


def runs_of(s: FleetState, incident_id: str) -> set[tuple[str, str]]:
    """The runs of one incident that hold something (holders' keys, without building them all:
    a storm's request asks this once)."""
    found = {(g.incident_id, g.run_id) for book in s.books() for g in book.values() if g.incident_id == incident_id}
    return found | {(incident_id, run_id) for _, run_id in index.line(s).places(incident_id)}


def drop(s: FleetState, runs: set[tuple[str, str]]) -> list[str]:
    """Remove everything these runs hold; what was removed, in words."""
    gone: list[str] = []
    for book in s.books():
        for key in [k for k, g in book.items() if (g.incident_id, g.run_id) in runs]:
            gone.append(f"{book.pop(key).node} ({key})")
    gone += [f"{h.node} ({h.incident_id}, in line)" for h in s.queue if (h.incident_id, h.run_id) in runs]
    s.queue = [h for h in s.queue if (h.incident_id, h.run_id) not in runs]
    return gone


def reap_due(s: FleetState, now: datetime) -> datetime | None:
    """When to look next: every REAP_EVERY_S while anything is held or left (at once if it has
    never looked, or not for that long); None while nothing is. So a run that closes holding
    something is looked at within REAP_EVERY_S of its close."""
    if not (s.grants or s.contained or s.containing or s.queue or s.left):
        return None
    return s.reaped_at + timedelta(seconds=REAP_EVERY_S) if s.reaped_at is not None else now


def start_reap(s: FleetState, now: datetime) -> list[RunRef]:
    """The runs to look at now (and the look recorded, so the next is REAP_EVERY_S later)."""
    s.reaped_at = now
    return holders(s)


def left_refs(s: FleetState) -> list[RunRef]:
    """The nodes closed runs left drained, as the runs that left them (asked again at each look)."""
    return [RunRef(incident_id=g.incident_id, run_id=g.run_id, node=n) for n, g in s.left.items()]


def reap(
    s: FleetState, closed: Iterable[RunRef], asked: Iterable[RunRef], still_drained: Iterable[RunRef], now: datetime
) -> list[Note]:
    """Give back what closed runs still hold; only what that run holds (a newer run of the same
    incident that asked since keeps its own). A grant whose node Slurm still shows drained by
    that incident stays counted, as `left`, until a look finds the node back in service (then
    it frees) or its node's next incident is granted it: a failed GPU is not put back to work
    unchecked, and a budget must not free for nodes that are still out.

    `asked` are the runs whose nodes Slurm was asked about, `still_drained` those it showed
    drained: a node left while the look ran was not asked, and stays counted."""
    runs = {(r.incident_id, r.run_id) for r in closed}
    drained = {(r.incident_id, r.node) for r in still_drained}
    answered = {(r.incident_id, r.run_id, r.node) for r in asked}
    out: list[Note] = []
    back = [
        n for n, g in s.left.items() if (g.incident_id, g.run_id, n) in answered and (g.incident_id, n) not in drained
    ]
    for n in back:
        s.left.pop(n)
    if back:
        out.append(("left_back_in_service", "info", f"back in service, no longer counted: {_names(back)}"))
    # Returned by an operator, and Slurm still shows it drained at a look begun RETURN_GRACE_S or more
    # after: its resume failed. Said once; from here it is a left node as any other. (A look begun
    # sooner may have read Slurm before the command's resume: the node stays `returning`.)
    started = look_started(s)
    still = [
        n
        for n, g in s.left.items()
        if n in s.returning
        and (g.incident_id, g.run_id, n) in answered
        and started is not None
        and started >= s.returning[n] + timedelta(seconds=RETURN_GRACE_S)
    ]
    if still:
        text = (
            f"returned by an operator, still drained in Slurm {RETURN_GRACE_S:g} s later, still counted: "
            f"{_names(still)}: its resume failed (`{RETURN_COMMAND.format(node='NODE')}` again once Slurm answers)"
        )
        out.append(("return_not_seen", "warning", text))
    s.returning = {n: at for n, at in s.returning.items() if n in s.left and n not in still}  # back, or taken over
    kept = [
        g
        for book in s.books()
        for g in book.values()
        if (g.incident_id, g.run_id) in runs and (g.incident_id, g.node) in drained
    ]
    gone = drop(s, runs)
    for g in kept:
        s.left[g.node] = g
    if gone:
        text = (
            f"reaped what {len(gone)} closed incident run(s) still held: {_names(gone)}. They ended without giving it "
            "back (terminated?)."
        )
        if kept:
            text += (
                f" Still drained by them, and counted against the budget until back in service: "
                f"{_names([g.node for g in kept])} (`gpuheal status NODE`, then "
                f"`{RETURN_COMMAND.format(node='NODE')}` once checked)."
            )
        out.append(("grants_reaped", "warning", text))
    return out


def _names(items: list[str]) -> str:
    more = len(items) - NOTE_NODES
    return ", ".join(items[:NOTE_NODES]) + (f" and {more} more" if more > 0 else "")


def rebuild(s: FleetState, found: OpenIncidents, now: datetime, knows_its_own: bool = False) -> list[Note]:
    """A coordinator started afresh: it may be a recreation (its earlier run terminated by hand,
    its namespace restored), and visibility may not show that earlier run closed yet (a new
    admission recreates it within a second). It does not know what the open incidents hold,
    and would let the next ones through past the budget, its breaker reset by forgetting. So
    whenever open incidents hold something or Slurm shows gpuheal's drains, whether or not an
    earlier run is visible, it rebuilds grants, containments and its line from them (a held
    incident in its order of arrival), counts every other node drained by gpuheal as left, and
    trips its breaker, saying why, until a person has looked and resumes. An incident it knows
    already (one that asked since it started) is left as it is. A coordinator that finds
    nothing open and no earlier run (the cluster's first) changes nothing. With `knows_its_own`
    (coordinators from REBUILD_KNOWS_ITS_OWN on), a run this coordinator admitted is known too,
    holding or not: a look's snapshot may show one open that it has since granted and released
    (its books are true for it: the run asked it)."""
    known = {r.incident_id for r in holders(s)}
    if knows_its_own:
        own = set(index.arrivals(s).runs)
        found = found.model_copy(
            update={"incidents": tuple(o for o in found.incidents if (o.incident_id, o.run_id) not in own)}
        )
    gave_back = {(g.incident_id, g.run_id) for g in s.left.values()}  # released since: left, not held
    new = [
        o
        for o in found.incidents
        if o.incident_id not in known
        and (o.incident_id, o.run_id) not in gave_back
        and (o.stage == Stage.HELD or (o.stage in GRANTED_STAGES and o.takes_capacity))
    ]
    granted, held = [o for o in new if o.stage != Stage.HELD], [o for o in new if o.stage == Stage.HELD]
    held.sort(key=lambda o: (o.since is None, o.since or now, o.incident_id))
    for o in [*granted, *held]:
        p = o.placement
        budget.note_sizes(s, p)
        grant = Grant(
            incident_id=o.incident_id, run_id=o.run_id, node=p.node, pool=p.pool, domains=tuple(p.domains), at=now
        )
        if o.stage != Stage.HELD:
            s.left.pop(p.node, None)  # counted once: as this grant
            s.returning.pop(p.node, None)
            s.grants[o.incident_id] = grant  # out of service; it counted against the rate before
            continue
        why = "held when the coordinator was recreated (its line rebuilt from the open incidents)"
        s.queue.append(
            Held(incident_id=o.incident_id, run_id=o.run_id, node=p.node, placement=p, since=now, reason=why)
        )
        if o.contained:
            s.containing[o.incident_id] = grant
    counted = {g.node for book in s.books() for g in book.values()}
    left = []
    for o in found.left:  # drained by incidents that ended: counted until back in service
        p = o.placement
        if p.node not in counted and p.node not in s.left:
            budget.note_sizes(s, p)
            s.left[p.node] = Grant(
                incident_id=o.incident_id, run_id="", node=p.node, pool=p.pool, domains=tuple(p.domains), at=now
            )
            left.append(p.node)
    if not (found.earlier_run or new or left or found.drains_unread):  # the cluster's first: nothing forgotten
        return []
    nodes = tuple(sorted(o.placement.node for o in new))[:NOTE_NODES]
    why = (
        f"coordinator recreated (its earlier run: {found.earlier_run or 'not visible yet'}) with {len(new)} open "
        f"incidents and {len(left)} nodes left drained; their grants and line are rebuilt: check them (`gpuheal fleet`)"
    )
    if found.drains_unread:
        why += (
            f". Slurm's drains could not be read ({found.drains_unread[:200]}): nodes left drained by ended "
            "incidents are not counted; check `sinfo -R` before resuming"
        )
    s.breaker = Breaker(tripped=True, at=now, why=why, nodes=nodes, by="gpuheal")
    names = _names(sorted(o.placement.node for o in new))
    text = f"{why}; nodes {names or '-'}. Nothing new is replaced until `gpuheal resume --operator NAME --reason R`."
    return [("coordinator_rebuilt", "critical", text)]


# A held incident with nodes left drained in the books: Slurm is asked whether they are back this
# often while it waits (not only at the next look, REAP_EVERY_S), so a node an operator resumed
# frees its slot within seconds.
LEFT_CHECK_EVERY_S = 30.0


# A node an operator returned (steering.return_node) is asked about this long after: the command
# resumes it in Slurm once the coordinator has answered, about a second later.
RETURN_LOOK_S = 5.0
# The longest the command takes from the coordinator's answer to its resume (a read and a resume,
# each within the Slurm client's 20 s, and margin): until a look begun this long after the return
# finds it still drained, the node is `returning` (nothing else is granted or contains it).
RETURN_GRACE_S = 60.0


def look_started(s: FleetState) -> datetime | None:
    """When the look now ending began (or the last one): looks never overlap, and each records its
    start (start_reap, start_left_check)."""
    return max((t for t in (s.reaped_at, s.left_checked_at) if t is not None), default=None)


def left_check_due(s: FleetState, now: datetime) -> datetime | None:
    """When to ask Slurm about the nodes left drained: RETURN_LOOK_S after an operator returned
    one, and RETURN_GRACE_S after should it still show drained then; every LEFT_CHECK_EVERY_S for
    an incident held while nodes are left; None when none is due (while the breaker is tripped a
    freed slot would grant nothing: only the returns are asked about)."""
    last, started = s.left_checked_at, look_started(s)
    due = []
    for n, t in s.returning.items():
        if n not in s.left:
            continue
        if started is None or started <= t:
            due.append(t + timedelta(seconds=RETURN_LOOK_S))
        elif started < t + timedelta(seconds=RETURN_GRACE_S):
            due.append(t + timedelta(seconds=RETURN_GRACE_S))
    if s.queue and s.left and not s.breaker.tripped:
        due.append(last + timedelta(seconds=LEFT_CHECK_EVERY_S) if last is not None else now)
    return min(due, default=None)


def start_left_check(s: FleetState, now: datetime) -> list[RunRef]:
    """The nodes left drained to ask Slurm about now (and the check recorded)."""
    s.left_checked_at = now
    return left_refs(s)
