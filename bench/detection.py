"""Detection latency: from a GPU failure in the kernel log to its remediation workflow started.

    python bench/detection.py [--runs 5] [--production-runs 3]

Two paths, both through real processes on loopback:
- alert path: agent metric -> Prometheus scrape -> rule evaluation -> Alertmanager group_wait
  -> webhook -> Temporal; bounded by scrape + evaluation intervals + group_wait.
- direct path: the agent posts to the webhook itself.
The alert path runs with the sandbox's intervals (1 s) and with common production values
(scrape 15 s, evaluation 15 s, group_wait 30 s). Writes bench/results/detection.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime

from temporalio.client import Client
from temporalio.service import RPCError

from gpuheal.clients.temporal import connect
from gpuheal.core import ids
from gpuheal.core.settings import Settings
from infra.sandbox import REPO, RUN
from infra.sandbox.monitoring import Monitoring
from infra.sandbox.processes import BIN
from infra.sandbox.stack import Sandbox

LINE = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.\n"
AGENT_PORT = 24410


def start_agent(sb: Sandbox, node: str, kmsg: str, direct: bool) -> subprocess.Popen[bytes]:
    argv = [str(BIN / "gpuheal"), "agent", "--node", node, "--metrics-port", str(AGENT_PORT), "--kmsg", kmsg]
    if direct:
        argv += ["--report-to", sb.webhook_url]
    log = open(sb.root / "agent.log", "ab")
    proc = subprocess.Popen(argv, env=sb.env(), stdout=log, stderr=subprocess.STDOUT)
    time.sleep(1.5)
    return proc


async def measure(sb: Sandbox, client: Client, node: str, direct: bool, settle_s: float) -> float:
    kmsg = sb.root / f"kmsg-{node}"
    kmsg.write_text("")
    agent = start_agent(sb, node, str(kmsg), direct)
    try:
        await asyncio.sleep(settle_s)  # let Prometheus scrape the fresh agent at least once
        t0 = datetime.now(UTC)
        with kmsg.open("a") as f:
            f.write(LINE)
        handle = client.get_workflow_handle(ids.incident_id(sb.cluster, node))
        for _ in range(1200):
            try:
                desc = await handle.describe()
                await handle.terminate("benchmark")
                assert desc.start_time is not None
                return (desc.start_time - t0).total_seconds()
            except RPCError:
                await asyncio.sleep(0.05)
        raise TimeoutError(f"no workflow for {node}")
    finally:
        Sandbox.stop_process(agent)


async def series(sb: Sandbox, client: Client, label: str, runs: int, direct: bool, settle_s: float) -> list[float]:
    values = []
    for i in range(runs):
        v = await measure(sb, client, f"{label}{i:02d}", direct, settle_s)
        print(f"  {label} run {i + 1}/{runs}: {v:.2f} s", flush=True)
        values.append(v)
    return values


def row(name: str, bound: str, v: list[float]) -> str:
    return f"| {name} | {bound} | {len(v)} | {statistics.median(v):.2f} s | {min(v):.2f} s | {max(v):.2f} s |"


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--production-runs", type=int, default=3)
    args = ap.parse_args()
    sb = Sandbox.named("detect", RUN / "detect", cluster="detect")
    sb.stop_temporal()  # incidents left by an earlier run (maybe of older code) must not join this one
    sb.start_temporal(fresh=True)
    client = await connect(Settings.from_env(sb.env()).temporal)
    webhook = sb.start_webhook()
    rows = []
    try:
        direct = await series(sb, client, "direct", args.runs, True, 0.5)
        rows.append(row("agent -> webhook (direct)", "agent reaction + HTTP + Temporal start", direct))
        for name, interval, wait, runs in (
            ("sandbox", "1s", "1s", args.runs),
            ("production", "15s", "30s", args.production_runs),
        ):
            mon = Monitoring(
                sb.root / f"mon-{name}",
                sb.webhook_url,
                sb.root / "webhook.token",
                agents={"agent": AGENT_PORT},
                prometheus_port=24090,
                alertmanager_port=24093,
                interval=interval,
                group_wait=wait,
                group_interval=wait,
            )
            mon.start()
            try:
                v = await series(sb, client, f"am{name[:4]}", runs, False, float(interval.rstrip("s")) * 2)
            finally:
                mon.stop()
            rows.append(
                row(
                    f"Prometheus -> Alertmanager ({name}: scrape/eval {interval}, group_wait {wait})",
                    f"<= scrape {interval} + eval {interval} + group_wait {wait} + HTTP",
                    v,
                )
            )
    finally:
        Sandbox.stop_process(webhook)
        sb.stop_temporal()
    text = "\n".join(
        [
            f"# Detection latency ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)",
            "",
            "From the XID line appended to the kernel log the agent follows, to the remediation workflow's",
            "start time in Temporal. Loopback, real Prometheus 2.42 and Alertmanager 0.25 (Debian).",
            "",
            "| path | bounded by | runs | median | min | max |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    )
    print(text)
    (REPO / "bench" / "results" / "detection.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
