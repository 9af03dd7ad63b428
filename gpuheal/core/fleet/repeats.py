"""The repeat window's books, kept compact: a week of arrivals at fleet scale in the fields the
repeat-offender count needs, indexed so that a decision's cost does not grow with the fleet.

An arrival is kept whole (`FleetState.arrivals`) only while the short windows need it (the
breaker's and the escalation's: their domains and nodes). Older, and within the repeat window,
it is kept in `FleetState.past` under each key it counts for (its node, and each GPU's serial and
UUID the reports named), one entry per incident run: (epoch seconds, run key). A 10,000-node
fleet's worst week (10,000 arrivals) is then a few hundred KB carried, compressed
(gpuheal.core.fleet.packing), and an admission reads only the entries of its own keys.
Pure, no I/O (tests/test_state_bounds.py)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from gpuheal.core.fleet import index
from gpuheal.core.fleet.keys import keys, named, uuid_key
from gpuheal.core.fleet.models import Arrival, FleetState
from gpuheal.core.fleet.policy import FleetPolicy
from gpuheal.core.policy import REPEAT_OFFENDER

RUN_KEY_CHARS = 12  # of a run id's tail: random in UUIDv4 and v7 alike (v7's head is its time)
SHED_S = 86400  # what a state too big to carry forgets at a time: the oldest day
# Arrivals stay whole at least this long, whatever the windows: a breaker or escalation window
# widened by a policy change still sees the last hour's domains.
WHOLE_AT_LEAST_S = 3600.0


def short_window_s(p: FleetPolicy) -> float:
    """How long an arrival is kept whole: the windows that need its domains, an hour at least."""
    return max(p.breaker.window_s, p.escalation.window_s, WHOLE_AT_LEAST_S)


def run_key(run_id: str, incident_id: str = "") -> str:
    """One incident run, compact: its run id's random tail (an earlier release's run without an
    id is its incident's, as the arrivals kept whole counted it)."""
    return run_id.replace("-", "")[-RUN_KEY_CHARS:] if run_id else incident_id


def seen(s: FleetState, incident_id: str, run_id: str, node: str, now: datetime) -> bool:
    """Whether this run has arrived within the repeat window already (an admission asked again
    counts once; one older than the window counts anew, as it did when arrivals were kept whole)."""
    if (incident_id, run_id) in index.arrivals(s).runs:
        return True
    mine, oldest = run_key(run_id, incident_id), now.timestamp() - s.policy.policy.repeat.window_s
    return any(r == mine and t >= oldest for t, r in s.past.get(f"node:{node}", ()))


def age(s: FleetState, now: datetime) -> None:
    """Arrivals past the short windows move to the compact books; entries past the repeat window
    go. Arrivals come in time order, so only the oldest are looked at."""
    p = s.policy.policy
    short, week = short_window_s(p), p.repeat.window_s
    cut = 0
    while cut < len(s.arrivals) and (now - s.arrivals[cut].at).total_seconds() > short:
        cut += 1
    if cut:
        for a in s.arrivals[:cut]:
            if (now - a.at).total_seconds() <= week:
                _keep(s, a)
        del s.arrivals[:cut]


def _keep(s: FleetState, a: Arrival) -> None:
    """One entry under each of its keys (each key once: `named`), so an entry is a run: the node's
    with the run's key (what `seen` asks), a GPU's with its time only."""
    at = int(a.at.timestamp())
    node, *gpus = keys(a.node, a.gpu_uuids, a.gpu_serials)
    s.past.setdefault(node, []).append((at, run_key(a.run_id, a.incident_id)))
    for key in gpus:
        s.past.setdefault(key, []).append((at, ""))


def prune(s: FleetState, now: datetime) -> None:
    """Forget every entry past the repeat window (once per run, before it is carried on)."""
    oldest = now.timestamp() - s.policy.policy.repeat.window_s
    for key in list(s.past):
        kept = [e for e in s.past[key] if e[0] >= oldest]
        if kept:
            s.past[key] = kept
        else:
            del s.past[key]


def shed(s: FleetState) -> bool:
    """Forget the oldest day of the repeat window's books (a state too big to carry otherwise);
    False when there is nothing left to forget."""
    times = [t for entries in s.past.values() for t, _ in entries]
    if not times:
        return False
    cut = min(times) + SHED_S
    for key in list(s.past):
        s.past[key] = [e for e in s.past[key] if e[0] >= cut]
        if not s.past[key]:
            del s.past[key]
    return True


def count(s: FleetState, key: str, now: datetime, window_s: float) -> int:
    """How many incident runs counted for `key` within the window (recent ones and the books)."""
    oldest = now.timestamp() - window_s
    earlier = sum(1 for t, _ in s.past.get(key, ()) if t >= oldest)  # an entry per run (_keep)
    whole = index.arrivals(s).by_key.get(key, ())  # the arrivals kept whole that count for it
    recent = {(a.incident_id, a.run_id) for a in whole if (now - a.at).total_seconds() <= window_s}
    return earlier + len(recent)  # (an arrival is whole or in the books, never both)


def counts_for(a: Arrival, key: str) -> bool:
    """`key in keys(a.node, a.gpu_uuids, a.gpu_serials)`, without building them: a storm's
    admission asks it of every recent arrival (a thousand), so its cost is the batch's."""
    kind, _, value = key.partition(":")
    if kind == "node":
        return a.node == value
    if kind == "serial":
        return value in a.gpu_serials
    return kind == "uuid" and any(uuid_key(u) == value for u in a.gpu_uuids)


def repeat_offender(
    s: FleetState, node: str, gpu_uuids: Iterable[str], gpu_serials: Iterable[str], now: datetime
) -> str | None:
    """Why this is the node's (or a GPU's) `incidents`-th incident within the repeat window, or
    None; as gpuheal.core.fleet.breaker.repeat_offender decides it over whole arrivals. Where the
    reports name the GPU's serial the count follows the board, not the node's name (a board moved
    keeps its record; a node whose bad GPU was swapped starts afresh)."""
    p = s.policy.policy.repeat
    serials = tuple(gpu_serials)
    named_keys = named(node, gpu_uuids, serials)
    order = [k for k in named_keys if k[0].startswith("serial:")]
    order += [k for k in named_keys if k[0].startswith("node:") and not serials]
    order += [k for k in named_keys if k[0].startswith("uuid:")]
    for key, what in order:
        n = count(s, key, now, p.window_s)
        if n >= p.incidents:
            return f"{REPEAT_OFFENDER}: {n} incidents on {what} within {p.window_s / 86400:g} days"
    return None
