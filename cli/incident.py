"""`gpuheal report | approve | abort | status | give-back`: the short commands that talk to incidents.

They load the Temporal client and the models, never a Kubernetes, Prometheus or HTTP client
(checked by the import contract "Light imports" in pyproject.toml).
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from temporalio.client import WorkflowUpdateFailedError

from clients.temporal import connect
from gpuheal import policy
from gpuheal.models import Decision, HealthReport
from gpuheal.render import render_result, render_timeline
from gpuheal.settings import Settings
from triggers.start import already_handled, start_or_join
from workflows.remediation import GpuRemediationWorkflow


def incident_id(settings: Settings, target: str, cluster: str | None = None) -> str:
    if target.startswith("gpuheal-"):
        return target
    return policy.workflow_id(cluster or settings.require_cluster(), target)


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
    client = await connect(settings)
    by = await already_handled(client, report)
    if by is not None:
        print(f"{report.describe()}: already handled by {by}; nothing started")
        return 0
    handle = await start_or_join(client, settings, report)
    print(f"{report.describe()} -> incident {handle.id}")
    print(f"  {settings.incident_url(handle.id)}")
    return 0


async def decide(settings: Settings, args: argparse.Namespace) -> int:
    decision = Decision(operator=args.operator, reason=args.reason)
    handle = (await connect(settings)).get_workflow_handle_for(
        GpuRemediationWorkflow.run, incident_id(settings, args.target)
    )
    update = GpuRemediationWorkflow.approve if args.command == "approve" else GpuRemediationWorkflow.abort
    try:
        print(await handle.execute_update(update, decision))
    except WorkflowUpdateFailedError as err:
        print(f"refused: {err.cause}", file=sys.stderr)
        return 1
    return 0


async def show_status(settings: Settings, args: argparse.Namespace) -> int:
    incident = incident_id(settings, args.target)
    handle = (await connect(settings)).get_workflow_handle_for(GpuRemediationWorkflow.run, incident)
    status = await handle.query(GpuRemediationWorkflow.status)
    print(f"incident {incident}: stage {status.stage.value}, action {status.action}")
    if status.held:
        print(f"  held: {status.held}; an operator may: gpuheal override {args.target} --operator NAME --reason TEXT")
    if status.awaiting_approval:
        print(f"  awaiting approval: gpuheal approve {args.target} --operator NAME --reason TEXT")
    if status.result is not None:
        print(render_timeline(status.stages, status.result.failure_observed_at))
        print(render_result(status.result, settings.incident_url(incident)))
    else:
        for line in status.done:
            print(f"  - {line}")
    return 0


async def give_back(settings: Settings, args: argparse.Namespace) -> int:
    """The incident that borrowed a node from inference gives it back now (its jobs move off)."""
    decision = Decision(operator=args.operator, reason=args.reason)
    handle = (await connect(settings)).get_workflow_handle_for(
        GpuRemediationWorkflow.run, incident_id(settings, args.target)
    )
    try:
        print(await handle.execute_update(GpuRemediationWorkflow.give_back, decision))
    except WorkflowUpdateFailedError as err:
        print(f"refused: {err.cause}", file=sys.stderr)
        return 1
    return 0
