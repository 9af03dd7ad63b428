"""The soak's invariants: pure functions of what the systems recorded (infra.soak.records), each
returning the violations it found, named so that a failed soak says which incident, when, and
what to look at. None of them reads gpuheal's own account of what it did.

Each check is a function of its own (the report gives each its verdict), and `check` runs them
all in the order the issue lists them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise

from infra.soak.records import (
    Bound,
    BreakerChange,
    Grant,
    JobEnd,
    LogEvent,
    NodeSample,
    Run,
    SpareGiven,
    gives_back,
    incident_workflow_id,
    ours,
)

# The incident's named endings (gpuheal.core.models.base.Outcome): written here again on purpose,
# so that an ending gpuheal invents later is a violation until the checker is told of it.
OUTCOMES = frozenset(
    {
        "resolved",
        "ignored",
        "aborted",
        "no_capacity",
        "observed",
        "escalated",
        "not_granted",
        "already_replaced",
        "not_in_service",
        "failed_validation",
        "followed_up",
        "unvalidated",
    }
)
# Node states a closed incident leaves drained in Slurm (gpuheal.core.models.base.NodeState).
LEFT_DRAINED = frozenset({"drained", "blocked", "awaiting_replacement", "failed_validation", "unvalidated"})
# Job states in which a job is accounted for by Slurm alone: still at work, waiting, or done.
JOB_ALIVE = frozenset(
    {
        "RUNNING",
        "PENDING",
        "REQUEUED",
        "REQUEUE_HOLD",  # held by gpuheal (its retry budget spent), or by a person: waiting, not lost
        "REQUEUE_FED",
        "COMPLETING",
        "CONFIGURING",
        "SUSPENDED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "COMPLETED",
    }
)
CHAIN = "CONTINUED_AS_NEW"  # not an ending: the next run of the chain carries on

JOB_LOST, JOB_KILLED = "no job lost", "no job killed by gpuheal"
TWICE, BOUND, BREAKER, ENDINGS, LEAKS = (
    "no action done twice",
    "the bound",
    "the breaker",
    "every incident ended",
    "nothing leaked",
)
INVARIANTS = (JOB_LOST, JOB_KILLED, TWICE, BOUND, BREAKER, ENDINGS, LEAKS)


@dataclass(frozen=True)
class Violation:
    invariant: str  # one of INVARIANTS
    cluster: str
    at: float
    subject: str  # the incident run (workflow id/run id), the job or the node it is about
    detail: str


def tail(run_id: str) -> str:
    """How a validation's reservation names its run: the run id's last 8 hex digits."""
    return run_id.replace("-", "")[-8:]


def run_at(runs: Iterable[Run], cluster: str, node: str, t: float) -> Run | None:
    """The incident run of `node` open at `t` (one at a time per node: its workflow id is the node's)."""
    wid = incident_workflow_id(cluster, node)
    found = [r for r in runs if r.cluster == cluster and r.workflow_id == wid and r.open_at(t)]
    return max(found, key=lambda r: r.started) if found else None


RETRY_AFTER_STOP_S = 30.0  # a drain sent while slurmctld was stopped may land after its retry's read


def drained_twice(
    events: Sequence[LogEvent], runs: Sequence[Run], quiet: Sequence[tuple[str, float, float]] = ()
) -> list[Violation]:
    """A node gpuheal had drained, drained by gpuheal again before anything resumed it or took it
    out: a drain done without reading the node first. Slurm's log shows each drain asked for. One
    exception: the same drain again (the same reason) soon after the soak stopped that slurmctld,
    whose backlog may apply a timed-out drain after its retry read the node undrained."""
    found: list[Violation] = []
    held: dict[tuple[str, str], str] = {}  # (cluster, node) drained by gpuheal, not resumed since -> reason
    for e in events:
        where = (e.cluster, e.node)
        if e.kind == "drain" and ours(e.text, e.cluster):
            after_stop = any(c == e.cluster and lo <= e.at <= hi + RETRY_AFTER_STOP_S for c, lo, hi in quiet)
            if where in held and not (after_stop and held[where] == e.text):
                run = run_at(runs, e.cluster, e.node, e.at)
                subject = run.key if run else e.node
                found.append(Violation(TWICE, e.cluster, e.at, subject, f"{e.node} drained again: {e.text}"))
            held[where] = e.text
        elif e.kind in ("resume", "down") or (e.kind == "drain" and not ours(e.text, e.cluster)):
            held.pop(where, None)
    return found


def cordoned_twice(events: Sequence[LogEvent], runs: Sequence[Run]) -> list[Violation]:
    """A Kubernetes Node cordoned by an incident that had cordoned it already, nothing having
    cleared its mark in between: the apiserver's audit log shows each cordon carried out."""
    found: list[Violation] = []
    marked: dict[tuple[str, str], str] = {}  # (cluster, node) -> the incident whose mark it bears
    for e in events:
        where = (e.cluster, e.node)
        if e.kind == "cordon":
            if marked.get(where) == e.text:
                run = run_at(runs, e.cluster, e.node, e.at)
                subject = run.key if run else e.text
                found.append(Violation(TWICE, e.cluster, e.at, subject, f"Node {e.node} cordoned again by {e.text}"))
            marked[where] = e.text
        elif e.kind == "uncordon":
            marked.pop(where, None)
    return found


def requeued_twice(events: Sequence[LogEvent], runs: Sequence[Run]) -> list[Violation]:
    """A job requeued more than once from a node while one incident of that node was open (a
    continue-as-new chain of runs is one incident), without starting on that node again between:
    the second requeue then acted on what the first had done. (A job the first requeue put back on
    the same node, an application restart's, that a later failure's run requeues again is a new
    stay: issue 37's hour, east gpu17.) The log does not say who asked for a requeue: one during an
    incident of the job's node counts as gpuheal's (the soak stops no slurmd, so Slurm requeues
    nothing on its own there)."""
    found: list[Violation] = []
    on: dict[tuple[str, int], str] = {}  # (cluster, job) -> the node it last started on
    seen: dict[tuple[str, str, int], str] = {}  # (cluster, incident, job) -> the node it was requeued from
    for e in events:
        if e.kind == "allocate":
            on[(e.cluster, e.job)] = e.node
            for key in [k for k, node in seen.items() if k[0] == e.cluster and k[2] == e.job and node == e.node]:
                del seen[key]  # started there again: a requeue from there is of a new stay
        elif e.kind == "requeue" and (node := on.get((e.cluster, e.job))):
            run = run_at(runs, e.cluster, node, e.at)
            if run is None:
                continue  # not during an incident of its node: not gpuheal's requeue
            key = (e.cluster, run.incident, e.job)
            if key in seen:
                found.append(Violation(TWICE, e.cluster, e.at, run.key, f"job {e.job} requeued again from {node}"))
            seen[key] = node
    return found


def spares_twice(spares: Sequence[SpareGiven]) -> list[Violation]:
    """A spare the provider gave to two incident runs, or a run given a second spare while its
    first had not failed its validation (the provider names the spare a new one replaces)."""
    first: dict[tuple[str, str], str] = {}  # (cluster, spare) -> the run it went to
    latest: dict[tuple[str, str], str] = {}  # (cluster, run) -> its spare now
    found: list[Violation] = []
    for s in sorted(spares, key=lambda s: s.at):
        taken = first.setdefault((s.cluster, s.spare), s.run_key)
        if taken != s.run_key:
            found.append(Violation(TWICE, s.cluster, s.at, s.run_key, f"spare {s.spare} given to {taken} too"))
        had = latest.get((s.cluster, s.run_key))
        if had is not None and had != s.spare and had != s.instead_of:  # (the same again: a retry's line)
            found.append(Violation(TWICE, s.cluster, s.at, s.run_key, f"a second spare {s.spare} while {had} stood"))
        latest[(s.cluster, s.run_key)] = s.spare
    return found


def bound_at(bounds: Sequence[Bound], cluster: str, t: float) -> int | None:
    current = [b for b in bounds if b.cluster == cluster and b.at <= t]
    return max(current, key=lambda b: b.at).most if current else None


def given_back(s: NodeSample, lent: set[tuple[str, str]]) -> set[str]:
    """The inference nodes (`lent`: (cluster, node)) this sample shows drained to go back."""
    return {node for node, reason in s.drained.items() if (s.cluster, node) in lent and gives_back(reason, s.cluster)}


def held_out(
    samples: Sequence[NodeSample], lendable: Sequence[tuple[str, str]] = ()
) -> Iterator[tuple[NodeSample, frozenset[str]]]:
    """Each sample of Slurm, in time order, with the nodes held out by gpuheal then. Every node
    gpuheal drained counts until Slurm shows it back: from the first sample that shows it drained
    with gpuheal's reason, while it stays drained or DOWN (whatever its reason says by then: an
    operator may have written over it), until a sample shows it in service or FUTURE (out of the
    cluster: replaced, or given back to inference).

    But for one kind of drain: an inference node (`lendable`: (cluster, node)) drained to give it
    back. The budget bounds the training capacity gpuheal takes out; a borrowed node was never
    that capacity, and its give-back drain only ends the loan, so the coordinator grants nothing
    for it and the bound leaves it out. Any other drain of an inference node (a failure on it
    while borrowed) counts, and keeps counting if a give-back's words replace it; so does a
    give-back's reason on a training node."""
    counted: dict[str, set[str]] = defaultdict(set)  # cluster -> the nodes that count now
    lent = set(lendable)
    for s in sorted(samples, key=lambda s: s.at):
        held = counted[s.cluster]
        held &= set(s.drained) | set(s.down)
        held |= {node for node, reason in s.drained.items() if ours(reason, s.cluster)} - given_back(s, lent)
        yield s, frozenset(held)


def over_the_bound(
    samples: Sequence[NodeSample], bounds: Sequence[Bound], lendable: Sequence[tuple[str, str]] = ()
) -> list[Violation]:
    """A sample of Slurm with more nodes held out by gpuheal (`held_out`) than the policy's
    budget plus containment."""
    found: list[Violation] = []
    for s, held in held_out(samples, lendable):
        most = bound_at(bounds, s.cluster, s.at)
        if most is not None and len(held) > most:
            nodes = ", ".join(sorted(held))
            found.append(Violation(BOUND, s.cluster, s.at, s.cluster, f"{len(held)} held by gpuheal > {most}: {nodes}"))
    return found


MAX_GAP_S = 10.0  # samples further apart than this leave the bound unchecked between them


def unsampled(
    samples: Sequence[NodeSample],
    quiet: Sequence[tuple[str, float, float]],
    clusters: Iterable[str],
    begun: float,
    end: float,
) -> list[Violation]:
    """Spans with no sample of a cluster longer than MAX_GAP_S, outside the spans in which the
    soak itself stopped its slurmctld (`quiet`: (cluster, from, to)): the bound and the left
    nodes would pass there on nothing."""
    found: list[Violation] = []
    by_cluster = _by_cluster(samples)
    for cluster in clusters:
        times = [begun, *sorted(s.at for s in by_cluster.get(cluster, [])), end]
        for a, b in pairwise(times):
            if b - a <= MAX_GAP_S:
                continue
            stopped = any(c == cluster and lo - MAX_GAP_S <= a and b <= hi + MAX_GAP_S for c, lo, hi in quiet)
            if not stopped:
                found.append(Violation(BOUND, cluster, a, cluster, f"no sample of Slurm for {b - a:.0f} s"))
    return found


def breaker_reset_alone(changes: Sequence[BreakerChange]) -> list[Violation]:
    """The breaker went from tripped to not tripped with no operator's resume making the change."""
    found: list[Violation] = []
    tripped: dict[str, bool] = defaultdict(bool)
    for c in sorted(changes, key=lambda c: c.at):
        if tripped[c.cluster] and not c.tripped and not c.operator:
            found.append(Violation(BREAKER, c.cluster, c.at, c.cluster, "the breaker reset without an operator"))
        tripped[c.cluster] = c.tripped
    return found


def endings(runs: Sequence[Run], end: float) -> list[Violation]:
    """Every run ended in a named state within its bound, none failed; one still open at `end`
    past its bound must be waiting for a person (and say for whom). The bound counts from the
    start of the run's chain: continuing as new does not wind an incident's clock back."""
    found: list[Violation] = []
    for r in runs:
        if r.status == CHAIN:
            continue
        began = r.chain_started if r.chain else r.started
        if r.closed is None:
            # Within its bound an open run is on its way (a spare, capacity, a job's restart);
            # past it, only a person may be what it waits for.
            if not r.waiting_for and (not r.bound_s or end - began > r.bound_s):
                found.append(
                    Violation(ENDINGS, r.cluster, end, r.key, f"still open past its bound, at {r.stage or '?'}")
                )
            continue
        if r.status != "COMPLETED":
            found.append(Violation(ENDINGS, r.cluster, r.closed, r.key, f"ended {r.status}"))
        elif r.outcome not in OUTCOMES:
            found.append(Violation(ENDINGS, r.cluster, r.closed, r.key, f"ended in no named state ({r.outcome!r})"))
        if r.bound_s and r.closed - began > r.bound_s:
            took = f"open {r.closed - began:.0f} s, past its {r.bound_s:.0f} s"
            found.append(Violation(ENDINGS, r.cluster, r.closed, r.key, took))
    return found


# The fates with which an incident's result says a job did not go on (gpuheal's JobFate): the one
# account of a job Slurm shows ended that the checker takes, and only when gpuheal did not end it.
ENDED_FATES = frozenset({"ended", "not_requeued"})


def jobs_lost_or_killed(events: Sequence[LogEvent], runs: Sequence[Run], ends: Sequence[JobEnd]) -> list[Violation]:
    """Every job that was on a node while an incident of that node was open is alive or done by
    Slurm's account; one Slurm shows ended otherwise (failed, cancelled, timed out) is lost unless
    an incident's result names it as not gone on (ENDED_FATES: a fate that claims it requeued or
    untouched excuses nothing), and killed if the soak did not cancel it and either Slurm shows
    it CANCELLED or the result says gpuheal ended it."""
    found: list[Violation] = []
    final = {(e.cluster, e.job): e for e in ends}
    # When it ended, by Slurm's job completion log: its violation names the fault before then.
    ended_at = {(e.cluster, e.job): e.at for e in events if e.kind == "end"}
    touched: dict[tuple[str, int], set[str]] = defaultdict(set)  # job -> the runs it was on the node of
    for (cluster, job), node, since, until in _placements(events):
        wid = incident_workflow_id(cluster, node)
        for r in runs:
            if r.cluster == cluster and r.workflow_id == wid and since <= (r.closed or until) and r.started <= until:
                touched[(cluster, job)].add(r.key)
    for (cluster, job), keys in sorted(touched.items()):
        end = final.get((cluster, job))
        incidents = {r.incident for r in runs if r.key in keys}
        mine = [r for r in runs if r.incident in incidents]  # a chain's later run may name it
        if end is not None and end.by_soak:
            continue  # the soak cancelled it itself: accounted for by the soak's own record
        ended_by_us = any(job in r.jobs_ended_by_it for r in mine)
        if ended_by_us or (end is not None and end.state == "CANCELLED"):
            how = "ended by gpuheal, its result says" if ended_by_us else "CANCELLED by Slurm's account"
            at = ended_at.get((cluster, job), 0.0)
            found.append(Violation(JOB_KILLED, cluster, at, str(job), f"job {job} {how}: {sorted(keys)}"))
        elif end is None or end.state not in JOB_ALIVE:
            named = any(r.job_fates.get(job) in ENDED_FATES for r in mine)
            if not named:
                state = f"job {job} {end.state if end else 'unknown to Slurm'}, named ended by none of {sorted(keys)}"
                found.append(Violation(JOB_LOST, cluster, ended_at.get((cluster, job), 0.0), str(job), state))
    return found


def _placements(events: Sequence[LogEvent]) -> list[tuple[tuple[str, int], str, float, float]]:
    """Each job's stays: (cluster, job), the node, from its allocation to its end there (Slurm's
    job completion log), its next allocation, or forever."""
    stays: list[tuple[tuple[str, int], str, float, float]] = []
    current: dict[tuple[str, int], tuple[str, float]] = {}
    for e in events:
        if e.kind == "end" and (key := (e.cluster, e.job)) in current:
            node, since = current.pop(key)
            stays.append((key, node, since, e.at))
        elif e.kind == "allocate":
            key = (e.cluster, e.job)
            if key in current:
                node, since = current[key]
                stays.append((key, node, since, e.at))
            current[key] = (e.node, e.at)
    stays += [(key, node, since, float("inf")) for key, (node, since) in current.items()]
    return stays


def leaks(
    runs: Sequence[Run],
    grants: Sequence[Grant],
    samples: Sequence[NodeSample],
    reservations: Sequence[tuple[str, str]],
    events: Sequence[LogEvent] = (),
) -> list[Violation]:
    """No grant held by a closed run at the end; no gpuheal reservation without its open run
    (reservations: (cluster, name), named "gpuheal-validate-<node>-<run id's tail>"); every node a
    closed run says it left drained is drained in Slurm's first sample after the close (unless the
    log shows it resumed or taken out in between: an operator may return it at once)."""
    found: list[Violation] = []
    by_key = {r.key: r for r in runs}
    open_ids = {(r.cluster, r.workflow_id) for r in runs if r.closed is None}
    for g in grants:
        # Keyed by run, or by the incident's workflow id (the coordinator's view names incidents).
        still_open = (g.cluster, g.run_key) in open_ids or (
            (run := by_key.get(g.run_key)) is not None and run.closed is None
        )
        if g.released_at is None and not still_open:
            found.append(Violation(LEAKS, g.cluster, g.granted_at, g.run_key, "a grant held by a closed run"))
    # A validation's reservation is named by its incident's first run (a reset keeps it): any run
    # of a workflow with a run still open may be the one it names.
    open_tails = {(r.cluster, tail(r.run_id)) for r in runs if (r.cluster, r.workflow_id) in open_ids}
    for cluster, name in reservations:
        if (cluster, name.rsplit("-", 1)[-1]) not in open_tails:
            found.append(Violation(LEAKS, cluster, 0.0, name, "a reservation without its open incident"))
    by_cluster = _by_cluster(samples)
    for r in runs:
        if r.closed is None or r.node_state not in LEFT_DRAINED:
            continue
        after = next((x for x in sorted(by_cluster.get(r.cluster, []), key=lambda x: x.at) if x.at >= r.closed), None)
        if after is None or r.node in after.drained:
            continue
        back = any(
            e.cluster == r.cluster
            and e.node == r.node
            and e.kind in ("resume", "down")
            and r.closed - 1 <= e.at <= after.at
            for e in events
        )
        if not back:
            found.append(Violation(LEAKS, r.cluster, after.at, r.key, f"{r.node} said {r.node_state}, not drained"))
    return found


# A closed run whose node is still drained with its reason has said why: left drained for a
# person, or handed to its domain's incident.
OWNED_DRAINED = LEFT_DRAINED | {"escalated"}


GIVE_BACK_LOOK_S = 600.0  # a crashed run's borrowed node goes back at the coordinator's next look


def borrowed_unowned(borrowed: Sequence[tuple[str, str, str]], runs: Sequence[Run], end: float) -> list[Violation]:
    """At the end, every inference node still borrowed (Kubernetes: gpuheal's borrowed-run
    annotation, (cluster, node, run id)) is held by its incident: a run of that chain still open,
    or one that completed keeping it for a person (a job still on it: never given back with one).
    A run that crashed out (terminated, failed) leaves it to the coordinator's next look."""
    found: list[Violation] = []
    for cluster, node, run_id in borrowed:
        chain = [r for r in runs if r.cluster == cluster and run_id in (r.run_id, r.incident.rsplit("/", 1)[-1])]
        if any(r.closed is None or r.status == "COMPLETED" for r in chain):
            continue
        crashed = [r for r in chain if r.closed is not None and end - r.closed < GIVE_BACK_LOOK_S]
        if not crashed:
            found.append(Violation(LEAKS, cluster, end, node, f"{node} borrowed by run {run_id}, which is closed"))
    return found


def drains_unowned(samples: Sequence[NodeSample], runs: Sequence[Run]) -> list[Violation]:
    """At each cluster's last sample, every node drained with its own incident's reason is held
    by that incident (open then), or by the last run of it that touched the node, which said it
    left the node drained.
    Slurm's side of the grants: a drain no incident answers for is capacity gpuheal leaked."""
    found: list[Violation] = []
    for cluster, mine in _by_cluster(samples).items():
        last = max(mine, key=lambda x: x.at)
        for node, reason in sorted(last.drained.items()):
            wid = incident_workflow_id(cluster, node)
            if reason.partition(":")[0] != wid:
                continue  # someone else's drain, or a domain incident's
            its = sorted((r for r in runs if r.cluster == cluster and r.workflow_id == wid), key=lambda r: r.started)
            if any(r.open_at(last.at) for r in its):
                continue
            # (a run that did nothing to the node, an application restart on it, answers for nothing)
            before = [r for r in its if r.closed is not None and r.closed <= last.at and r.node_state != "untouched"]
            if before and before[-1].node_state in OWNED_DRAINED:
                continue
            said = f"its last run said {before[-1].node_state or '?'}" if before else "no run of its incident"
            found.append(Violation(LEAKS, cluster, last.at, node, f"{node} drained by gpuheal at the end, {said}"))
    return found


@dataclass(frozen=True)
class Records:
    """Everything a soak recorded, gathered after it (the harness reads each system's own record)."""

    end: float  # when the checker looked: runs still open then must be waiting for a person
    events: Sequence[LogEvent]
    samples: Sequence[NodeSample]
    runs: Sequence[Run]
    grants: Sequence[Grant] = ()
    breaker: Sequence[BreakerChange] = ()
    spares: Sequence[SpareGiven] = ()
    bounds: Sequence[Bound] = ()
    job_ends: Sequence[JobEnd] = ()
    reservations: Sequence[tuple[str, str]] = ()
    borrowed: Sequence[tuple[str, str, str]] = ()  # (cluster, node, run id): borrowed still, at the end
    lendable: Sequence[tuple[str, str]] = ()  # (cluster, node): the world's inference nodes
    begun: float = 0.0  # when the load began (0: the samples are not checked for gaps)
    clusters: Sequence[str] = ()
    quiet: Sequence[tuple[str, float, float]] = ()  # (cluster, from, to): the soak stopped its slurmctld


def check(r: Records) -> dict[str, list[Violation]]:
    """Every invariant's violations (an empty list: the invariant held), in INVARIANTS' order."""
    found: dict[str, list[Violation]] = {name: [] for name in INVARIANTS}
    for v in [
        *jobs_lost_or_killed(r.events, r.runs, r.job_ends),
        *drained_twice(r.events, r.runs, r.quiet),
        *requeued_twice(r.events, r.runs),
        *spares_twice(r.spares),
        *over_the_bound(r.samples, r.bounds, r.lendable),
        *(unsampled(r.samples, r.quiet, r.clusters, r.begun, r.end) if r.begun else []),
        *breaker_reset_alone(r.breaker),
        *endings(r.runs, r.end),
        *leaks(r.runs, r.grants, r.samples, r.reservations, r.events),
        *drains_unowned(r.samples, r.runs),
        *borrowed_unowned(r.borrowed, r.runs, r.end),
        *cordoned_twice(r.events, r.runs),
    ]:
        found[v.invariant].append(v)
    return found


def _by_cluster(samples: Sequence[NodeSample]) -> dict[str, list[NodeSample]]:
    grouped: dict[str, list[NodeSample]] = defaultdict(list)
    for s in samples:
        grouped[s.cluster].append(s)
    return grouped
