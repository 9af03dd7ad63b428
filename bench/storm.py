"""A failure storm against the cluster's coordinator: what admitting 1,000 incidents at once costs.

    python -m bench.storm [--reports 1000] [--budget 5%] [--in-flight 50] [--quiet 20] [--temporal cluster]

A Slurm sandbox with --reports nodes (fleet0001.. are defined in slurm.conf without a slurmd: a
fleet's size, not its daemons), a fresh Temporal dev server and the worker as its own process.
Each report goes the way `gpuheal report` sends it (already handled? then start or join), at
most --in-flight at once. Measured: report -> workflow started (the trigger's round trip), the
coordinator's grant latency (each incident's `request_capacity` activity, scheduled -> completed,
read from its history), time until every incident is granted or held, the worker's and the
Temporal server's peak RSS (VmHWM), and the coordinator's history (events, bytes, runs).

The baseline, side by side: the same sandbox, fresh, with --quiet reports sent one at a time,
each waiting for its decision: the same measures with no storm around them.

The breaker and the rate are opened wide (a storm this size would trip the breaker at once by
default, which is the point of the breaker but not of this benchmark). XID 79 (replace): granted
incidents drain their node and wait for a spare, so grants stay put while the storm is admitted.
With --temporal cluster, the Temporal cluster (temporal-server on PostgreSQL, mTLS) instead of the
dev server; its figures ("Temporal" = the server and PostgreSQL together) size docs/production.md
(sizing per 1,000 nodes). Writes bench/results/storm.md (storm-cluster.md). Figures, not assertions, but
self-checked: every report started its own incident run in the run's fresh server, and every
incident has its own grant latency.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from bench.common import check, cpu_s, distinct, pct, peak_rss_mb
from gpuheal.activities import interface as act
from gpuheal.clients.temporal import connect
from gpuheal.core import ids, queries
from gpuheal.core import search_attributes as sa
from gpuheal.core.fleet.view import FleetView
from gpuheal.core.messages import (
    FLEET_ADMIT,
    FLEET_ADMIT_MANY,
    FLEET_REQUEST_CAPACITY,
    FLEET_REQUEST_CAPACITY_MANY,
    FLEET_VIEW,
    INCIDENT,
)
from gpuheal.core.models.report import HealthReport
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import already_handled, start_or_join
from infra.sandbox import REPO, RUN
from infra.sandbox.stack import Sandbox
from infra.sandbox.temporal import KINDS

RESULTS = REPO / "bench" / "results" / "storm.md"
SPARES = 3
VIEW_TIMEOUT = timedelta(seconds=5)
GPUHEAL = str(Path(sys.executable).parent / "gpuheal")
AFTER_S = 60  # samples (1 s apart) the drained count must hold still before the watch ends
AFTER_MAX_S = 900  # ... at most this long after every incident is decided


@dataclass
class Run:
    name: str
    reports: int
    starts_ms: list[float] = field(default_factory=list)
    grants_ms: list[float] = field(default_factory=list)
    send_s: float = 0.0
    all_decided_s: float = 0.0
    granted: int = 0
    held: int = 0
    worker_mb: float = 0.0
    temporal_mb: float = 0.0
    history_events: int = 0
    history_kb: float = 0.0
    coordinator_runs: int = 0
    workers: int = 1
    skipped: int = 0  # reports answered "already handled": the run would not be what it claims
    worker_cpu_s: float = 0.0  # all worker processes, with the Slurm commands they ran
    temporal_cpu_s: float = 0.0
    coordinator_tasks: int = 0  # the coordinator's workflow tasks over all its runs
    updates: dict[str, int] = field(default_factory=dict)  # updates the coordinator accepted, by name
    watch: Watch | None = None


def node_names(n: int) -> list[str]:
    """Every node of the sandbox that can fail: gpu01-03 (with a slurmd) and fleet0001.."""
    return ["gpu01", "gpu02", "gpu03"] + [f"fleet{i:04d}" for i in range(1, n - 2)]


async def fleet(client: Client, cluster: str) -> FleetView | None:
    """What `gpuheal fleet` reads: the coordinator's view in its memo (the server answers it)."""
    try:
        return await FLEET_VIEW.read(client.get_workflow_handle(ids.coordinator_id(cluster)), rpc_timeout=VIEW_TIMEOUT)
    except Exception:
        return None


async def decided(client: Client, cluster: str) -> tuple[int, FleetView | None]:
    """Incidents past admission: granted (out of service now, or closed since) or held."""
    s = await fleet(client, cluster)
    if s is None:
        return 0, None
    closed = await client.count_workflows(
        queries.where(queries.of_type(INCIDENT), queries.eq(sa.CLUSTER, cluster), queries.not_status("Running"))
    )
    return s.out + s.held + closed.count, s


class Watch:
    """Throughout a run: how long `gpuheal fleet`'s read takes (every second, in process, and the
    command itself every 15 s), and how many of the reported nodes Slurm shows drained (every
    second), beside the bound the coordinator computes (cluster budget + containment bound)."""

    def __init__(self, sb: Sandbox, client: Client, cluster: str, nodes: list[str]) -> None:
        self.sb, self.client, self.cluster, self.nodes = sb, client, cluster, set(nodes)
        self.handle = client.get_workflow_handle(ids.coordinator_id(cluster))
        self.read_ms: list[float] = []
        self.command_ms: list[float] = []
        self.unanswered: list[str] = []  # reads that failed or timed out once a coordinator existed
        self.command_failed: list[str] = []  # `gpuheal fleet` that exited non-zero
        self.drained: list[int] = []
        self.bound = 0
        self.on = True

    def slurm(self) -> None:  # a thread: sinfo blocks
        while self.on:
            states = self.sb.nodes()
            self.drained.append(sum(1 for n, i in states.items() if n in self.nodes and i.drained))
            time.sleep(1)

    async def reads(self) -> None:
        seen = False
        last_command = 0.0
        while self.on:
            t0 = time.perf_counter()
            try:
                v = await FLEET_VIEW.read(self.handle, rpc_timeout=VIEW_TIMEOUT)
            except Exception as err:  # no coordinator yet, or the read failed
                v = None
                if seen:
                    self.unanswered.append(f"{time.perf_counter() - t0:.1f} s: {err}"[:200])
            if v is not None:
                seen = True
                self.read_ms.append((time.perf_counter() - t0) * 1000)
                if v.containment is not None:
                    self.bound = max(self.bound, v.budget[0].limit + v.containment.limit)
            if seen and time.monotonic() - last_command >= 15:
                last_command = time.monotonic()
                t0 = time.perf_counter()
                done = await asyncio.to_thread(
                    subprocess.run, [GPUHEAL, "fleet"], env=self.sb.env(), capture_output=True, timeout=60
                )
                if done.returncode == 0:
                    self.command_ms.append((time.perf_counter() - t0) * 1000)
                else:
                    self.command_failed.append(done.stdout.decode()[-200:] + done.stderr.decode()[-200:])
            await asyncio.sleep(1)


async def until_decided(client: Client, cluster: str, count: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        if (await decided(client, cluster))[0] >= count:
            return
        await asyncio.sleep(0.01)
    raise TimeoutError(f"fewer than {count} incidents granted or held in time")


async def send(client: Client, settings: Settings, node: str, run: Run) -> None:
    report = HealthReport(
        node=node,
        cluster=settings.require_cluster(),
        xid=79,
        gpu=0,
        source="bench",
        observed_at=datetime.now(UTC),
    )
    t0 = time.perf_counter()
    if await already_handled(client, settings, report) is None:
        await start_or_join(client, settings, report)
    else:
        run.skipped += 1
    run.starts_ms.append((time.perf_counter() - t0) * 1000)


async def grant_latency_ms(client: Client, workflow_id: str) -> float | None:
    """The incident's first request_capacity activity: scheduled -> completed."""
    scheduled: dict[int, datetime] = {}
    async for e in client.get_workflow_handle(workflow_id).fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if e.activity_task_scheduled_event_attributes.activity_type.name == act.REQUEST_CAPACITY.name:
                scheduled[e.event_id] = e.event_time.ToDatetime()
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            at = scheduled.get(e.activity_task_completed_event_attributes.scheduled_event_id)
            if at is not None:
                return (e.event_time.ToDatetime() - at).total_seconds() * 1000
    return None


async def one_run(sb: Sandbox, name: str, nodes: list[str], in_flight: int, one_by_one: bool, workers: int = 1) -> Run:
    print(f"{name}: {len(nodes)} reports, {workers} worker(s)", flush=True)
    # Temporal takes 10 updates in flight per workflow: the workers share 8
    # (docs/configuration.md: GPUHEAL_COORDINATOR_UPDATES)
    sb.extra_env["GPUHEAL_COORDINATOR_UPDATES"] = str(max(1, 8 // workers))
    sb.start_slurm(clean=True)
    sb.stop_temporal()
    sb.start_temporal(fresh=True)
    settings = Settings.from_env(sb.env())
    client = await connect(settings.temporal)
    started_at = datetime.now(UTC)
    procs = [sb.start_worker(i) for i in range(workers)]
    run = Run(name, len(nodes), workers=workers)
    cluster = settings.require_cluster()
    watch = run.watch = Watch(sb, client, cluster, nodes)
    sampler = threading.Thread(target=watch.slurm, daemon=True)
    sampler.start()
    reads = asyncio.ensure_future(watch.reads())
    try:
        gate = asyncio.Semaphore(in_flight)

        async def gated(node: str) -> None:
            async with gate:
                await send(client, settings, node, run)

        t0 = time.monotonic()
        if one_by_one:
            for i, node in enumerate(nodes, 1):
                await send(client, settings, node, run)
                await until_decided(client, cluster, i, time.monotonic() + 60)
        else:
            await asyncio.gather(*(gated(n) for n in nodes))
        run.send_s = time.monotonic() - t0
        last = -1.0
        while True:
            done, s = await decided(client, cluster)
            if done >= len(nodes):
                break
            waited = time.monotonic() - t0
            if waited - last >= 5:
                print(f"  {done}/{len(nodes)} granted or held after {waited:.0f} s", flush=True)
                last = waited
            if waited > 900:
                raise TimeoutError(f"only {done} of {len(nodes)} incidents decided in 900 s")
            await asyncio.sleep(0.2)
        run.all_decided_s = time.monotonic() - t0
        assert s is not None
        run.granted, run.held = done - s.held, s.held
        # Watched on until Slurm's drained count settles: granted incidents drain after their
        # grant, held ones after their containment answer, both behind the storm's backlog.
        settle = time.monotonic() + AFTER_MAX_S
        while time.monotonic() < settle:
            await asyncio.sleep(5)
            recent = watch.drained[-AFTER_S:]
            if len(recent) >= AFTER_S and len(set(recent)) == 1:
                break
        watch.on = False
        await reads
        await asyncio.to_thread(sampler.join)
        print(f"  all {len(nodes)} decided in {run.all_decided_s:.1f} s: {run.granted} granted, {run.held} held")
        run.worker_mb = max(peak_rss_mb(p.pid) for p in procs)
        server = int((sb.temporal.dir / "server.pid").read_text())
        run.temporal_mb = peak_rss_mb(server)
        run.worker_cpu_s, run.temporal_cpu_s = sum(cpu_s(p.pid) for p in procs), cpu_s(server) + database_cpu_s(sb)
        await self_check(client, cluster, nodes, run, started_at)
        coordinator = client.get_workflow_handle(ids.coordinator_id(cluster))
        info = (await coordinator.describe()).raw_description.workflow_execution_info
        run.history_events, run.history_kb = info.history_length, info.history_size_bytes / 1024
        runs = queries.where(queries.eq(queries.WORKFLOW_ID, coordinator.id))  # each continue-as-new is a run
        run.coordinator_runs = (await client.count_workflows(runs)).count
        async for wf in client.list_workflows(runs):
            async for e in client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history_events():
                run.coordinator_tasks += e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
                    update = e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
                    run.updates[update] = run.updates.get(update, 0) + 1
        if not one_by_one:  # a storm queues requests in each worker: fewer updates than requests
            asks = run.updates.get(FLEET_REQUEST_CAPACITY.name, 0) + run.updates.get(
                FLEET_REQUEST_CAPACITY_MANY.name, 0
            )
            check(0 < asks < len(nodes), f"{name}: {asks} capacity updates for {len(nodes)} incidents ({run.updates})")
        gate = asyncio.Semaphore(16)

        async def latency(node: str) -> None:
            async with gate:
                ms = await grant_latency_ms(client, ids.incident_id(cluster, node))
                if ms is not None:
                    run.grants_ms.append(ms)

        await asyncio.gather(*(latency(n) for n in nodes))
        check(
            len(run.grants_ms) == len(nodes), f"{name}: {len(run.grants_ms)} grant latencies for {len(nodes)} incidents"
        )
    finally:
        watch.on = False
        reads.cancel()
        for p in procs:
            Sandbox.stop_process(p)
        sb.stop_temporal()  # the incidents go with the server's database (fresh next run)
        sb.stop_slurm()
    return run


async def self_check(client: Client, cluster: str, nodes: list[str], run: Run, since: datetime) -> None:
    """Every report started its own incident in this run's fresh server: as many incident runs,
    each on its own node, all started after this run began."""
    check(run.skipped == 0, f"{run.name}: {run.skipped} reports answered 'already handled'")
    query = queries.where(queries.of_type(INCIDENT), queries.eq(sa.CLUSTER, cluster))
    found = [wf async for wf in client.list_workflows(query)]
    distinct(f"{run.name}: incident run", [wf.run_id for wf in found])
    distinct(f"{run.name}: incident", [wf.id for wf in found])
    check(len(found) == len(nodes), f"{run.name}: {len(found)} incidents for {len(nodes)} reports")
    check(all(wf.start_time >= since for wf in found), f"{run.name}: an incident started before the run")


def table(runs: list[Run]) -> list[str]:
    watches = [r.watch for r in runs if r.watch is not None]

    def ms(v: list[float]) -> str:
        return f"{statistics.median(v):.0f} / {pct(v, 0.99):.0f} ms" if v else "n/a"

    def line(measure: str, cells: Iterable[str], target: str = "") -> str:
        return f"| {measure} | " + " | ".join(cells) + f" | {target} |"

    def updates(r: Run) -> str:
        u = r.updates.get

        def pair(one: str, many: str) -> str:
            return f"{u(one, 0)} + {u(many, 0)}"

        admits = pair(FLEET_ADMIT.name, FLEET_ADMIT_MANY.name)
        return f"{admits} / {pair(FLEET_REQUEST_CAPACITY.name, FLEET_REQUEST_CAPACITY_MANY.name)}"

    def rate(r: Run) -> str:
        return f"{r.coordinator_tasks} ({r.coordinator_tasks / max(r.all_decided_s, 0.1):.1f}/s)"

    lines = [
        line("measure", (f"{r.name} ({r.reports} reports)" for r in runs), "target"),
        "|---|" + "---|" * len(runs) + "---|",
        line("report -> workflow started, p50 / p99", (ms(r.starts_ms) for r in runs), "p99 < 200 ms"),
        line("coordinator grant latency, p50 / p99", (ms(r.grants_ms) for r in runs), "p99 < 1 s"),
        line("all reports sent", (f"{r.send_s:.1f} s" for r in runs)),
        line("every incident granted or held", (f"{r.all_decided_s:.1f} s" for r in runs)),
        line("granted / held", (f"{r.granted} / {r.held}" for r in runs)),
        line("worker peak RSS", (f"{r.worker_mb:.0f} MB" for r in runs), "< 300 MB"),
        line("Temporal server peak RSS", (f"{r.temporal_mb:.0f} MB" for r in runs)),
        line("coordinator history (this run)", (f"{r.history_events} events, {r.history_kb:.0f} KiB" for r in runs)),
        line("coordinator runs (continue-as-new)", (str(r.coordinator_runs) for r in runs)),
        line("worker processes (coordinator updates each)", (f"{r.workers} ({max(1, 8 // r.workers)})" for r in runs)),
        line(
            "workers' CPU per incident (with their Slurm commands)",
            (f"{r.worker_cpu_s * 1000 / r.reports:.0f} ms" for r in runs),
        ),
        line("Temporal server's CPU per incident", (f"{r.temporal_cpu_s * 1000 / r.reports:.0f} ms" for r in runs)),
        line("coordinator workflow tasks (per second of the run)", (rate(r) for r in runs)),
        line("coordinator updates: admit + admit_many / request + request_many", (updates(r) for r in runs)),
        line("`gpuheal fleet`'s read (memo), p50 / max", (peak(w.read_ms) for w in watches), "max < 1 s"),
        line(
            "`gpuheal fleet` command (with Python's start), p50 / max",
            (peak(w.command_ms) for w in watches),
            "max < 1 s",
        ),
        line(
            "fleet reads unanswered / commands failed",
            (f"{len(w.unanswered)} / {len(w.command_failed)}" for w in watches),
            "0 / 0",
        ),
        line(
            "most reported nodes drained at once (Slurm, every 1 s) / bound",
            (f"{max(w.drained, default=0)} / {w.bound} ({len(w.drained)} samples)" for w in watches),
            "at most the bound",
        ),
    ]
    return lines


def scaling(storms: list[Run]) -> list[str]:
    """What the figures say for a bigger machine: the per-core cost of one incident and the
    coordinator's task rate, the two ceilings (worker CPU, one workflow's task rate)."""
    cores = os.cpu_count() or 1
    lines = ["Scaling (this machine: " + f"{cores} cores):", ""]
    for r in storms:
        per = r.worker_cpu_s * 1000 / r.reports
        rate = r.coordinator_tasks / max(r.all_decided_s, 0.1)
        lines.append(
            f"- {r.workers} worker(s): {per:.0f} CPU-ms of workers per incident and "
            f"{r.temporal_cpu_s * 1000 / r.reports:.0f} of the server; {r.reports / max(r.all_decided_s, 0.1):.1f} "
            f"incidents decided per second; the coordinator ran {rate:.1f} workflow tasks a second "
            f"({r.reports / max(r.coordinator_tasks, 1):.2f} incidents per task)."
        )
    r = storms[-1]
    per = (r.worker_cpu_s + r.temporal_cpu_s) / r.reports
    lines += [
        "",
        f"On paper, for 32 cores at the last storm's cost ({per * 1000:.0f} CPU-ms per incident, workers and server): "
        f"{32 / per:.0f} incidents a second if the CPU were the only limit; one coordinator's task rate "
        "(above) is the other, and more workers do not raise it.",
    ]
    return lines


def peak(v: list[float]) -> str:
    return f"{statistics.median(v):.0f} / {max(v):.0f} ms ({len(v)} reads)" if v else "n/a"


def goals(r: Run) -> list[str]:
    """Each goal beside its figure, met or missed, said plainly."""
    w = r.watch
    assert w is not None
    checks = [
        ("report -> workflow started p99 < 200 ms", pct(r.starts_ms, 0.99) < 200),
        ("coordinator grant p99 < 1 s", pct(r.grants_ms, 0.99) < 1000),
        ("`gpuheal fleet` read within 1 s every time", bool(w.read_ms) and max(w.read_ms) < 1000 and not w.unanswered),
        (
            "`gpuheal fleet` command within 1 s every time",
            bool(w.command_ms) and max(w.command_ms) < 1000 and not w.command_failed,
        ),
        ("never more drained than the bound", bool(w.drained) and 0 < w.bound and max(w.drained) <= w.bound),
    ]
    lines = [f"- {r.name}: {what}: **{'met' if ok else 'MISSED'}**" for what, ok in checks]
    lines += [f"  - read unanswered: {e}" for e in w.unanswered]
    lines += [f"  - command failed: {e!r}" for e in w.command_failed]
    return lines


SERVERS = {"dev": "Temporal dev server", "cluster": "Temporal cluster (temporal-server v1.32 on PostgreSQL 15, mTLS)"}


def database_cpu_s(sb: Sandbox) -> float:
    """The cluster's PostgreSQL: its postmaster and every backend it runs now (those that ended
    count in the postmaster's own children's time); nothing for the dev server (in its process)."""
    if sb.temporal_kind != "cluster":
        return 0.0
    postmaster = int((sb.temporal.dir / "pg" / "postmaster.pid").read_text().split()[0])
    children = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and ppid(int(p.name)) == postmaster]
    return cpu_s(postmaster) + sum(cpu_s(c) for c in children)


def ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reports", type=int, default=1000)
    ap.add_argument("--budget", default="5%")
    ap.add_argument("--in-flight", type=int, default=50, help="reports sent at once")
    ap.add_argument("--quiet", type=int, default=20, help="baseline: reports sent one at a time")
    ap.add_argument("--workers", default="1,2,4", help="storms with this many worker processes each")
    ap.add_argument("--temporal", default="dev", choices=KINDS, help="the dev server (default) or the cluster")
    args = ap.parse_args()
    results = RESULTS if args.temporal == "dev" else RESULTS.with_name("storm-cluster.md")
    counts = [int(w) for w in args.workers.split(",")]
    if args.reports < 4:
        ap.error("--reports: at least 4")
    env = {
        "GPUHEAL_SLURM_ACTIVE": "3",
        "GPUHEAL_SLURM_SPARES": str(SPARES),
        "GPUHEAL_SLURM_FLEET": str(args.reports - 3),
        "GPUHEAL_BUDGET": args.budget,
        "GPUHEAL_RATE": "100000",
        "GPUHEAL_BREAKER_MAX": "100000",
        "GPUHEAL_BREAKER_DOMAIN_SHARE": "1",
        "GPUHEAL_CHECKPOINT_GRACE_S": "1",
        "GPUHEAL_SLURMD_TIMEOUT": "3600",  # fleet nodes stay "not responding", not DOWN, meanwhile
    }
    sb = Sandbox.named("bench", RUN / "bench-storm", extra_env=env, temporal_kind=args.temporal)
    nodes = node_names(args.reports)
    runs = [await one_run(sb, "baseline: one at a time", nodes[: args.quiet], 1, one_by_one=True)]
    for n in counts:
        runs.append(await one_run(sb, f"storm, {n} worker(s)", nodes, args.in_flight, one_by_one=False, workers=n))
    base = runs[0]
    lines = [
        f"# Failure storm: the coordinator under {args.reports:,} reports",
        "",
        f"Written by `make bench-storm` (bench/storm.py) on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"{len(nodes)}-node Slurm sandbox (host Slurm), "
        f"{SERVERS[args.temporal]}, "
        f"budget {args.budget}, "
        f"{args.in_flight} reports in flight, breaker and rate opened wide. Figures, self-checked (bench/storm.py).",
        "",
        *table(runs),
        "",
        *[
            f"{r.name} / baseline: start p99 x{pct(r.starts_ms, 0.99) / pct(base.starts_ms, 0.99):.1f}, "
            f"grant p99 x{pct(r.grants_ms, 0.99) / pct(base.grants_ms, 0.99):.1f}, "
            f"worker RSS x{r.worker_mb / base.worker_mb:.2f}, Temporal RSS x{r.temporal_mb / base.temporal_mb:.2f}."
            for r in runs[1:]
        ],
        "",
        *scaling(runs[1:]),
        "",
        "Goals (each storm):",
        *[line for r in runs[1:] for line in goals(r)],
        "",
    ]
    results.write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"written to {results.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
