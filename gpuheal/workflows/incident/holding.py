"""Going on only with a grant: the `held` stage (in line, contained where the coordinator lets
it, asking again while it waits) and the endings without one: never granted within the bound,
dismissed into its domain incident, or a coordinator that did not answer. Each ending is named,
its jobs accounted for; a run that failed instead would be taken by dedupe for one that handled
nothing, and its node remediated again."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from temporalio import workflow

from gpuheal.workflows.incident import capacity, jobs
from gpuheal.workflows.incident.state import IncidentState
from gpuheal.workflows.incident.timeline import in_stage, notify

with workflow.unsafe.imports_passed_through():
    from gpuheal.core import render
    from gpuheal.core.fleet.models import CapacityDecision
    from gpuheal.core.models.base import NodeState, Outcome, Stage


async def granted(s: IncidentState, decision: CapacityDecision, drain: Callable[[str], Awaitable[None]]) -> bool:
    """Granted at once, or after waiting in line in `held` (with the policy's containment:
    `drain`, the workflow's drain and cordon stages)."""
    if decision.granted:
        return True
    limit = s.cluster_policy.max_hold_s
    async with in_stage(s, Stage.HELD) as rec:
        s.held_for = f"{decision.reason} (number {decision.position} in line)"
        contain, why = await capacity.contained_while_held(s, decision)
        s.held_for += f"; {why}" if why and not contain else ""
        await notify(s, "held", "warning", render.held(s.first_report, s.held_for))
        if contain:  # the failure named, as every drain does: a later run's drain reads as another
            await drain(f"{why}: {s.drain_why()}")
            s.stage = Stage.HELD
        notice = await capacity.wait_for_grant(s, limit, decision.position)
        rec.outcome = notice.reason if notice is not None else f"not granted within {limit:g} s: {s.held_for}"
        s.held_for = ""
    return s.grant is not None and s.grant.granted  # a grant may still land while the stage closes


async def never_granted(s: IncidentState) -> tuple[Outcome, str]:
    """Not granted within the bound, or dismissed into its domain incident: how it closes."""
    await jobs.account_for_untouched(s)
    if s.grant is not None:  # dismissed: its domain incident handles the node
        s.node_at = render.escalated_state(s.ref.node, s.drain, s.grant.reason)
        return "escalated", s.grant.reason
    s.node_at = render.aborted_node_state(s.ref.node, s.drain)
    held = next(r for r in reversed(s.stages) if r.stage == Stage.HELD)  # a drain may have followed it
    return "not_granted", held.outcome


async def unanswered(s: IncidentState, gone: capacity.Unanswered) -> tuple[Outcome, str]:
    """The coordinator did not answer after its attempts: no grant (a confirmation unanswered is
    a grant that does not stand). The node stays as it is: untouched, or drained by this incident
    (the coordinator keeps counting it, as left, until it is back)."""
    await jobs.account_for_untouched(s)
    s.node_at = render.aborted_node_state(s.ref.node, s.drain)
    if s.node_at.state == NodeState.UNTOUCHED:  # the same failure on a node in service is news again
        first = s.first_report
        what = f"--xid {first.xid}" if first.xid is not None else f"--signal {first.signal}"
        gpu = f" --gpu {first.gpu}" if first.gpu is not None else ""
        todo = (
            "the node is untouched; once the coordinator answers (`gpuheal fleet`), report it again: "
            f"gpuheal report --cluster {s.ref.cluster} --node {s.ref.node} {what}{gpu}"
        )
    else:  # drained by this incident: counted out by the coordinator (as left) until it is back
        todo = f"{s.ref.node} is {s.node_at.detail} (the coordinator counts it as left until it is back)"
    return "not_granted", f"the cluster's coordinator did not answer {gone.asked} ({gone.cause}); {todo}"
