"""The coordinator's state changes, as pure functions over FleetState.

Each of the coordinator's handlers (workflows/fleet.py) is one call here: it changes the state
and returns what must then be done outside it (Effects: grant notices to held incidents, notices
to the operators, domain incidents to open). Being pure, the whole coordinator can be driven by
a property-based test (tests/test_coordination.py) through arrivals, requests, releases, trips,
overrides, policy changes and clock steps, and its invariants checked after every step: never
more out of service than the budget allows, a tripped breaker resets only by a person, a held
incident goes as soon as its limit frees.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpuheal.core import ids
from gpuheal.core.fleet import breaker, budget, index, reaping, repeats, windows
from gpuheal.core.fleet.models import (
    Admission,
    Admitting,
    Arrival,
    Breaker,
    CapacityDecision,
    CapacityRequest,
    DomainIncident,
    FleetState,
    Grant,
    GrantNotice,
    Held,
    Placement,
    RunRef,
)
from gpuheal.core.models.base import ActionClass, Severity


@dataclass
class Effects:
    """What a state change asks to be done: the coordinator's loop does it, outside the handler."""

    signals: list[tuple[str, GrantNotice]] = field(default_factory=list)  # to held incidents
    notes: list[tuple[str, Severity, str]] = field(default_factory=list)  # to the operators
    domains: list[DomainIncident] = field(default_factory=list)  # domain incidents to open

    def __iadd__(self, other: Effects) -> Effects:
        self.signals += other.signals
        self.notes += other.notes
        self.domains += other.domains
        return self


# --- incidents ------------------------------------------------------------------------------


def admit(
    s: FleetState,
    req: Admitting,
    now: datetime,
    serve_when_freed: bool = False,
    compact: bool = False,
    app_faults_apart: bool = False,
) -> tuple[Admission, Effects]:
    """A new incident: its arrival counts (once per run), the breaker and the domains are checked.
    With `serve_when_freed` (coordinators that serve the line only when something frees), the
    line is served when time freed something (a cooldown ended, the rate's window slid). With
    `compact` (coordinators from PACKED on), the repeat window's arrivals are kept compact and
    counted by key (gpuheal.core.fleet.repeats): the cost does not grow with a week's arrivals.
    With `app_faults_apart` (from APP_FAULTS_APART on), an application fault
    (`req.application_fault`, policy.is_application_fault) is no arrival: it moves no breaker, no
    domain and no repeat count, and is told no repeat verdict (a job's crashes never condemn a
    board)."""
    out = Effects()
    freed = windows.forget_before(s, now, compact=compact)
    budget.note_sizes(s, req.placement)
    if app_faults_apart and req.application_fault:
        domain = breaker.escalated_domain(s, req.placement)
        answer = Admission(
            policy=s.policy,
            domain_incident=domain.incident_id if domain else None,
            breaker=s.breaker.why if s.breaker.tripped else None,
        )
        return answer, serve_queue(s, now) if serve_when_freed and freed else out
    if compact:
        new = not repeats.seen(s, req.incident_id, req.run_id, req.placement.node, now)
    else:
        new = (req.incident_id, req.run_id) not in index.arrivals(s).runs
    if new:
        s.arrivals.append(
            Arrival(
                at=now,
                incident_id=req.incident_id,
                run_id=req.run_id,
                node=req.placement.node,
                domains=tuple(req.placement.domains),
                gpu_uuids=req.gpu_uuids,
                gpu_serials=req.gpu_serials,
            )
        )
        out += _check_breaker(s, req.placement, now)
        out += _check_domains(s, req.placement, now)
    if compact:
        repeat = repeats.repeat_offender(s, req.placement.node, req.gpu_uuids, req.gpu_serials, now)
    else:
        repeat = breaker.repeat_offender(
            s.arrivals, req.placement.node, req.gpu_uuids, now, s.policy.policy.repeat, req.gpu_serials
        )
    domain = breaker.escalated_domain(s, req.placement)
    answer = Admission(
        policy=s.policy,
        repeat_offender=repeat,
        domain_incident=domain.incident_id if domain else None,
        breaker=s.breaker.why if s.breaker.tripped else None,
    )
    if serve_when_freed and freed:
        out += serve_queue(s, now)
    return answer, out


def _check_breaker(s: FleetState, placement: Placement, now: datetime) -> Effects:
    if s.breaker.tripped:
        return Effects()
    why = breaker.breaker_trip(s, placement, now)
    if why is None:
        return Effects()
    window = windows.within(s.arrivals, now, s.policy.policy.breaker.window_s)
    nodes = tuple(sorted({a.node for a in window}))
    s.breaker = Breaker(tripped=True, at=now, why=why, nodes=nodes, by="gpuheal")
    text = (
        f"circuit breaker tripped: {why}; nodes {', '.join(nodes)}. New incidents are recorded and held, "
        "nothing is replaced, until `gpuheal resume --operator NAME --reason TEXT`."
    )
    return Effects(notes=[("breaker_tripped", "critical", text)])


def _check_domains(s: FleetState, placement: Placement, now: datetime) -> Effects:
    found = breaker.escalation(s, placement, now)
    if found is None:
        return Effects()
    domain, nodes = found
    incident_id = ids.domain_incident_id(s.cluster, domain, now)
    d = DomainIncident(cluster=s.cluster, domain=domain, incident_id=incident_id, nodes=tuple(nodes), opened_at=now)
    s.domain_incidents[domain] = d
    # Those already in line for this domain are held by the domain incident now.
    why = f"held by domain incident {incident_id}"
    s.queue = [
        h.model_copy(update={"reason": why}) if domain in h.placement.domains and h.reason != why else h
        for h in s.queue
    ]
    return Effects(domains=[d])


def request(
    s: FleetState,
    req: CapacityRequest,
    now: datetime,
    tell_requester: bool = False,
    counts_left: bool = True,
    serve_when_freed: bool = False,
) -> tuple[CapacityDecision, Effects]:
    """May this incident take its node out of service now? Idempotent: asked again, the same
    answer (granted, or its place in line). Granted while the line is served, it hears it in the
    answer; a notice as well (`tell_requester`, as the coordinators of the release before sent)
    could arrive late, after a later confirmation took the grant back, and be taken for a grant."""
    answer, out, serve = _decide(s, req, now, counts_left, serve_when_freed)
    if answer is not None:
        return answer, out
    if serve:
        out += serve_queue(s, now)
    return _in_line(s, req, out, tell_requester), out


def request_many(
    s: FleetState,
    reqs: Iterable[CapacityRequest],
    now: datetime,
    tell_requester: bool = False,
    counts_left: bool = True,
    serve_when_freed: bool = True,
) -> tuple[list[CapacityDecision], Effects]:
    """A batch's requests (workflows/fleet.py's request_capacity_many), each decided in its order
    as `request` would, the line served once at the end if any of them had room or freed
    something: a batch costs one pass over the line, not one per request (a storm's batch of 20
    beside a thousand held would otherwise take seconds of one workflow task). Each incident
    hears its own answer, granted by that pass or its place in line after it. A coordinator from
    before SERVE_WHEN_FREED (`serve_when_freed` False) serves after every batch that put anyone in
    line, as its single requests do: it does not serve what time freed anywhere else."""
    out, decided, serve = Effects(), [], False
    reqs = list(reqs)
    for req in reqs:
        answer, effects, wants = _decide(s, req, now, counts_left, serve_when_freed)
        out += effects
        serve = serve or wants
        decided.append(answer)
    if serve:
        out += serve_queue(s, now)
    # Every answer is read after that pass: one held may have been granted by it, or (a later run
    # of the same incident asking in the same batch) dropped.
    answers = [_in_line(s, req, out, tell_requester, answer) for req, answer in zip(reqs, decided, strict=True)]
    return answers, out


def _decide(
    s: FleetState, req: CapacityRequest, now: datetime, counts_left: bool, serve_when_freed: bool
) -> tuple[CapacityDecision | None, Effects, bool]:
    """One request decided up to serving the line: its answer if that is already known (granted
    at once, or asked again), else None with the request in line, and whether the line must be
    served for it: it may go at once if the ones ahead cannot (another pool); the ones ahead may
    go only if this call freed something (`serve_when_freed`, coordinators from SERVE_WHEN_FREED
    on). Otherwise the line was served at the last change and nobody can go now: a storm's
    thousandth request costs one decision, not a thousand. Earlier coordinators serve at every
    request."""
    before = _what_frees(s)
    out = _forget_earlier_run(s, req, now, counts_left)
    if req.incident_id in s.grants:
        return CapacityDecision(granted=True, reason="granted already", already=True), out, False
    first = next(index.line(s).places(req.incident_id), None)  # its first run in line
    if first is not None:
        place = first[0]
        answer = CapacityDecision(granted=False, reason=s.queue[place - 1].reason, position=place, already=True)
        return answer, out, False
    freed = windows.forget_before(s, now)
    budget.note_sizes(s, req.placement)
    granted, why = budget.capacity_decision(s, req, now)
    if granted and not s.queue:  # nobody is ahead in line
        grant(s, req.incident_id, req.run_id, req.placement, now)
        return CapacityDecision(granted=True, reason=why), out, False
    s.queue.append(_held(req, now, "others are ahead in line" if granted else why))
    return None, out, not serve_when_freed or granted or freed or _what_frees(s) != before


def _in_line(
    s: FleetState, req: CapacityRequest, out: Effects, tell_requester: bool, first: CapacityDecision | None = None
) -> CapacityDecision:
    """A request that went in line (or one `first` answered, in a batch), after the line was
    served: granted (by that pass: it hears it in its answer, not also in a notice, unless
    `tell_requester`), or its place in line."""
    already = first is not None and first.already

    def mine(incident_id: str, run_id: str) -> bool:  # this run's ("" is the same run, as reaping says)
        return incident_id == req.incident_id and not reaping.earlier_run(run_id, req.run_id)

    places = index.line(s).places(req.incident_id)  # (its runs in line, not the whole line)
    position = next((p for p, run_id in places if mine(req.incident_id, run_id)), None)
    if position is None:
        granted = s.grants.get(req.incident_id)
        if granted is None or not mine(granted.incident_id, granted.run_id):  # a later run asked in the batch
            return CapacityDecision(granted=False, reason="a later run of this incident asked since", already=already)
        if not tell_requester:  # granted by serving the line
            out.signals = [(i, n) for i, n in out.signals if i != req.incident_id]
        if first is not None and first.granted:
            return first
        return CapacityDecision(granted=True, reason="within the disruption budget", already=already)
    return CapacityDecision(granted=False, reason=s.queue[position - 1].reason, position=position, already=already)


def confirm(
    s: FleetState,
    req: CapacityRequest,
    now: datetime,
    contain: bool = True,
    tell_requester: bool = False,
    counts_left: bool = True,
) -> tuple[CapacityDecision, Effects]:
    """Before a replacement: a grant stands unless the breaker has tripped or the node's domain
    has become a domain incident since; then it is taken back and the incident held. Its node
    stays drained (nothing is replaced), so with `contain` it keeps counting against the budget
    until released, and the rate slot it held serves the line. (`contain` False: as the
    coordinators of the release before did, which freed the budget and served no one.)"""
    if req.incident_id not in s.grants or reaping.earlier_run(s.grants[req.incident_id].run_id, req.run_id):
        return request(s, req, now, tell_requester=tell_requester, counts_left=counts_left)
    domain = breaker.escalated_domain(s, req.placement)
    grant = s.grants[req.incident_id]
    why = ""
    if s.breaker.tripped and grant.override is None:  # an operator's override answers for the breaker
        why = f"circuit breaker tripped ({s.breaker.why}); `gpuheal resume` resets it"
    elif domain is not None and (grant.override is None or domain.opened_at > grant.at):
        why = f"held by domain incident {domain.incident_id} ({domain.domain}: suspected switch, power or cooling)"
    if not why:
        return CapacityDecision(granted=True, reason="the grant stands", already=True), Effects()
    s.grants.pop(req.incident_id)
    if contain:
        s.contained[req.incident_id] = grant  # still out: still counted
        if grant.at in s.remediations:  # granted again later, it counts against the rate once
            s.remediations.remove(grant.at)
    s.queue.append(_held(req, now, why))
    out = serve_queue(s, now) if contain else Effects()  # it stays held (breaker, domain); others may go
    position = next((i + 1 for i, h in enumerate(s.queue) if h.incident_id == req.incident_id), len(s.queue))
    return CapacityDecision(granted=False, reason=why, position=position), out


def release(
    s: FleetState,
    incident_id: str,
    now: datetime,
    run_id: str = "",
    left_drained: bool = False,
    keep_contained: bool = False,
    placement: Placement | None = None,
) -> tuple[str, Effects]:
    """The incident gave its node back (closed, aborted, returned): budget frees, the next in
    line may go. Idempotent. With its `run_id`, only what that run holds: a late release of a
    run that was terminated never frees its node's next run's grant.

    An incident that ends with its node still drained by it (`left_drained`: not granted after a
    containment, no capacity for a replacement, aborted after the drain) gives back its place,
    not the node: the node stays counted, as `left`, until a look for closed runs finds it back
    in service (within REAP_EVERY_S) or its node's next incident takes it over; else a budget
    would free for nodes that are still out. Incidents of an earlier release do not say; for
    them (`keep_contained`) a node contained while held is taken as still drained. A run the
    books do not know (a rebuild that could not see it, a look that reaped it early) that leaves
    its node drained (`placement` says where) has it counted as left all the same."""

    def mine(g: Grant | Held) -> bool:
        return not run_id or not g.run_id or g.run_id == run_id

    held = [book[incident_id] for book in s.books() if incident_id in book]
    if not all(mine(g) for g in held):
        return f"nothing held by run {run_id} of {incident_id} (its run {held[0].run_id} holds it)", Effects()
    popped = [book.pop(incident_id, None) for book in s.books()]
    grant = next((g for g in popped if g is not None), None)
    contained = popped[2]  # it was contained while held
    s.queue = [h for h in s.queue if h.incident_id != incident_id or not mine(h)]
    stays = grant is not None and (left_drained or (keep_contained and contained is not None))
    if grant is not None and stays and grant.node not in {g.node for g in s.grants.values()}:
        s.left[grant.node] = grant
    if grant is None and left_drained and placement is not None and not _counted(s, placement.node):
        p = placement
        budget.note_sizes(s, p)
        s.left[p.node] = Grant(
            incident_id=incident_id, run_id=run_id, node=p.node, pool=p.pool, domains=tuple(p.domains), at=now
        )
        return f"{p.node} was not in the books: counted as left drained until it is back in service", Effects()
    if grant is not None:
        s.last_release[grant.node] = now
    out = serve_queue(s, now)
    if grant is not None and stays:
        return f"released {grant.node} (still drained: counted until it is back in service)", out
    return (f"released {grant.node}" if grant else "nothing held"), out


def _counted(s: FleetState, node: str) -> bool:
    return node in s.left or any(g.node == node for book in s.books() for g in book.values())


def _held(req: CapacityRequest, now: datetime, why: str) -> Held:
    p = req.placement
    return Held(incident_id=req.incident_id, run_id=req.run_id, node=p.node, placement=p, since=now, reason=why)


def grant(
    s: FleetState, incident_id: str, run_id: str, placement: Placement, now: datetime, override: str | None = None
) -> None:
    s.contained.pop(incident_id, None)  # taken back once, given again: counted once, as a grant
    s.containing.pop(incident_id, None)  # contained while held: now out under the budget
    s.left.pop(placement.node, None)  # left drained by an earlier incident: this one takes it over
    s.returning.pop(placement.node, None)
    s.grants[incident_id] = Grant(
        incident_id=incident_id,
        run_id=run_id,
        node=placement.node,
        pool=placement.pool,
        domains=tuple(placement.domains),
        at=now,
        override=override,
    )
    s.remediations.append(now)
    s.decisions += 1


def _what_frees(s: FleetState) -> tuple[int, ...]:
    """What, changed within a request, may let a held incident go: what is out (an earlier run's
    grant dropped). Time's frees are forget_before's; sizes do not enter a held incident's
    decision (its own placement does), nor can the breaker or the policy change here."""
    return (len(s.grants), len(s.contained), len(s.containing), len(s.left))


def serve_freed(s: FleetState, now: datetime) -> Effects:
    """The loop back from elsewhere, with time's frees not yet served (frees_due): forget them
    and serve the line."""
    windows.forget_before(s, now)
    return serve_queue(s, now)


def frees_due(s: FleetState, now: datetime) -> bool:
    """Whether time has freed something nobody has served yet: the coordinator's loop was away
    from its timer when it came (sending notices, continuing as new)."""
    return windows.time_freed(s, now)


def serve_queue(s: FleetState, now: datetime) -> Effects:
    """Grant, in order, every held incident the budget has room for now."""
    out = Effects()
    still: list[Held] = []
    seen = budget.Pass(s, now)  # (what every decision reads alike: counted once per pass)
    for held in s.queue:
        req = CapacityRequest(
            cluster=s.cluster, incident_id=held.incident_id, placement=held.placement, action=ActionClass.REPLACE_NODE
        )
        granted, why = budget.capacity_decision(s, req, now, seen)
        if granted:
            grant(s, held.incident_id, held.run_id, held.placement, now)
            seen.refresh()
            out.signals.append((held.incident_id, GrantNotice(granted=True, reason=why)))
        else:
            still.append(held if held.reason == why else held.model_copy(update={"reason": why}))
    s.queue = still
    return out


def next_wake(s: FleetState, now: datetime) -> datetime | None:
    """When a held incident's limit frees by time alone (a held node's cooldown ends, or, with the
    rate reached, a remediation leaves its window), or None. The coordinator serves its line
    again then, with no other event needed."""
    if not s.queue or s.breaker.tripped:
        return None
    b = s.policy.policy.budget
    recent, _ = windows.still_counted(s, now)
    times = [min(recent) + timedelta(seconds=b.rate_window_s)] if len(recent) >= b.rate else []
    held_nodes = {h.node for h in s.queue}
    times += [t + timedelta(seconds=b.node_cooldown_s) for n, t in s.last_release.items() if n in held_nodes]
    later = [t for t in times if t > now]
    return min(later) if later else None


def contain(
    s: FleetState, req: CapacityRequest, now: datetime, counts_left: bool = True
) -> tuple[CapacityDecision, Effects]:
    """May a held incident drain its node as containment (nothing new lands on it)? Within the
    containment bound, never while the breaker is tripped. Idempotent: asked again, the same."""
    out = _forget_earlier_run(s, req, now, counts_left)
    if req.incident_id in s.containing:
        return CapacityDecision(granted=True, reason="contained already", already=True), out
    if req.incident_id in s.grants or req.incident_id in s.contained:
        return CapacityDecision(granted=True, reason="its node is out of service already", already=True), out
    if (req.incident_id, req.run_id) not in index.line(s).runs:
        return CapacityDecision(granted=False, reason="not contained: it is not in line (dismissed, or done)"), out
    if req.placement.node in s.returning:  # an operator's resume follows: a drain now would be undone
        why = "not contained: an operator is returning its node (`gpuheal return`), its resume in Slurm to follow"
        return CapacityDecision(granted=False, reason=why), out
    if req.placement.node in s.left:  # drained still by an earlier run: counted once, as that left node
        why = "its node is drained already (left by an earlier run, counted until back)"
        return CapacityDecision(granted=True, reason=why, already=True), out
    budget.note_sizes(s, req.placement)
    ok, why = budget.containment_decision(s, req, total_bound=counts_left)
    if ok:
        p = req.placement
        s.containing[req.incident_id] = Grant(
            incident_id=req.incident_id, run_id=req.run_id, node=p.node, pool=p.pool, domains=tuple(p.domains), at=now
        )
    return CapacityDecision(granted=ok, reason=why), out


# --- runs that ended without giving back (gpuheal.core.fleet.reaping) ---------------------------------


def _forget_earlier_run(s: FleetState, req: CapacityRequest, now: datetime, keep_left: bool = True) -> Effects:
    """A new run of an incident asks while an earlier, closed run of it still holds something
    (terminated: it ran no code to give it back): that is dropped first, so the new run is
    decided on its own (before, it found "granted already" and skipped breaker and budget). A
    node the earlier run had drained stays counted, as left by it, until a look finds it back in
    service or the new run is granted it (it may be held: the node is still out meanwhile)."""
    earlier = {run for run in reaping.runs_of(s, req.incident_id) if reaping.earlier_run(run[1], req.run_id)}
    if not earlier:
        return Effects()
    for book in s.books() if keep_left else ():
        g = book.get(req.incident_id)
        if g is not None and (g.incident_id, g.run_id) in earlier:
            s.left.setdefault(g.node, g)
    dropped = reaping.drop(s, earlier)
    text = f"{req.incident_id}: an earlier run ended holding {', '.join(dropped)}; its new run is decided afresh"
    return Effects(notes=[("grants_reaped", "info", text)])


def reap(
    s: FleetState, closed: Iterable[RunRef], asked: Iterable[RunRef], still_drained: Iterable[RunRef], now: datetime
) -> Effects:
    """What a look for closed runs found, given back (gpuheal.core.fleet.reaping.reap), and the line
    served with what freed."""
    out = Effects(notes=reaping.reap(s, closed, asked, still_drained, now))
    if out.notes:
        out += serve_queue(s, now)
    return out
