"""The incident's side of capacity: the negotiation with its cluster's coordinator
(workflows/fleet.py) — admission (the cluster's policy, where the node sits, a repeat offender),
a grant before any capacity leaves service, its confirmation before a replacement, its release
at the close — and the wait for a replacement when there is no spare. Every coordinator call is
an activity keyed by the incident, so a retried or replayed one counts once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

from gpuheal.workflows import gate
from gpuheal.workflows.activity import COORDINATOR, ask_coordinator
from gpuheal.workflows.activity import run as act_run
from gpuheal.workflows.incident.state import IncidentState

with workflow.unsafe.imports_passed_through():
    from gpuheal.activities import interface as act
    from gpuheal.core import render
    from gpuheal.core.fleet.models import AdmitAsk, CapacityDecision, CapacityRequest, GrantNotice, ReleaseRequest
    from gpuheal.core.models.base import ActionClass, NodeState
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
# Endings that leave the node drained by this incident: the coordinator keeps counting it.
STILL_OUT = frozenset(
    {
        NodeState.DRAINED,
        NodeState.BLOCKED,
        NodeState.AWAITING_REPLACEMENT,
        NodeState.ESCALATED,
        NodeState.FAILED_VALIDATION,
    }
)


async def admit(s: IncidentState, action: ActionClass, what: str) -> None:
    ask = AdmitAsk(
        incident_id=s.ref.incident_id,
        run_id=workflow.info().first_execution_run_id,
        cluster=s.ref.cluster,
        node=s.ref.node,
        action=action,
        what=what,
        gpu_uuids=tuple(r.gpu_uuid for r in s.reports if r.gpu_uuid),
        gpu_serials=tuple(dict.fromkeys(r.gpu_serial for r in s.reports if r.gpu_serial)),
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


async def request(s: IncidentState) -> CapacityDecision:
    """Before capacity leaves service: granted now, or held in line."""
    _forget_earlier_notices(s)
    return await act_run(act.REQUEST_CAPACITY, _ask(s), summary="ask the coordinator for capacity", timeout=COORDINATOR)


async def confirm(s: IncidentState) -> CapacityDecision:
    """Before replacing: the grant stands unless the breaker tripped or the domain escalated."""
    _forget_earlier_notices(s)
    return await ask_coordinator(act.CONFIRM_CAPACITY, _ask(s), summary="the grant still stands?")


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


async def wait_for_grant(s: IncidentState, within_s: float) -> GrantNotice | None:
    """Held: the coordinator's notice (granted, or dismissed into a domain incident), or None."""
    if not workflow.patched(KEEP_EARLY_GRANT):
        s.grant = None  # how incidents started before the fix waited (their histories replay so)
    return await gate.wait_for(
        lambda: s.grant, within=timedelta(seconds=within_s), summary="held: capacity never freed within the bound"
    )


async def await_replacement(
    s: IncidentState, started: datetime, replace: Callable[[], Awaitable[ReplacementResult]]
) -> str | None:
    """No spare since `started`: retry on a slow cadence until the capacity bound. The stage's
    outcome once a replacement came, None when it did not (or an early give-back of a borrowed
    node ended it)."""
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


async def release(s: IncidentState) -> None:
    """The node is back (or gone for good): the budget frees, whatever the outcome."""
    if s.policy is None or s.observing:
        return
    # Its run's holdings only (an activity's input is not part of replay: no patch needed).
    run_id = workflow.info().first_execution_run_id
    left = s.node_at.state in STILL_OUT and s.drain is not None and s.drain.drained_by_us
    req = ReleaseRequest(cluster=s.ref.cluster, incident_id=s.ref.incident_id, run_id=run_id, left_drained=left)
    await ask_coordinator(act.RELEASE_CAPACITY, req, summary="give the capacity back to the cluster")


def _ask(s: IncidentState) -> CapacityRequest:
    assert s.placement is not None
    return CapacityRequest(
        cluster=s.ref.cluster,
        incident_id=s.ref.incident_id,
        placement=s.placement,
        action=s.current_action(),
        run_id=workflow.info().first_execution_run_id,
    )
