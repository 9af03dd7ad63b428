"""`gpuheal fleet | pause | resume | mode | override | domain | history`: the cluster as a whole.

Every command that steers (pause, resume, mode, override, domain; `return` too,
gpuheal.cli.returning) is an update on the
cluster's coordinator (or a domain incident), with the operator and the reason in its history;
the same updates work from the plain `temporal` CLI (docs/fleet-safety.md).
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from temporalio.client import Client, WorkflowContinuedAsNewError, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from gpuheal.cli.targets import incident_id
from gpuheal.clients.temporal import connect
from gpuheal.core import ids, queries
from gpuheal.core import search_attributes as sa
from gpuheal.core.fleet import view as fleet_view
from gpuheal.core.fleet.models import DomainDecision, OpenDomain, OpenDomains, OperatorAction, Override
from gpuheal.core.fleet.policy import ModeChange
from gpuheal.core.fleet.view import STATUS_MOST, FleetView
from gpuheal.core.messages import (
    DOMAIN_DECIDE,
    FLEET_DOMAINS,
    FLEET_OVERRIDE,
    FLEET_PAUSE,
    FLEET_RESUME,
    FLEET_SET_MODE,
    FLEET_STATUS,
    FLEET_VIEW,
    INCIDENT,
    Update,
)
from gpuheal.core.models.base import GPU_SERIAL_PATTERN, check_node_name
from gpuheal.core.settings import Settings

VIEW_TIMEOUT = timedelta(seconds=5)  # a describe: the server alone answers it
SERIAL = re.compile(GPU_SERIAL_PATTERN)
I = TypeVar("I")  # noqa: E741  (an update's input, as in core.messages)


async def _coordinator(settings: Settings) -> tuple[Client, str]:
    return await connect(settings.temporal), ids.coordinator_id(settings.require_cluster())


async def show_fleet(settings: Settings, args: argparse.Namespace) -> int:
    """The view the coordinator keeps in its memo (read from the server: it answers in a storm,
    when the busy coordinator refuses queries), or with --live its whole state by query."""
    client, fleet_id = await _coordinator(settings)
    handle = client.get_workflow_handle(fleet_id)
    try:
        described = await handle.describe(rpc_timeout=VIEW_TIMEOUT)
        v = None if args.live else await FLEET_VIEW.read_from(described)
        if v is None:  # asked for, or a coordinator of a release before the memo: its query
            v = fleet_view.view(await FLEET_STATUS.ask(handle), datetime.now(UTC), cut=None)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            print(f"no coordinator for cluster {settings.cluster!r} yet (it starts with the first incident)")
        else:
            print(f"the coordinator of cluster {settings.cluster!r} did not answer: {err}", file=sys.stderr)
        return 1
    if described.status != WorkflowExecutionStatus.RUNNING:
        closed = f" at {described.close_time:%Y-%m-%d %H:%M:%S} UTC" if described.close_time else ""
        status = described.status.name if described.status else "closed"
        print(f"THE COORDINATOR IS {status}{closed}: its last view, not now (the next incident starts a new one)")
    print("\n".join(render_view(v, datetime.now(UTC))))
    return 0


# What the breaker, the escalation and the repeat-offender rule count (coordination.admit).
COUNTED = (
    "hardware incidents only: application faults (XID 13, 31, 43 alone) restart their job "
    "and move no breaker, domain or repeat count"
)


def render_view(v: FleetView, now: datetime) -> list[str]:
    age = max(0.0, (now - v.at).total_seconds())
    as_of = f"its last change {v.at:%H:%M:%S} UTC, {age:.0f} s ago" if not v.whole else "live"
    lines = [f"cluster {v.cluster}: mode {v.mode}, policy version {v.policy_version} ({as_of})"]
    b = v.breaker
    at = f" at {b.at:%H:%M:%S}" if b.at else ""
    lines.append(f"breaker     {f'TRIPPED{at} ({b.why})' if b.tripped else 'closed'}")
    lines.append(f"counted     {COUNTED}")
    for u in v.budget:
        lines.append(f"budget      {u.name}: {u.used} of {u.limit} out of service, {max(0, u.limit - u.used)} left")
    if v.budgets_not_shown:
        lines.append(f"budget      ... {v.budgets_not_shown} more domain budgets, the fullest shown (--live lists all)")
    if v.containment is not None:
        c = v.containment
        tripped = " (none new: the breaker is tripped)" if b.tripped else ""
        lines.append(f"contained   {c.used} of {c.limit} held nodes drained as containment{tripped}")
    lines.append(f"rate        {v.remediations_in_window} remediations in the rate window (at that change)")
    for label, rows, count, tail in (
        ("out", v.out_nodes, v.out, ""),
        ("contained", v.containing_nodes, v.containing, " (held)"),
        ("left", v.left_nodes, v.left, " (its run closed; still drained; counted)"),
    ):
        for r in rows:
            lines.append(f"{label:<11} {r.node:<12} {r.incident_id}" + (f" (override {r.note})" if r.note else tail))
        if count > len(rows):
            lines.append(f"{label:<11} ... {count - len(rows)} more (--live lists up to {STATUS_MOST:,})")
    lines += [f"held {i:>3}    {h.node:<12} {h.incident_id}: {h.note}" for i, h in enumerate(v.held_nodes, 1)]
    if v.held > len(v.held_nodes):
        more = v.held - len(v.held_nodes)
        lines.append(f"held        ... {more} more, {v.held} in all (--live lists up to {STATUS_MOST:,})")
    lines += [f"domain      {d.node}: {d.note} -> {d.incident_id}" for d in v.domain_incidents]
    return lines


async def _update(settings: Settings, update: Update[I, str], arg: I, target: str | None = None) -> int:
    """The coordinator's answer (or the domain incident's, `target`), printed as it says it,
    after the cluster it came from: with several clusters on one Temporal, which one changed."""
    client, fleet_id = await _coordinator(settings)
    answer = await update.execute(client.get_workflow_handle(target or fleet_id), arg)
    print(f"cluster {settings.cluster}: {answer}")
    return 0


async def pause(settings: Settings, args: argparse.Namespace) -> int:
    return await _update(settings, FLEET_PAUSE, OperatorAction(operator=args.operator, reason=args.reason))


async def resume(settings: Settings, args: argparse.Namespace) -> int:
    return await _update(settings, FLEET_RESUME, OperatorAction(operator=args.operator, reason=args.reason))


async def set_mode(settings: Settings, args: argparse.Namespace) -> int:
    change = ModeChange(operator=args.operator, reason=args.reason, mode=args.mode)
    return await _update(settings, FLEET_SET_MODE, change)


async def override(settings: Settings, args: argparse.Namespace) -> int:
    incident = incident_id(settings, args.target)
    return await _update(
        settings, FLEET_OVERRIDE, Override(incident_id=incident, operator=args.operator, reason=args.reason)
    )


async def decide_domain(settings: Settings, args: argparse.Namespace) -> int:
    """Release or dismiss the node incidents a domain incident holds (the domain incident records it)."""
    client, fleet_id = await _coordinator(settings)
    handle = client.get_workflow_handle(fleet_id)
    # From the memo (answers in a storm); a coordinator of a release before it is asked.
    published = await FLEET_DOMAINS.read(handle, rpc_timeout=VIEW_TIMEOUT)
    if published is None:
        status = await FLEET_STATUS.ask(handle)
        published = OpenDomains(
            incidents=tuple(
                OpenDomain(domain=d.domain, incident_id=d.incident_id, nodes=len(d.nodes))
                for d in status.domain_incidents
                if not d.decided
            )
        )
    found = [d for d in published.incidents if d.domain == args.domain]
    if not found:
        open_ = [d.domain for d in published.incidents]
        print(f"no open domain incident for {args.domain!r} (open: {open_ or 'none'})", file=sys.stderr)
        return 1
    decision = DomainDecision(domain=args.domain, decision=args.decision, operator=args.operator, reason=args.reason)
    return await _update(settings, DOMAIN_DECIDE, decision, target=found[0].incident_id)


async def node_history(settings: Settings, args: argparse.Namespace) -> int:
    """Every incident of a node, or of a GPU board by its serial (across nodes, renames and
    re-images), from Temporal's visibility: when, which XID, what it did, how it ended."""
    cluster = settings.require_cluster()
    if (args.node is None) == (args.serial is None):
        raise SystemExit("gpuheal history: name a node or --serial SERIAL (one of them)")
    if args.serial is not None:  # validated before it reaches the query, as node names are
        if not SERIAL.fullmatch(args.serial):
            raise SystemExit(f"gpuheal history: invalid GPU serial {args.serial!r}")
        which, term = f"GPU serial {args.serial}", queries.contains(sa.GPU_SERIALS, args.serial)
    else:
        which, term = args.node, queries.eq(sa.NODE, check_node_name(args.node))
    client = await connect(settings.temporal)
    query = queries.where(queries.of_type(INCIDENT), queries.eq(sa.CLUSTER, cluster), term)
    rows = 0
    async for wf in client.list_workflows(query):
        xid = wf.typed_search_attributes.get(sa.XID)
        action = wf.typed_search_attributes.get(sa.ACTION, "-")
        closed = f"closed {wf.close_time:%Y-%m-%d %H:%M}" if wf.close_time else "running"
        outcome = ""
        if wf.close_time is not None:
            try:
                result = await client.get_workflow_handle(wf.id, run_id=wf.run_id).result(follow_runs=False)
                outcome = str(result.get("outcome", "")) if isinstance(result, dict) else ""
            except WorkflowContinuedAsNewError:  # its follow-up run, listed beside it, has the result
                outcome = "followed_up"
            except Exception as err:  # a failed run: say so
                outcome = f"failed: {err}"[:80]
        node = wf.typed_search_attributes.get(sa.NODE, "?")
        print(
            f"{wf.start_time:%Y-%m-%d %H:%M}  {node:<10} XID {xid or '-':<4} {action:<12} {closed:<24} "
            f"{outcome}  {wf.id}"
        )
        rows += 1
    if rows == 0:
        print(f"no incident on {which} in cluster {cluster}")
    return 0
