"""What operators do to the coordinator, as pure functions over FleetState (as
gpuheal.core.fleet.coordination does for incidents): pause and resume the breaker, change the mode or
the policy, override a hold, decide a domain incident. Each is one handler of workflows/fleet.py,
recorded there with operator and reason."""

from __future__ import annotations

from datetime import datetime

from gpuheal.core.fleet.coordination import Effects, grant, serve_queue
from gpuheal.core.fleet.models import (
    Breaker,
    DomainDecision,
    FleetState,
    GrantNotice,
    NodeReturn,
    OperatorAction,
    Override,
)
from gpuheal.core.fleet.policy import ConfiguredPolicy, FleetPolicy, VersionedPolicy
from gpuheal.core.models.base import Severity


def pause(s: FleetState, by: OperatorAction, now: datetime) -> tuple[str, Effects]:
    """Trip the breaker by hand: new incidents are held, nothing is replaced."""
    s.breaker = Breaker(tripped=True, at=now, why=f"paused by {by.operator}: {by.reason}", by=by.operator)
    note: tuple[str, Severity, str] = ("breaker_paused", "warning", f"gpuheal paused by {by.operator}: {by.reason}")
    return f"paused by {by.operator}", Effects(notes=[note])


def resume(s: FleetState, by: OperatorAction, now: datetime) -> tuple[str, Effects]:
    """Reset the breaker (it never resets by itself); held incidents go on, within the budget."""
    was = s.breaker
    s.breaker = Breaker(by=by.operator, at=now)
    out = Effects(notes=[("breaker_reset", "info", f"circuit breaker reset by {by.operator}: {by.reason}")])
    out += serve_queue(s, now)
    return f"resumed by {by.operator} (was: {was.why}); {len(s.queue)} still held", out


def set_policy(
    s: FleetState, new: FleetPolicy, operator: str, reason: str, now: datetime, serve: bool = True
) -> tuple[str, Effects]:
    v = s.policy.version + 1
    s.policy = VersionedPolicy(version=v, policy=new, changed_by=operator, reason=reason, at=now)
    out = Effects(notes=[("policy_changed", "info", f"policy version {v} by {operator}: {reason}")])
    if serve:
        out += serve_queue(s, now)  # a larger budget lets the line move
    return f"policy version {v}", out


def override(s: FleetState, o: Override, now: datetime) -> tuple[str, Effects]:
    """Let one held incident go now, past the budget (the operator answers for it)."""
    held = next((h for h in s.queue if h.incident_id == o.incident_id), None)
    if held is None:
        raise ValueError(f"{o.incident_id} is not held")
    s.queue.remove(held)
    grant(s, held.incident_id, held.run_id, held.placement, now, override=f"{o.operator}: {o.reason}")
    notice = GrantNotice(granted=True, reason=f"override by {o.operator}: {o.reason}")
    return f"{o.incident_id} granted by {o.operator}", Effects(signals=[(held.incident_id, notice)])


def holder_of(s: FleetState, node: str) -> str | None:
    """The open incident whose grant, containment, taking back or place in line is this node's,
    if any: its node is that incident's to give back, not an operator's to return."""
    held = (g.incident_id for book in s.books() for g in book.values() if g.node == node)
    return next(held, None) or next((h.incident_id for h in s.queue if h.node == node), None)


def return_node(s: FleetState, r: NodeReturn, now: datetime, keep_counted: bool = True) -> tuple[str, Effects]:
    """An operator returns a node an incident left drained (`gpuheal return`, which resumes it
    in Slurm after this answers). Its cooldown starts now, so no new incident of the node is
    granted it before the resume. It stays counted, as left, until a look sees Slurm show it back
    (asked RETURN_LOOK_S from now): a resume that fails (slurmctld stopped) leaves it drained,
    and the books must not free a slot for a node still out. `keep_counted=False` is how
    coordinators before RETURN_KEEPS_COUNT answered (freed at once; their histories replay so).
    A node an open incident holds is that incident's to give back (refused before: the validator)."""
    gone = s.left.get(r.node)
    if gone is None:
        return f"{r.node} was not counted as left drained: nothing to free", Effects()
    s.last_release[r.node] = now
    if keep_counted:
        s.returning[r.node] = now
        text = f"{r.node} (left drained by {gone.incident_id}) being returned to service by {r.operator}: {r.reason}"
        out = Effects(notes=[("node_returned", "info", f"{text} (counted until Slurm shows it back)")])
        return f"{r.node} counted until Slurm shows it back in service; {len(s.queue)} held", out
    text = f"{r.node} (left drained by {gone.incident_id}) returned to service by {r.operator}: {r.reason}"
    out = Effects(notes=[("node_returned", "info", text)])
    s.left.pop(r.node)
    out += serve_queue(s, now)
    return f"{r.node} no longer counted; {len(s.queue)} still held", out


def domain_decision(s: FleetState, d: DomainDecision, now: datetime) -> tuple[str, Effects]:
    """A domain incident's operator decided: release its node incidents (within the budget) or
    dismiss them (they end, the domain is handled as one)."""
    incident = s.domain_incidents.get(d.domain)
    if incident is None:
        return f"no domain incident for {d.domain}", Effects()
    if incident.decided:
        return f"{d.domain}: already {incident.decided}", Effects()
    s.domain_incidents[d.domain] = incident.model_copy(update={"decided": d.decision, "decided_at": now})
    out = Effects()
    if d.decision == "dismiss":
        mine = [h for h in s.queue if d.domain in h.placement.domains]
        s.queue = [h for h in s.queue if h not in mine]
        for h in mine:
            why = f"dismissed by domain incident {incident.incident_id} ({d.operator}: {d.reason})"
            out.signals.append((h.incident_id, GrantNotice(granted=False, reason=why)))
    out += serve_queue(s, now)
    return f"{d.domain}: {d.decision} by {d.operator}", out


# How many configurations offered before the last one the coordinator remembers (FleetState.configured_before):
# more than a rollout's stale pods can bring back, few enough to carry across continue-as-new.
CONFIGURED_BEFORE_MOST = 32


def configure(s: FleetState, c: ConfiguredPolicy, now: datetime, refuse_earlier: bool = True) -> tuple[str, Effects]:
    """A worker started with its configured policy. The configuration changed since a worker
    last offered one (a Helm upgrade, a new policy file): it is applied, as a change by the
    configuration, with its version. The same configuration again (a restarted or a second
    worker): the cluster's policy stands, whatever an operator changed since; a restart must
    never undo a recorded change. A configuration offered before the last one (an older worker
    restarting in the middle of a rollout, or a rollback) is refused: it never undoes a newer
    one; a person applies an older policy with `gpuheal policy apply`. A coordinator that kept
    no digest yet (started by the release before) records the first one offered and keeps its
    policy: an upgrade undoes nothing. `refuse_earlier=False` is how the release before answered
    (a coordinator's history from then replays so: workflow.patched in workflows/fleet.py)."""
    v = s.policy.version
    if c.digest == s.configured:
        return f"configuration {c.digest} unchanged: the cluster's policy version {v} stands", Effects()
    if refuse_earlier and c.digest in s.configured_before:
        return (
            f"configuration {c.digest} was offered before {s.configured} (an older worker): not applied again;"
            f" the cluster's policy version {v} stands (to apply it, `gpuheal policy apply`)"
        ), Effects()
    if s.configured:
        s.configured_before = [*s.configured_before, s.configured][-CONFIGURED_BEFORE_MOST:]
    first, s.configured = not s.configured, c.digest
    if first:  # a coordinator of the release before, which kept no digest: its policy stands
        return f"configuration {c.digest} recorded; the cluster's policy version {v} stands", Effects()
    if c.policy == s.policy.policy:
        return f"configuration {c.digest} recorded: it is policy version {v} already", Effects()
    _, out = set_policy(s, c.policy, f"configuration ({c.by})", f"the configuration changed ({c.digest})", now)
    return f"configuration {c.digest} applied as policy version {s.policy.version} (was {v})", out
