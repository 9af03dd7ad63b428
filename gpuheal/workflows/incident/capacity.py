"""The incident's side of capacity: the negotiation with its cluster's coordinator
(workflows/fleet.py) — admission (the cluster's policy, where the node sits, a repeat offender),
a grant before any capacity leaves service (asked again while held), its confirmation before a
replacement, its release at the close — and the `awaiting_capacity` stage when there is no
spare. Every coordinator call is an activity keyed by the incident, so a retried or replayed one
counts once; one unanswered after its attempts never fails the incident (holding.py names its
ending; a release unanswered is left to the coordinator's look for closed runs)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

from gpuheal.workflows import gate
from gpuheal.workflows.activity import COORDINATOR, ask_coordinator
from gpuheal.workflows.activity import run as act_run
from gpuheal.workflows.incident.state import IncidentState
from gpuheal.workflows.incident.timeline import in_stage, notify

with workflow.unsafe.imports_passed_through():
    from gpuheal.activities import interface as act
    from gpuheal.core import ids, policy, render
    from gpuheal.core.fleet.line import REASK_S, reask_after_s
    from gpuheal.core.fleet.models import AdmitAsk, CapacityDecision, CapacityRequest, GrantNotice, ReleaseRequest
    from gpuheal.core.fleet.reaping import REAP_EVERY_S
    from gpuheal.core.models.base import ActionClass, NodeState, Stage
    from gpuheal.core.models.replacement import ReplacementResult

# Incidents started before it cleared a notice only once they began to wait, so a grant that came
# during the containment drain was lost; they keep that path (workflow.patched) to replay.
KEEP_EARLY_GRANT = "keep-a-grant-that-comes-before-the-wait"
# Incidents started before it drained their node while held whatever the breaker said, outside
# any bound; they keep doing so (workflow.patched) to replay.
BOUNDED_CONTAINMENT = "containment-while-held-asks-the-coordinator"
# Incidents started before it drained their node without a grant when a later report escalated
# an action that needed none (an application restart) to one that drains.
ESCALATION_ASKS = "an-escalation-to-a-drain-asks-for-capacity"
# Incidents started before it were admitted once, whatever a later report made of them. From it,
# one admitted as an application fault whose reports now say hardware is admitted again as what
# it now is: the coordinator counted no arrival for the application fault (APP_FAULTS_APART), and
# the breaker, the escalation and the repeat-offender rule must see the hardware failure.
ESCALATION_ADMITS = "an-escalation-to-hardware-is-admitted-again"
# Incidents started before it were admitted, then asked for capacity in an update of its own: two
# of the coordinator's updates per incident. From it, the admission at triage asks for both, and
# the first request takes the answer that came with the admission (one decision per incident,
# gpuheal.core.fleet.admitting); a coordinator without it answers the admission alone (none came).
ADMIT_WITH_REQUEST = "the-admission-asks-for-capacity-too"
# Incidents started before it failed (no named ending; dedupe then took the run for one that
# handled nothing) when the coordinator did not answer a request, a confirmation or the release
# at the close after their attempts; they keep failing so (workflow.patched) to replay. Asked only
# once a call failed: a run whose calls were answered records nothing and replays as before.
UNANSWERED_IS_AN_ENDING = "an-unanswered-coordinator-is-a-named-ending"
# Incidents started before it waited for their grant notice alone, one timer to the hold bound;
# they keep doing so (workflow.patched) to replay.
REASK_WHILE_HELD = "a-held-incident-asks-the-coordinator-again"
# Incidents started before it asked again every REASK_S wherever they were in line: a line of
# thousands asked tens of times a second and swamped the incidents' worker. From it, the period
# grows with the place the coordinator last answered, up to a cap, drawn within a spread
# (gpuheal.core.fleet.line, whose numbers it freezes for the incidents that recorded it).
REASK_BY_PLACE = "a-held-incident-asks-again-less-often-further-back-in-line"
# Endings that leave the node drained by this incident: the coordinator keeps counting it.
STILL_OUT = frozenset(
    {
        NodeState.DRAINED,
        NodeState.BLOCKED,
        NodeState.AWAITING_REPLACEMENT,
        NodeState.ESCALATED,
        NodeState.FAILED_VALIDATION,
        NodeState.UNVALIDATED,
    }
)


async def admit(
    s: IncidentState, action: ActionClass, what: str, hardware: bool = False, with_request: bool = False
) -> None:
    """Admitted by the cluster's coordinator; `with_request` (at triage, from ADMIT_WITH_REQUEST
    on): its capacity request decided in the same update, kept for its first request."""
    asks = with_request and workflow.patched(ADMIT_WITH_REQUEST)
    if asks:
        _forget_earlier_notices(s)  # (asked now: a notice from here on answers it)
        s.capacity_asked = True
    ask = AdmitAsk(
        incident_id=s.ref.incident_id,
        run_id=workflow.info().first_execution_run_id,
        cluster=s.ref.cluster,
        node=s.ref.node,
        action=action,
        what=what,
        gpu_uuids=tuple(r.gpu_uuid for r in s.reports if r.gpu_uuid),
        gpu_serials=tuple(dict.fromkeys(r.gpu_serial for r in s.reports if r.gpu_serial)),
        application_fault=not hardware and policy.is_application_fault(s.reports),
        ask_capacity=asks,
        contain_if_held=asks and s.drain is None,
    )
    # The storm's calls (admission, grants) wait in the worker's line without heartbeats: a
    # thousand heartbeating waits cost the server a write each per 48 s, and on starved cores
    # missed their timeout and asked again (bench/results/storm-cluster.md). A worker killed
    # during one costs its 180 s; the calls after the grant (confirm, contain, release) beat.
    answer = await act_run(
        act.ADMIT_INCIDENT, ask, summary="admitted by the cluster's coordinator", timeout=COORDINATOR
    )
    s.settings, s.placement = answer.settings, answer.placement
    s.policy = answer.admission.policy
    s.repeat = answer.admission.repeat_offender
    s.admitted_as_application_fault = ask.application_fault
    s.admitted_decision = answer.decision if asks else None


async def count_rejected(s: IncidentState, new: str, detail: str) -> None:
    """A new node whose burn-in ran and failed is an arrival of its own at the coordinator, under
    a key of its own (counted once, however often this is retried): a run of bad spares, across
    incidents, trips the breaker as a run of failures does, and the node's repeats count it. The
    answer is the coordinator's word on that node, not on this incident: it changes nothing here."""
    ask = AdmitAsk(
        incident_id=s.ref.incident_id,
        run_id=ids.rejected_spare_run(workflow.info().first_execution_run_id, new),
        cluster=s.ref.cluster,
        node=new,
        action=ActionClass.REPLACE_NODE,
        what=f"new node {new} failed its burn-in: {detail}",
        no_domains=True,
    )
    try:
        await act_run(
            act.ADMIT_INCIDENT, ask, summary=f"count {new}'s failed burn-in at the coordinator", timeout=COORDINATOR
        )
    except ActivityError as err:  # uncounted, said: the incident goes on (the node is out either way)
        workflow.logger.warning("rejected spare %s not counted at the coordinator: %s", new, err.cause or err)


async def admit_again_if_hardware(s: IncidentState) -> None:
    """Admitted as an application fault (counted towards no hardware verdict), the incident now
    has a report that says hardware (an XID 79 or 94 joined its XID 13): it is admitted again, as
    what it now is (the same run: counted once), so the breaker and the escalation count it and a
    repeat offender is replaced. Asked before any capacity request and once its jobs are asked
    to checkpoint (a restart takes no capacity: no request comes)."""
    if not s.admitted_as_application_fault or policy.is_application_fault(s.reports):
        return
    if workflow.patched(ESCALATION_ADMITS):
        what = ", ".join(dict.fromkeys(r.describe() for r in s.reports))
        await admit(s, s.current_action(), what)


@dataclass(frozen=True)
class Unanswered:
    """The coordinator did not answer `asked` after its attempts (`cause`: the last error)."""

    asked: str
    cause: str


# A call for a grant: its answer, or none after its attempts.
Ask = Callable[[IncidentState], Awaitable[CapacityDecision | Unanswered]]


async def request(s: IncidentState, contain: bool = True) -> CapacityDecision | Unanswered:
    """Before capacity leaves service: granted now, or held in line (or no answer at all). Held,
    with the policy's containment (`contain`: it would wait in line), the answer says whether its
    node may be contained too (contained_while_held)."""
    await admit_again_if_hardware(s)
    if (early := s.admitted_decision) is not None:  # decided with its admission (ADMIT_WITH_REQUEST)
        s.admitted_decision = None
        return early
    _forget_earlier_notices(s)
    drains = s.cluster_policy.containment_while_held == "drain" and s.drain is None
    try:
        return await act_run(
            act.REQUEST_CAPACITY,
            _ask(s, contain_if_held=contain and drains),
            summary="ask the coordinator for capacity",
            timeout=COORDINATOR,
        )
    except ActivityError as err:
        return _unanswered("the request for capacity", err)


async def confirm(s: IncidentState) -> CapacityDecision | Unanswered:
    """Before replacing: the grant stands unless the breaker tripped or the domain escalated (or
    the coordinator does not answer: then it does not stand either)."""
    _forget_earlier_notices(s)
    try:
        return await ask_coordinator(act.CONFIRM_CAPACITY, _ask(s), summary="the grant still stands?")
    except ActivityError as err:
        return _unanswered("the confirmation of its grant", err)


def _unanswered(asked: str, err: ActivityError) -> Unanswered:
    if not workflow.patched(UNANSWERED_IS_AN_ENDING):
        raise err  # how incidents started before the fix ended (their histories replay so)
    workflow.logger.warning("the coordinator did not answer %s: %s", asked, err.cause or err)
    return Unanswered(asked=asked, cause=str(err.cause or err))


async def contained_while_held(s: IncidentState, decision: CapacityDecision) -> tuple[bool, str]:
    """Held: may the node be drained so nothing new lands on it? Answered with the request by a
    coordinator from CONTAIN_WITH_REQUEST on (asked with it), else asked now (may_contain)."""
    if s.drain is not None:
        return False, ""  # out of service already
    if decision.contained is not None:
        return decision.contained, decision.containment
    return await may_contain(s)


async def may_contain(s: IncidentState) -> tuple[bool, str]:
    """Held: may the node be drained so nothing new lands on it? The coordinator answers (within
    the containment bound, never while the breaker is tripped); incidents started before it
    asked only their policy."""
    drain = s.cluster_policy.containment_while_held == "drain"
    if not workflow.patched(BOUNDED_CONTAINMENT):
        return drain, "contained while held (nothing new lands on it)" if drain else ""
    if not drain:
        return False, ""  # the policy contains nothing while held: nothing to say
    try:
        answer = await ask_coordinator(
            act.CONTAIN_WHILE_HELD, _ask(s), summary="may the held node be contained?", attempts=5
        )
    except ActivityError as err:  # containment is optional: an unanswered ask never fails the incident
        return False, f"not contained: the coordinator did not answer ({err.cause or err})"
    return answer.granted, answer.reason


def _forget_earlier_notices(s: IncidentState) -> None:
    """Before asking: an earlier notice does not answer this request. From the moment the
    coordinator may answer, a notice is kept (it may come while the held incident is still
    being contained, before it waits)."""
    if workflow.patched(KEEP_EARLY_GRANT):
        s.grant = None


async def wait_for_grant(s: IncidentState, within_s: float, place: int | None = None) -> GrantNotice | None:
    """Held (at `place` in line, as last answered): the coordinator's notice (granted, or
    dismissed into a domain incident), or None at the bound. Meanwhile it asks again, less often
    the further back it is, at least three times within the bound (REASK_BY_PLACE; every REASK_S
    before it): a granted answer is a grant notice, a held one says its place now."""
    if not workflow.patched(KEEP_EARLY_GRANT):
        s.grant = None  # how incidents started before the fix waited (their histories replay so)
    bound = "held: capacity never freed within the bound"
    if not workflow.patched(REASK_WHILE_HELD):
        return await gate.wait_for(lambda: s.grant, within=timedelta(seconds=within_s), summary=bound)
    by_place = workflow.patched(REASK_BY_PLACE)
    until = workflow.now() + timedelta(seconds=within_s)
    while (left := until - workflow.now()) > timedelta(0):
        every = timedelta(seconds=reask_after_s(place, within_s, workflow.random().random()) if by_place else REASK_S)
        last = left <= every
        summary = bound if last else "held: ask the coordinator again"
        notice = await gate.wait_for(lambda: s.grant, within=min(left, every), summary=summary)
        if notice is not None or last:
            return notice
        again = await _ask_again(s)
        if s.grant is None and again is not None and again.granted:
            s.grant = GrantNotice(granted=True, reason=f"granted when asked again: {again.reason}")
        if s.grant is not None:  # that answer, or a notice that came while it was asked
            return s.grant
        if again is not None and again.position is not None:
            place = again.position
    return None


async def _ask_again(s: IncidentState) -> CapacityDecision | None:
    """The same request again (earlier notices kept); None when it was not answered: the wait
    goes on to its bound, as it would have without asking."""
    try:
        return await act_run(
            act.REQUEST_CAPACITY, _ask(s), summary="held: ask the coordinator again", timeout=COORDINATOR, attempts=3
        )
    except ActivityError as err:
        workflow.logger.warning("held: the coordinator did not answer again: %s", err.cause or err)
        return None


async def await_capacity(s: IncidentState, replace: Callable[[], Awaitable[ReplacementResult]]) -> bool:
    """The `awaiting_capacity` stage: no spare now; say so once, retry on a slow cadence, give up
    at the bound. True once a replacement came; False when none did (or an early give-back of a
    borrowed node ended it)."""
    bound = s.settings.capacity_wait_s
    # One bound for the whole search (from its first wait), however many new nodes failed
    # their burn-in meanwhile.
    waits = (r.started_at for r in s.stages if r.stage == Stage.AWAITING_CAPACITY)
    started = next(waits, None) or workflow.now()
    async with in_stage(s, Stage.AWAITING_CAPACITY) as rec:
        assert s.replacement is not None
        await notify(s, "awaiting_capacity", "warning", render.awaiting_capacity(s.replacement.no_capacity, 0, bound))
        replaced = await _retry_replacement(s, started, replace)
        waited = (workflow.now() - started).total_seconds()
        rec.outcome = replaced or render.awaiting_capacity(s.replacement.no_capacity, waited, bound)
    return replaced is not None


async def _retry_replacement(
    s: IncidentState, started: datetime, replace: Callable[[], Awaitable[ReplacementResult]]
) -> str | None:
    """Retry until the capacity bound (from `started`): the stage's outcome once a replacement
    came, None when it did not (or an early give-back of a borrowed node ended it)."""
    settings = s.settings
    while (workflow.now() - started).total_seconds() < settings.capacity_wait_s:
        asked = await gate.wait_for(
            lambda: s.give_back_by,
            within=timedelta(seconds=settings.capacity_retry_s),
            summary="no capacity: try the replacement again",
        )
        if asked is not None:
            break
        s.replacement = await replace()
        if s.replacement.new_node is not None:
            return render.replaced(s.replacement.new_node, s.ref.node)
    return None


def may_hold_from_admission(s: IncidentState) -> bool:
    """Its admission asked for capacity and was answered with a decision, or not answered at all
    (the coordinator may have decided it): a triage that fails now gives it back."""
    return s.capacity_asked and (s.policy is None or s.admitted_decision is not None)


async def release(s: IncidentState, attempts: int | None = None) -> None:
    """The node is back (or gone for good): the budget frees, whatever the outcome; also after a
    failed triage that may hold something from its admission (may_hold_from_admission)."""
    if (s.policy is None and not s.capacity_asked) or s.observing:
        return
    # Its run's holdings only (an activity's input is not part of replay: no patch needed).
    run_id = workflow.info().first_execution_run_id
    left = s.node_at.state in STILL_OUT and s.drain is not None and s.drain.drained_by_us
    req = ReleaseRequest(
        cluster=s.ref.cluster,
        incident_id=s.ref.incident_id,
        run_id=run_id,
        left_drained=left,
        placement=s.placement,  # a coordinator whose books lost this run still counts its node left
    )
    try:
        await ask_coordinator(
            act.RELEASE_CAPACITY, req, summary="give the capacity back to the cluster", attempts=attempts
        )
    except ActivityError as err:  # the incident has its result: an unanswered release never fails it
        if not workflow.patched(UNANSWERED_IS_AN_ENDING):
            raise  # how incidents started before the fix ended (their histories replay so)
        kept = f"; {s.ref.node}, still drained by it, stays counted as left until it is back" if left else ""
        s.done.append(
            f"release did not land ({err.cause or err}): the coordinator's look for closed runs "
            f"(every {REAP_EVERY_S:g} s) gives back what this run held{kept}"
        )
        workflow.logger.warning("release did not land: %s", err.cause or err)


def _ask(s: IncidentState, contain_if_held: bool = False) -> CapacityRequest:
    assert s.placement is not None
    return CapacityRequest(
        cluster=s.ref.cluster,
        incident_id=s.ref.incident_id,
        placement=s.placement,
        action=s.current_action(),
        run_id=workflow.info().first_execution_run_id,
        contain_if_held=contain_if_held,
    )
