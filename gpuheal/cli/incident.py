"""`gpuheal report | approve | abort | status | give-back`: the short commands that talk to incidents.

They load the Temporal client and the models, never a Kubernetes, Prometheus or HTTP client
(checked by the import contract "Light imports" in pyproject.toml).
"""

from __future__ import annotations

import argparse
import json
import shlex
from datetime import UTC, datetime, timedelta
from typing import get_args

from temporalio.client import WorkflowContinuedAsNewError, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.service import RPCError

from gpuheal.cli import errors
from gpuheal.cli.targets import incident_id
from gpuheal.clients.slurm.cli import SlurmCli
from gpuheal.clients.temporal import connect
from gpuheal.core import queries, render
from gpuheal.core import search_attributes as sa
from gpuheal.core.errors import quote
from gpuheal.core.messages import INCIDENT, INCIDENT_ABORT, INCIDENT_APPROVE, INCIDENT_GIVE_BACK, INCIDENT_STATUS
from gpuheal.core.models.base import Outcome, Stage, check_node_name
from gpuheal.core.models.incident import Decision
from gpuheal.core.models.report import HealthReport
from gpuheal.core.render import render_result, render_timeline
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import (
    PROBE_TIMEOUT_S,
    AlreadyHandled,
    NodeProbe,
    check_own_cluster,
    slurm_probe,
    start_unless_handled,
)

QUERY_TIMEOUT_S = 3.0


def _slurm_probe(settings: Settings) -> NodeProbe | None:
    """Slurm's commands, where this shell has them, say whether the node is back in service (a
    node resumed after an aborted incident takes its next failure as news). Not over slurmrestd:
    its client would load aiohttp into the short commands."""
    s = settings.slurm
    if s.backend != "cli":
        return None
    # The wrapper split here, not through gpuheal.clients.slurm.wrapper: that package names the
    # slurmrestd client, which the short commands must not load.
    wrapper = shlex.split(s.cli_wrapper) if s.cli_wrapper else None
    return slurm_probe(SlurmCli(s.conf, wrapper, timeout_s=PROBE_TIMEOUT_S))


async def report_failure(settings: Settings, args: argparse.Namespace) -> int:
    report = HealthReport(
        node=args.node,
        cluster=args.cluster or settings.require_cluster(),
        xid=args.xid,
        signal=args.signal,
        gpu=args.gpu,
        source="cli",
        observed_at=datetime.now(UTC),
        summary=args.summary,
    )
    check_own_cluster(settings, report.cluster)  # before anything is asked: this queue is this cluster's
    client = await connect(settings.temporal)
    handle = await start_unless_handled(client, settings, report, node_in_service=_slurm_probe(settings))
    if isinstance(handle, AlreadyHandled):
        print(f"{report.describe()}: already handled by {handle}; nothing started")
        return 0
    print(f"{report.describe()} -> incident {handle.id}")
    print(f"  {settings.incident_url(handle.id)}")
    return 0


async def decide(settings: Settings, args: argparse.Namespace) -> int:
    decision = Decision(operator=args.operator, reason=args.reason)
    handle = INCIDENT.handle(await connect(settings.temporal), incident_id(settings, args.target))
    update = INCIDENT_APPROVE if args.command == "approve" else INCIDENT_ABORT
    print(await update.execute(handle, decision))  # refused: cli.errors says why
    return 0


async def show_status(settings: Settings, args: argparse.Namespace) -> int:
    """A closed incident answers from its history (no worker needed); an open one from its
    `status` query, or, when no worker answers within QUERY_TIMEOUT_S, from Temporal's record."""
    incident = incident_id(settings, args.target)
    handle = INCIDENT.handle(await connect(settings.temporal), incident)
    described = await handle.describe()
    if described.status != WorkflowExecutionStatus.RUNNING:
        try:
            result = await handle.result()
        except WorkflowFailureError as err:
            state = described.status.name.lower() if described.status else "closed"
            print(f"incident {incident}: {state}: {err.cause}")
            return 0
        print(render_timeline(result.stages, result.failure_observed_at))
        print(render_result(result, settings.incident_url(incident)))
        return 0
    try:
        status = await INCIDENT_STATUS.ask(handle, rpc_timeout=timedelta(seconds=QUERY_TIMEOUT_S))
    except RPCError as err:
        attrs = described.typed_search_attributes
        print(
            f"incident {incident}: open since {described.start_time:%Y-%m-%d %H:%M:%S} UTC, "
            f"stage {attrs.get(sa.STAGE, '?')}, action {attrs.get(sa.ACTION, '?')} (Temporal's record)"
        )
        print(f"gpuheal: no worker answered within {QUERY_TIMEOUT_S:g} s ({err.message[:80]}): is it running?")
        return errors.NO_WORKER
    print(f"incident {incident}: stage {status.stage.value}, action {status.action}")
    if status.held:
        print(f"  held: {status.held}; an operator may: gpuheal override {args.target} --operator NAME --reason TEXT")
    if status.awaiting_approval:
        print(f"  awaiting approval: gpuheal approve {args.target} --operator NAME --reason TEXT")
    for line in status.done:
        print(f"  - {line}")
    return 0


def parse_since(text: str) -> timedelta:
    """`30m`, `24h`, `7d` (or seconds): how far back `gpuheal incidents` looks."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "s")
    try:
        return timedelta(seconds=float(number) * units[unit])
    except ValueError:
        raise ValueError(f"--since: {quote(text)} is not a duration such as 30m, 24h or 7d") from None


async def list_incidents(settings: Settings, args: argparse.Namespace) -> int:
    """Open and recent incidents from Temporal's visibility, newest first: node, stage, action,
    age, outcome, MTTR. Outcome and MTTR come from each closed incident's result."""
    cluster = settings.require_cluster()
    since = datetime.now(UTC) - parse_since(args.since)
    terms = [queries.of_type(INCIDENT), queries.eq(sa.CLUSTER, cluster), queries.after(queries.START_TIME, since)]
    if args.node:
        terms.append(queries.eq(sa.NODE, check_node_name(args.node)))
    if args.stage:
        terms.append(queries.eq(sa.STAGE, Stage(args.stage).value))
    if args.open:
        terms.append(queries.status("Running"))
    if args.outcome and args.outcome not in get_args(Outcome):
        raise ValueError(f"--outcome: {quote(args.outcome)} is not one of {', '.join(get_args(Outcome))}")
    client = await connect(settings.temporal)
    rows: list[dict[str, object]] = []
    async for wf in client.list_workflows(queries.where(*terms)):
        attrs = wf.typed_search_attributes
        outcome, mttr = "open", None
        if wf.status != WorkflowExecutionStatus.RUNNING:
            try:
                result = await INCIDENT.handle(client, wf.id, run_id=wf.run_id).result(follow_runs=False)
                outcome, mttr = result.outcome, result.mttr_s
            except WorkflowFailureError:
                outcome = "failed"
            except WorkflowContinuedAsNewError:  # its follow-up run, listed beside it, has the result
                outcome = "followed_up"
        if args.outcome and outcome != args.outcome:
            continue
        rows.append(
            {
                "incident_id": wf.id,
                "run_id": wf.run_id,
                "node": attrs.get(sa.NODE, "?"),
                "xid": attrs.get(sa.XID),
                "stage": attrs.get(sa.STAGE, "?"),
                "action": attrs.get(sa.ACTION, "-"),
                "started_at": wf.start_time.isoformat(),
                "closed_at": wf.close_time.isoformat() if wf.close_time else None,
                "outcome": outcome,
                "mttr_s": mttr,
                "url": settings.incident_url(wf.id),
            }
        )
        if len(rows) >= args.limit:
            break
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no incident in cluster {cluster} matches (started within {args.since})")
        return 0
    print(f"{'NODE':<12} {'STAGE':<18} {'ACTION':<13} {'AGE':>6} {'OUTCOME':<12} {'MTTR':>8}  INCIDENT")
    now = datetime.now(UTC)
    for r in rows:
        age = render.ago((now - datetime.fromisoformat(str(r["started_at"]))).total_seconds())
        mttr_s = r["mttr_s"]
        shown = f"{mttr_s:.1f} s" if isinstance(mttr_s, float) else "-"
        print(
            f"{r['node']!s:<12} {r['stage']!s:<18} {r['action']!s:<13} {age:>6} {r['outcome']!s:<12} {shown:>8}  "
            f"{r['incident_id']}"
        )
    return 0


async def give_back(settings: Settings, args: argparse.Namespace) -> int:
    """The incident that borrowed a node from inference gives it back now (its jobs move off)."""
    decision = Decision(operator=args.operator, reason=args.reason)
    handle = INCIDENT.handle(await connect(settings.temporal), incident_id(settings, args.target))
    print(await INCIDENT_GIVE_BACK.execute(handle, decision))  # refused: cli.errors says why
    return 0
