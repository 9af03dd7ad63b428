"""A storm through Alertmanager: N nodes' alerts at once, grouped by node as gpuheal's route does
(N POSTs as fast as Alertmanager sends them), to the webhook process, to Temporal.

    python -m bench.webhook_storm [--nodes 1000] [--runs 2] [--limits RATE/BURST] [--baseline-src DIR]

Real processes on loopback: Temporal's dev server, `gpuheal webhook` with its default limits,
Debian's Alertmanager 0.25 with the route and receiver of infra/monitoring (group_wait 1 s,
group_interval 5 m as in production: a notification Alertmanager gives up on waits that long).
No worker runs: what is measured is how fast a report becomes a started incident. Each run is a
storm of its own: its own node names, its own webhook process (a full token bucket), posted after
the previous run's incidents are all seen, with Alertmanager's notification log fresh.
`--limits` adds a run with the webhook's rate limit set so (what the pipeline does when the
limit is not what bounds it); `--baseline-src` also runs the webhook from another checkout (e.g.
a worktree of the commit before), the row named after its commit. Writes bench/results/webhook-storm.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from temporalio.client import Client

from bench.common import check, distinct, goal, pct
from gpuheal.clients.temporal import connect
from gpuheal.core import ids, queries
from gpuheal.core import search_attributes as sa
from gpuheal.core.messages import INCIDENT
from gpuheal.core.settings import Settings
from infra.sandbox import REPO, RUN
from infra.sandbox.monitoring import Monitoring
from infra.sandbox.stack import PORTS, Sandbox

GROUP_WAIT_S = 1.0
ALL_STARTED_GOAL_S = 30.0  # issue 36: every incident started within 30 s
P99_GOAL_S = 1.0 + GROUP_WAIT_S  # issue 36: report -> started p99 < 1 s, plus Alertmanager's group_wait
TAG = f"s{secrets.token_hex(2)}"  # this invocation's node names
GIVE_UP_S = 180.0  # a run whose incidents are not all started by then is reported as it stands


@dataclass
class Run:
    label: str
    run: int
    nodes: int
    started: list[float]  # seconds from the alerts posted to Alertmanager to each incident's start
    failed: float  # Alertmanager's failed webhook requests (503s it retried, 429s it dropped, errors)
    sent: float  # Alertmanager's webhook requests in all


def git_label(src: Path | None) -> str:
    """The commit the webhook ran, `+changes` where its tracked files differ from it."""
    where = str(src or REPO)
    sha = subprocess.run(["git", "-C", where, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", where, "status", "--porcelain", "-uno"], capture_output=True, text=True)
    return f"{'before: ' if src else ''}git {sha.stdout.strip() or '?'}{'+changes' if dirty.stdout.strip() else ''}"


async def started_times(client: Client, cluster: str, prefix: str, want: int, t0: datetime) -> list[float]:
    """Seconds from t0 to each of this run's incidents' start, once all are seen (or GIVE_UP_S)."""
    query = queries.where(queries.of_type(INCIDENT), queries.eq(sa.CLUSTER, cluster))
    deadline = time.monotonic() + GIVE_UP_S
    while True:
        found = {}
        async for wf in client.list_workflows(query):
            if wf.id.startswith(f"{ids.incident_prefix(cluster)}{prefix}"):
                found[wf.id] = wf.start_time
        if len(found) >= want or time.monotonic() > deadline:
            break
        await asyncio.sleep(1)
    distinct("incident", found)  # (a dict: ids are distinct; the check keeps the claim written)
    times = [(start - t0).total_seconds() for start in found.values()]
    check(all(t >= 0 for t in times), f"{prefix}: an incident started before its alerts were sent")
    return times


async def one_run(sb: Sandbox, client: Client, label: str, run: int, nodes: int) -> Run:
    prefix = f"{TAG}r{run}n"  # never an earlier invocation's nodes (Alertmanager's log would dedupe them)
    shutil.rmtree(sb.root / f"am-{run}", ignore_errors=True)  # nor its notification log
    am = Monitoring(
        sb.root / f"am-{run}",
        sb.webhook_url,
        sb.root / "webhook.token",
        agents={},
        alertmanager_port=PORTS["bench"].webhook + 7,
        group_wait=f"{GROUP_WAIT_S:.0f}s",
        group_interval="5m",
    )
    am.start(prometheus=False)
    try:
        labels = {"alertname": "GpuXidError", "gpuheal": "true", "cluster": sb.cluster, "xid": "79", "gpu": "0"}
        t0 = datetime.now(UTC)
        am.fire(*({**labels, "node": f"{prefix}{i:04d}"} for i in range(nodes)))
        times = await started_times(client, sb.cluster, prefix, nodes, t0)
        await asyncio.sleep(2)  # Alertmanager's counters settle (a late retry)
        failed = am.metric("alertmanager_notification_requests_failed_total")
        sent = am.metric("alertmanager_notification_requests_total")
    finally:
        am.stop()
    print(f"  {label} run {run}: {len(times)}/{nodes} started, last at {max(times, default=0):.1f} s", flush=True)
    return Run(label, run, nodes, times, failed, sent)


def rows(runs: list[Run]) -> list[str]:
    out = []
    for r in runs:
        t = r.started
        last = f"{max(t):.1f} s" if len(t) == r.nodes else f"**{len(t)} of {r.nodes} by {GIVE_UP_S:.0f} s**"
        p50, p99 = (f"{pct(t, q):.2f} s" for q in (0.5, 0.99))
        out.append(f"| {r.label} | {r.run} | {len(t)} | {last} | {p50} | {p99} | {r.sent:.0f} | {r.failed:.0f} |")
    return out


async def storm(src: Path | None, nodes: int, runs: int, first_run: int, limits: str = "") -> list[Run]:
    """`runs` storms against a fresh server; `limits` RATE/BURST for the webhook ("": its defaults)."""
    sb = Sandbox.named("bench", RUN / "webhook-storm", cluster="amstorm")
    if src is not None:
        sb.extra_env["PYTHONPATH"] = str(src)  # the webhook process runs that checkout's gpuheal
    if limits:
        rate, burst = limits.split("/")
        sb.extra_env.update({"GPUHEAL_WEBHOOK_RATE": rate, "GPUHEAL_WEBHOOK_BURST": burst})
    sb.stop_temporal()
    sb.start_temporal(fresh=True)
    label = git_label(src) + (f", limits {limits}" if limits else "")
    results = []
    try:
        client = await connect(Settings.from_env(sb.env()).temporal)
        for i in range(runs):
            webhook = sb.start_webhook()  # each run's own: a full token bucket, nothing in flight
            try:
                results.append(await one_run(sb, client, label, first_run + i, nodes))
            finally:
                Sandbox.stop_process(webhook)
    finally:
        sb.stop_temporal()
    return results


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--baseline-src", type=Path, help="a checkout whose webhook is measured too (the before)")
    ap.add_argument("--limits", default="", help="also one run with the webhook at RATE/BURST, e.g. 1000/1000")
    args = ap.parse_args()
    load = os.getloadavg()[0]  # said beside the figures: a loaded machine is slower
    results = await storm(None, args.nodes, args.runs, 1)
    if args.limits:
        results += await storm(None, args.nodes, 1, len(results) + 1, args.limits)
    if args.baseline_src:
        results += await storm(args.baseline_src.resolve(), args.nodes, 1, len(results) + 1)
    ours = [r for r in results if not r.label.startswith("before")]
    goals = [
        goal(
            f"{r.label} run {r.run}: every incident started",
            len(r.started) == r.nodes and max(r.started) < ALL_STARTED_GOAL_S,
            f"{len(r.started)} of {r.nodes}, last at {max(r.started, default=0):.1f} s",
            f"< {ALL_STARTED_GOAL_S:.0f} s",
        )
        for r in ours
    ] + [
        goal(
            f"{r.label} run {r.run}: alert -> started p99",
            pct(r.started, 0.99) < P99_GOAL_S,
            f"{pct(r.started, 0.99):.2f} s",
            f"< {P99_GOAL_S:.0f} s (1 s, plus group_wait {GROUP_WAIT_S:.0f} s)",
        )
        for r in ours
    ]
    text = "\n".join(
        [
            f"# A storm through Alertmanager ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)",
            "",
            f"{args.nodes} nodes' alerts posted to Debian's Alertmanager 0.25 at once; grouped by node (gpuheal's",
            "route): one POST each to one `gpuheal webhook` process with its default limits; Temporal's dev",
            f"server; no worker. Times from the alerts posted to Alertmanager (its group_wait {GROUP_WAIT_S:.0f} s "
            "included)",
            "to each incident's start in Temporal. `POSTs` and `failed`: Alertmanager's own counts of its webhook",
            "requests (a 503 it retries; a 429 it does not, that group waits for group_interval, 5 m here).",
            "Each run has a webhook process of its own (a full token bucket).",
            f"Load average when it began: {load:.1f} on {os.cpu_count()} cores.",
            "",
            "| webhook | run | started | all started by | p50 | p99 | POSTs | failed |",
            "|---|---|---|---|---|---|---|---|",
            *rows(results),
            "",
            "Goals (issue 36):",
            "",
            *goals,
            "",
            "## Each run (seconds to each start, sorted; every 50th)",
            "",
            *(f"- {r.label} run {r.run}: " + " ".join(f"{t:.1f}" for t in sorted(r.started)[::50]) for r in results),
            "",
        ]
    )
    print(text)
    (REPO / "bench" / "results" / "webhook-storm.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
