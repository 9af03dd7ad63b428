"""Slurm at scale: what the Slurm-facing activities cost with 10,000 jobs in the queue.

    python -m bench.slurm [--jobs 10000] [--runs 20]

For each Slurm release and backend (CLI on 22.05, 24.11 and 26.05; slurmrestd on 24.11 and 26.05)
a fresh sandbox gets --jobs held jobs plus a few running ones (two of them on two nodes each);
then `list_jobs_on_node`, `look_up_slurm_node` and `drain_slurm_node` run --runs times each
(a drain is undone between runs, untimed), timed, with the calls each made to Slurm. The same
three questions are asked of the Slurm client as it was before the backends (git 4024990,
22.05 only: it read no other schema) side by side. Writes bench/results/slurm.md: the aggregates,
every run's time, and the listing goal (< 100 ms) beside each backend's figure. Figures, not
assertions, but checked: each listing finds gpu02's two jobs, the queue holds the jobs claimed, a
drain drains.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import check, pct
from gpuheal.activities.remediation import RemediationActivities
from gpuheal.clients.notify import LogNotifier
from gpuheal.clients.slurm import build_slurm
from gpuheal.clients.slurm.rest import SlurmRest
from gpuheal.core.models.slurm import DrainRequest, NodeRef
from gpuheal.core.settings import Settings
from infra.sandbox import REPO, RUN
from infra.sandbox.stack import Sandbox

RESULTS = REPO / "bench" / "results" / "slurm.md"
BEFORE = "4024990"  # the last commit with the single 22.05 client (activities/slurm.py)
MATRIX = [("cli", "22.05"), ("cli", "24.11"), ("cli", "26.05"), ("rest", "24.11"), ("rest", "26.05")]
Figures = dict[str, tuple[list[float], float]]  # activity -> (each run's seconds, calls per run)
GOAL_LIST_S = 0.1  # issue 17: a node's jobs listed within 100 ms with 10,000 jobs queued
STATE_LISTING = "(floor) GET /jobs/state/ alone"


def fill_queue(sb: Sandbox, jobs: int) -> None:
    """Running jobs (two spanning two nodes) on gpu01-03, then `jobs` held ones, 8 sbatch at once."""
    for argv in (["-N2", "-w", "gpu[01-02]"], ["-N2", "-w", "gpu[02-03]"], ["-w", "gpu01"], ["-w", "gpu03"]):
        sb.slurm("sbatch", "--parsable", "-o", "/dev/null", *argv, "--wrap=sleep 3600")

    def held(_: int) -> None:
        sb.slurm("sbatch", "--parsable", "-H", "-o", "/dev/null", "--wrap=sleep 1")

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for i, _ in enumerate(pool.map(held, range(jobs)), 1):
            if i % 1000 == 0:
                print(f"\r    queue: {i}/{jobs} held jobs ({time.monotonic() - started:.0f} s)", end="", flush=True)
    print()


async def timed(runs: int, fn: Callable[[], Awaitable[Any]], counter: Callable[[], int]) -> tuple[list[float], float]:
    times, calls = [], []
    for _ in range(runs):
        before = counter()
        t0 = time.perf_counter()
        await fn()
        times.append(time.perf_counter() - t0)
        calls.append(counter() - before)
    return times, statistics.mean(calls)


async def measure_after(sb: Sandbox, runs: int) -> Figures:
    settings = Settings.from_env(sb.env())
    slurm = build_slurm(settings.slurm)
    acts = RemediationActivities(slurm, provider=None, notifier=LogNotifier(), on_closed=lambda r: None)  # type: ignore[arg-type]
    ref = NodeRef(cluster="bench", node="gpu02", incident_id="gpuheal-bench-gpu02")
    drain = DrainRequest(node=ref, reason="gpuheal-bench-gpu02: benchmark")

    async def listed() -> None:  # gpu02 runs exactly the two jobs that span it, whatever the queue holds
        found = await acts.list_jobs_on_node(ref)
        check(len(found.jobs) == 2, f"{sb.slurm_backend}-{sb.slurm_version}: gpu02 lists {len(found.jobs)} jobs, not 2")

    async def looked_up() -> None:
        check((await acts.look_up_slurm_node(ref)).name == "gpu02", "look_up_slurm_node answered another node")

    out = {
        "list_jobs_on_node": await timed(runs, listed, lambda: slurm.calls),
        "look_up_slurm_node": await timed(runs, looked_up, lambda: slurm.calls),
    }
    if isinstance(slurm, SlurmRest):
        out[STATE_LISTING] = await timed(runs, lambda: state_listing(slurm), lambda: slurm.calls)
    times, calls = [], []
    for _ in range(runs):
        if (await slurm.node("gpu02")).drained:  # undo the last drain, untimed
            await slurm.update_node("gpu02", "resume")
        before = slurm.calls
        t0 = time.perf_counter()
        await acts.drain_slurm_node(drain)
        times.append(time.perf_counter() - t0)
        calls.append(slurm.calls - before)
        check((await slurm.node("gpu02")).drained, "drain_slurm_node left gpu02 undrained")
    out["drain_slurm_node"] = (times, statistics.mean(calls))
    await slurm.update_node("gpu02", "resume")
    return out


async def state_listing(slurm: SlurmRest) -> None:
    """The one request a REST listing cannot do without (the API has no node filter), alone: the
    floor under list_jobs_on_node on that backend."""
    status, data = await slurm._request("GET", f"{await slurm._api_path()}/jobs/state/")
    check(status == 200 and len(data.get("jobs", [])) > 0, f"GET /jobs/state/ answered {status}")


def queued(sb: Sandbox) -> int:
    """Jobs the controller holds now: the figures are for a queue this long."""
    return len(sb.slurm("squeue", "-h", "-o", "%i").split())


def old_client(sb: Sandbox) -> Any:
    """The Slurm client as it was before (one class, 22.05's JSON), loaded from git."""
    source = subprocess.run(
        ["git", "show", f"{BEFORE}:activities/slurm.py"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "slurm_before.py"
    # Its modules have moved since (gpuheal.X -> gpuheal.core.X, the models split by subject);
    # nothing else of it changes.
    path.write_text(
        source.replace(
            "from gpuheal.models import NODE_NAME_PATTERN, JobSnapshot, NodeInfo",
            "from gpuheal.core.models.base import NODE_NAME_PATTERN\n"
            "from gpuheal.core.models.slurm import JobSnapshot, NodeInfo",
        ).replace("from gpuheal.progress import", "from gpuheal.core.progress import")
    )
    spec = importlib.util.spec_from_file_location("slurm_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    client = module.SlurmClient(str(sb.slurm_conf))
    client.calls = 0
    run = client.run

    async def counted(*argv: str, check: bool = True) -> Any:
        client.calls += 1
        return await run(*argv, check=check)

    client.run = counted
    return client


async def measure_before(sb: Sandbox, runs: int) -> Figures:
    old = old_client(sb)

    async def drain() -> None:  # the old drain_slurm_node: read the node, then drain it
        node = await old.node("gpu02")
        if not node.drained:
            await old.update_node("gpu02", state="drain", reason="gpuheal-bench-gpu02: benchmark")

    out = {
        "list_jobs_on_node": await timed(runs, lambda: old.jobs_on_node("gpu02"), lambda: old.calls),
        "look_up_slurm_node": await timed(runs, lambda: old.node("gpu02"), lambda: old.calls),
    }
    times, calls = [], []
    for _ in range(runs):
        if (await old.node("gpu02")).drained:
            await old.update_node("gpu02", state="resume")
        before = old.calls
        t0 = time.perf_counter()
        await drain()
        times.append(time.perf_counter() - t0)
        calls.append(old.calls - before)
    out["drain_slurm_node"] = (times, statistics.mean(calls))
    await old.update_node("gpu02", state="resume")
    return out


def rows(label: str, figures: Figures) -> list[str]:
    return [
        f"| {label} | {name} | {statistics.median(t) * 1000:.0f} ms | {pct(t, 0.99) * 1000:.0f} ms | "
        f"{min(t) * 1000:.0f} ms | {max(t) * 1000:.0f} ms | {calls:g} |"
        for name, (t, calls) in figures.items()
    ]


def each_run(label: str, figures: Figures) -> list[str]:
    """Every run's time, in the order they ran: the aggregates above are of these."""
    return [f"| {label} | {name} | {' '.join(f'{x * 1000:.0f}' for x in t)} |" for name, (t, _) in figures.items()]


def goal(label: str, figures: Figures) -> str:
    t = figures["list_jobs_on_node"][0]
    p50, p99 = statistics.median(t), pct(t, 0.99)
    verdict = "met" if p99 < GOAL_LIST_S else "met at p50 only" if p50 < GOAL_LIST_S else "**MISSED**"
    line = (
        f"- {label}: list_jobs_on_node p50 {p50 * 1000:.0f} ms / p99 {p99 * 1000:.0f} ms against "
        f"< {GOAL_LIST_S * 1000:.0f} ms: {verdict}"
    )
    if STATE_LISTING in figures:  # what no client of this API can go under
        floor = statistics.median(figures[STATE_LISTING][0])
        line += f" (the state listing alone, which it needs: p50 {floor * 1000:.0f} ms)"
    return line


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    sb = Sandbox.named("bench", RUN / "bench-slurm", extra_env={"GPUHEAL_SLURM_MAX_JOBS": str(args.jobs + 1000)})
    table: list[str] = []
    runs: list[str] = []
    goals: list[str] = []
    versions: dict[str, str] = {}
    filled: set[str] = set()
    try:
        for backend, version in MATRIX:
            sb.use_slurm(version, backend)
            if version not in filled:  # one cluster per release serves both backends
                print(f"  Slurm {version}: sandbox with {args.jobs} jobs", flush=True)
                sb.start_slurm(clean=True)
                fill_queue(sb, args.jobs)
                filled.add(version)
            elif backend == "rest":
                sb.start_slurm(clean=False)  # starts slurmrestd and writes a token
            versions[version] = sb.slurm("sinfo", "--version").split()[-1]
            held = queued(sb)
            check(held >= args.jobs + 4, f"Slurm {version} holds {held} jobs, not the {args.jobs} + 4 claimed")
            print(f"  {backend}-{version}: timing", flush=True)
            label = f"{backend}-{versions[version]}"
            after = await measure_after(sb, args.runs)
            table += rows(label, after)
            runs += each_run(label, after)
            goals.append(goal(label, after))
            if (backend, version) == ("cli", "22.05"):
                label = f"before: cli-{versions[version]} (git {BEFORE})"
                before = await measure_before(sb, args.runs)
                table += rows(label, before)
                runs += each_run(label, before)
    finally:
        for version in filled:
            sb.use_slurm(version)
            sb.stop_slurm()
    text = "\n".join(
        [
            f"# Slurm at scale ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)",
            "",
            f"{args.jobs} held jobs plus 4 running (2 on two nodes) per release; {args.runs} runs per activity; "
            "the activities' own code, against the real daemons on loopback (Slurm commands under chroot for the "
            "newer releases; slurmrestd with a JWT). `calls` = commands run or HTTP requests made, per activity.",
            "",
            "| backend-release | activity | p50 | p99 | min | max | calls |",
            "|---|---|---|---|---|---|---|",
            *table,
            "",
            "Goals (issue 17 set it for slurmrestd; every backend is held to it):",
            "",
            *goals,
            "",
            "## Each run (ms, in the order they ran)",
            "",
            "| backend-release | activity | runs |",
            "|---|---|---|",
            *runs,
            "",
        ]
    )
    print(text)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
