"""`gpuheal`: report failures, steer incidents, run the worker, the webhook and the demo."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from datetime import UTC, datetime

from pydantic import ValidationError
from temporalio.client import WorkflowUpdateFailedError

from gpuheal import policy
from gpuheal.config import Settings
from gpuheal.models import Decision, HealthReport
from gpuheal.timeline import render_result, render_timeline


def _incident_id(settings: Settings, target: str) -> str:
    return target if target.startswith("gpuheal-") else policy.workflow_id(settings.cluster, target)


async def _report(settings: Settings, args: argparse.Namespace) -> int:
    from triggers.start import connect, start_or_join

    report = HealthReport(
        node=args.node,
        cluster=args.cluster or settings.cluster,
        xid=args.xid,
        signal=args.signal,
        gpu=args.gpu,
        source="cli",
        observed_at=datetime.now(UTC),
        summary=args.summary,
    )
    handle = await start_or_join(await connect(settings), settings, report)
    print(f"{report.describe()} -> incident {handle.id}")
    print(f"  {settings.incident_url(handle.id)}")
    return 0


async def _decide(settings: Settings, args: argparse.Namespace) -> int:
    from triggers.start import connect
    from workflows.remediation import GpuRemediationWorkflow

    decision = Decision(operator=args.operator, reason=args.reason)
    handle = (await connect(settings)).get_workflow_handle_for(
        GpuRemediationWorkflow.run, _incident_id(settings, args.target)
    )
    update = GpuRemediationWorkflow.approve if args.command == "approve" else GpuRemediationWorkflow.abort
    try:
        print(await handle.execute_update(update, decision))
    except WorkflowUpdateFailedError as err:
        print(f"refused: {err.cause}", file=sys.stderr)
        return 1
    return 0


async def _status(settings: Settings, args: argparse.Namespace) -> int:
    from triggers.start import connect
    from workflows.remediation import GpuRemediationWorkflow

    incident = _incident_id(settings, args.target)
    handle = (await connect(settings)).get_workflow_handle_for(GpuRemediationWorkflow.run, incident)
    status = await handle.query(GpuRemediationWorkflow.status)
    print(f"incident {incident}: stage {status.stage.value}, action {status.action}")
    if status.awaiting_approval:
        print(f"  awaiting approval: gpuheal approve {args.target} --operator NAME --reason TEXT")
    if status.result is not None:
        print(render_timeline(status.stages, status.result.failure_observed_at))
        print(render_result(status.result, settings.incident_url(incident)))
    else:
        for line in status.done:
            print(f"  - {line}")
    return 0


def _worker(settings: Settings, args: argparse.Namespace) -> int:
    from workers.main import run_worker

    asyncio.run(run_worker(settings, args.metrics_port, args.sdk_metrics_port))
    return 0


def _webhook(settings: Settings, args: argparse.Namespace) -> int:
    from triggers.start import connect
    from triggers.webhook import serve

    async def main() -> None:
        runner = await serve(settings, args.host, args.port, await connect(settings))
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    return 0


def _agent(settings: Settings, args: argparse.Namespace) -> int:
    from triggers.agent_main import run_agent

    return run_agent(settings, args.node, args.metrics_port, args.kmsg, args.poll_s, args.report_to)


def _healthcheck(settings: Settings, args: argparse.Namespace) -> int:
    from triggers.healthcheck import run_healthcheck

    return run_healthcheck(settings, args.node, args.expect_gpus, args.report_to)


def _demo(settings: Settings, args: argparse.Namespace) -> int:
    from gpuheal.demo import run_demo

    return run_demo()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuheal", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("report", help="report a GPU failure: starts or joins the node's remediation")
    r.add_argument("--node", required=True)
    r.add_argument("--xid", type=int)
    r.add_argument("--signal", help="non-XID health signal, e.g. gpu_lost")
    r.add_argument("--gpu", type=int)
    r.add_argument("--cluster")
    r.add_argument("--summary", default="")

    for verb in ("approve", "abort"):
        d = sub.add_parser(verb, help=f"{verb} an incident that awaits approval")
        d.add_argument("target", help="node name or incident id (gpuheal-CLUSTER-NODE)")
        d.add_argument("--operator", required=True)
        d.add_argument("--reason", required=True)

    s = sub.add_parser("status", help="an incident's stage, timeline and result")
    s.add_argument("target", help="node name or incident id")

    w = sub.add_parser("worker", help="run the Temporal worker")
    w.add_argument("--metrics-port", type=int, default=9464)
    w.add_argument("--sdk-metrics-port", type=int, default=9465)

    h = sub.add_parser("webhook", help="serve the Alertmanager webhook")
    h.add_argument("--host", default="127.0.0.1")
    h.add_argument("--port", type=int, default=8088)

    a = sub.add_parser("agent", help="node health agent: NVML + kernel-log XIDs -> metrics, reports")
    a.add_argument("--node", required=True, help="this node's Slurm name")
    a.add_argument("--metrics-port", type=int, default=9410)
    a.add_argument("--kmsg", default="/dev/kmsg", help="kernel log to follow ('none' to disable)")
    a.add_argument("--poll-s", type=float, default=10.0, help="NVML health polling interval")
    a.add_argument("--report-to", help="gpuheal webhook URL for direct reports (token from env)")

    c = sub.add_parser("healthcheck", help="one-shot GPU check for Slurm's HealthCheckProgram")
    c.add_argument("--node", required=True)
    c.add_argument("--expect-gpus", type=int, default=0, help="GPUs this node must have")
    c.add_argument("--report-to", help="gpuheal webhook URL (token from GPUHEAL_WEBHOOK_TOKEN)")

    sub.add_parser("demo", help="the end-to-end demo on the local sandbox")
    return p


COMMANDS = {"report": _report, "approve": _decide, "abort": _decide, "status": _status}
SYNC_COMMANDS = {
    "worker": _worker,
    "webhook": _webhook,
    "demo": _demo,
    "agent": _agent,
    "healthcheck": _healthcheck,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = Settings.from_env()
        if args.command in SYNC_COMMANDS:
            rc = SYNC_COMMANDS[args.command](settings, args)
        else:
            rc = asyncio.run(COMMANDS[args.command](settings, args))
    except ValidationError as err:
        print(f"gpuheal: invalid input: {err}", file=sys.stderr)
        return 2
    except ValueError as err:
        print(f"gpuheal: {err}", file=sys.stderr)
        return 2
    # The SDK's native threads can abort interpreter finalisation ("PyGILState_Release", SIGABRT)
    # after any command that used a Temporal client, a gracefully stopped worker included; the
    # command's work is done and flushed by now, so skip finalisation and keep its exit code.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    sys.exit(main())
