"""`gpuheal worker | webhook | agent | healthcheck`: the long-running processes.

Each loads what it serves (the worker: Slurm, Kubernetes and Prometheus clients; the webhook:
aiohttp; the agent: NVML and Prometheus), which is why they live apart from the short commands.
"""

from __future__ import annotations

import argparse
import asyncio

from gpuheal.clients.temporal import connect
from gpuheal.core.settings import Settings
from gpuheal.triggers.agent_main import run_agent
from gpuheal.triggers.healthcheck import run_healthcheck
from gpuheal.triggers.webhook import serve
from gpuheal.workers.main import run_worker


def worker(settings: Settings, args: argparse.Namespace) -> int:
    asyncio.run(run_worker(settings, args.metrics_port, args.sdk_metrics_port))
    return 0


def webhook(settings: Settings, args: argparse.Namespace) -> int:
    settings.require_cluster()

    async def main() -> None:
        runner = await serve(settings, args.host, args.port, await connect(settings.temporal))
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    return 0


def agent(settings: Settings, args: argparse.Namespace) -> int:
    return run_agent(settings, args.node, args.metrics_port, args.kmsg, args.poll_s, args.report_to)


def healthcheck(settings: Settings, args: argparse.Namespace) -> int:
    return run_healthcheck(settings, args.node, args.expect_gpus, args.report_to)
