"""A failure storm against the cluster's coordinator: what admitting 1,000 incidents at once costs.

    python -m bench.storm [--reports 1000] [--budget 5%] [--in-flight 50] [--quiet 20] [--temporal cluster]
                          [--workers 1,2,4] [--no-own-coordinator] [--baseline-src DIR]

A Slurm sandbox with --reports nodes (fleet0001.. are defined in slurm.conf, in one ranged line
as a real fleet's config is written, without a slurmd: a fleet's size, not its daemons), a
fresh Temporal dev server and the worker as its own process.
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
The coordinator runs in a worker process of its own (GPUHEAL_WORKER_SERVES=coordinator, as the
chart deploys it) beside the incidents' workers, unless --no-own-coordinator; --baseline-src runs
one storm first with another checkout's workers (the before, one process serving all).
With --temporal cluster, the Temporal cluster (temporal-server on PostgreSQL, mTLS) instead of the
dev server; its figures ("Temporal" = the server and PostgreSQL together) size docs/production.md
(sizing per 1,000 nodes). Writes bench/results/storm.md (storm-cluster.md; storm[-cluster]-N.md for
--reports N other than 1,000). Figures, not assertions, but
self-checked: every report started its own incident run in the run's fresh server, and every
incident has its own grant latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus

from bench.common import check, cpu_s, distinct, patiently, peak_rss_mb
from bench.storm_report import Run, Watched, report
from gpuheal.activities import interface as act
from gpuheal.clients.temporal import connect
from gpuheal.core import ids, queries
from gpuheal.core import search_attributes as sa
from gpuheal.core.fleet.view import FleetView
from gpuheal.core.messages import (
    FLEET_ADMIT_AND_REQUEST_MANY,
    FLEET_DOMAINS,
    FLEET_POLICY_MEMO,
    FLEET_REQUEST_CAPACITY,
    FLEET_REQUEST_CAPACITY_MANY,
    FLEET_VIEW,
    INCIDENT,
)
from gpuheal.core.models.report import HealthReport
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import AlreadyHandled, start_unless_handled
from infra.sandbox import REPO, RUN
from infra.sandbox.stack import Sandbox
from infra.sandbox.temporal import KINDS

RESULTS = REPO / "bench" / "results" / "storm.md"
SPARES = 3
VIEW_TIMEOUT = timedelta(seconds=5)
GPUHEAL = str(Path(sys.executable).parent / "gpuheal")
AFTER_S = 60  # samples (1 s apart) the drained count must hold still before the watch ends
AFTER_MAX_S = 900  # ... at most this long after every incident is decided
DECIDE_MAX_S = 900  # every incident granted or held within this long per 1,000 reports (or the run fails)
ANSWERS_MAX_S = 1800  # ... and every incident's own first answer found in its history within this long


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


# A domain release no incident is open for: answered (exit 1, saying so) without changing anything.
LEVER_DOMAIN = ("domain", "release", "rack=storm-probe", "--operator", "bench", "--reason", "probe")


class Watch(Watched):
    """Throughout a run: how long `gpuheal fleet`'s read takes (every second, in process, and the
    command itself every 15 s), and how many of the reported nodes Slurm shows drained (every
    second), beside the bound the coordinator computes (cluster budget + containment bound)."""

    def __init__(self, sb: Sandbox, client: Client, cluster: str, nodes: list[str]) -> None:
        self.sb, self.client, self.cluster, self.nodes = sb, client, cluster, set(nodes)
        self.handle = client.get_workflow_handle(ids.coordinator_id(cluster))
        # the figures, declared (with what each means) on Watched
        self.read_ms, self.command_ms, self.unanswered, self.command_failed = [], [], [], []
        self.drained, self.bound = [], 0
        self.levers_ms, self.lever_reads_ms, self.levers_failed = {}, {}, []
        self.on = True

    def slurm(self) -> None:  # a thread: sinfo blocks
        # Only the drained nodes' names (DRAIN: draining or drained, down or not, as NodeInfo.drained):
        # the whole fleet's `sinfo --json` is 12 MB at 10,000 nodes, a second of CPU each sample.
        while self.on:
            drained = self.sb.slurm("sinfo", "--noheader", "--Node", "--states=drain", "--format=%N").split()
            self.drained.append(len(self.nodes.intersection(drained)))
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
                await self.lever_reads()
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
                await self.levers()
            await asyncio.sleep(1)

    async def lever_reads(self) -> None:
        """What `gpuheal policy` and `gpuheal domain` read, in process: the coordinator's memo."""
        for name, memo in (("policy show", FLEET_POLICY_MEMO), ("domain release", FLEET_DOMAINS)):
            t0 = time.perf_counter()
            try:
                found = await memo.read(self.handle, rpc_timeout=VIEW_TIMEOUT)
            except Exception as err:
                self.levers_failed.append(f"{name} read: {err}"[:200])
                continue
            if found is not None:  # (a coordinator publishes them at its first task)
                self.lever_reads_ms.setdefault(name, []).append((time.perf_counter() - t0) * 1000)

    async def levers(self) -> None:
        """`gpuheal policy show` (it prints the policy) and `gpuheal domain release` of a domain
        with no incident (it says so, exit 1): each answered from the coordinator's memo."""
        for name, argv, answer in (
            ("policy show", ["policy", "show"], (0, "policy version")),
            ("domain release", [*LEVER_DOMAIN], (1, "no open domain incident for 'rack=storm-probe'")),
        ):
            t0 = time.perf_counter()
            done = await asyncio.to_thread(subprocess.run, [GPUHEAL, *argv], env=self.sb.env(), capture_output=True)
            said = done.stdout.decode() + done.stderr.decode()
            if (done.returncode, answer[1] in said) == (answer[0], True):
                self.levers_ms.setdefault(name, []).append((time.perf_counter() - t0) * 1000)
            else:
                self.levers_failed.append(f"{name}: exit {done.returncode}: {said[-200:]}")


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
    if isinstance(await start_unless_handled(client, settings, report), AlreadyHandled):
        run.skipped += 1  # (as the webhook and the CLI start: one call for a node with no closed incident)
    run.starts_ms.append((time.perf_counter() - t0) * 1000)


async def grant_latency_ms(client: Client, workflow_id: str) -> tuple[float, float] | None:
    """Two figures for the incident's capacity answer (scheduled -> completed): from its ask, and
    from its admission's ask. The ask is its first request_capacity, or its admission when the
    decision came with it (admit_and_request_many): then both figures are the same. From the
    admission is the one a before without the merged update compares with fairly."""
    scheduled: dict[int, tuple[str, datetime]] = {}
    admitted_at: datetime | None = None
    asking = {act.ADMIT_INCIDENT.name, act.REQUEST_CAPACITY.name}
    async for e in client.get_workflow_handle(workflow_id).fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = e.activity_task_scheduled_event_attributes.activity_type.name
            if name in asking:
                scheduled[e.event_id] = (name, e.event_time.ToDatetime())
                if name == act.ADMIT_INCIDENT.name and admitted_at is None:
                    admitted_at = e.event_time.ToDatetime()
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = e.activity_task_completed_event_attributes
            name, at = scheduled.get(done.scheduled_event_id, ("", datetime.min))
            if name == act.ADMIT_INCIDENT.name:
                answer = json.loads(done.result.payloads[0].data) if done.result.payloads else {}
                if not answer.get("decision"):
                    continue  # admitted alone: its request follows
            if name:
                end = e.event_time.ToDatetime()
                return (end - at).total_seconds() * 1000, (end - (admitted_at or at)).total_seconds() * 1000
    return None


async def one_run(
    sb: Sandbox,
    name: str,
    nodes: list[str],
    in_flight: int,
    one_by_one: bool,
    workers: int = 1,
    own: bool = False,
    src: Path | None = None,
) -> Run:
    """`own`: the coordinator in a worker process of its own (GPUHEAL_WORKER_SERVES) beside the
    `workers` serving the incidents; `src`: the workers run that checkout's gpuheal (the before)."""
    print(f"{name}: {len(nodes)} reports, {workers} worker(s){' + the coordinator' if own else ''}", flush=True)
    # Temporal takes 10 updates in flight per workflow: the workers share 8
    # (docs/configuration.md: GPUHEAL_COORDINATOR_UPDATES)
    sb.extra_env["GPUHEAL_COORDINATOR_UPDATES"] = str(max(1, 8 // workers))
    sb.extra_env.pop("PYTHONPATH", None)
    if src is not None:
        sb.extra_env["PYTHONPATH"] = str(src)
    sb.start_slurm(clean=True)
    sb.stop_temporal()
    sb.start_temporal(fresh=True)
    settings = Settings.from_env(sb.env())
    client = await connect(settings.temporal)
    started_at = datetime.now(UTC)
    procs = [sb.start_worker(i, "incidents" if own else "all") for i in range(workers)]
    if own:
        procs.append(sb.start_worker(workers, "coordinator"))
    run = Run(name, len(nodes), workers=workers, own_coordinator=own)
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

        limit_s = DECIDE_MAX_S * max(1.0, len(nodes) / 1000)
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
            if waited > limit_s:
                raise TimeoutError(f"only {done} of {len(nodes)} incidents decided in {limit_s:.0f} s")
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
        run.worker_mb = max(peak_rss_mb(p.pid) for p in procs[:workers])
        run.coordinator_mb = peak_rss_mb(procs[-1].pid) if own else 0.0
        server = int((sb.temporal.dir / "server.pid").read_text())
        run.temporal_mb = peak_rss_mb(server)
        run.worker_cpu_s, run.temporal_cpu_s = sum(cpu_s(p.pid) for p in procs), cpu_s(server) + database_cpu_s(sb)
        await self_check(client, cluster, nodes, run, started_at)
        coordinator = client.get_workflow_handle(ids.coordinator_id(cluster))
        info = (await coordinator.describe()).raw_description.workflow_execution_info
        run.history_events, run.history_kb = info.history_length, info.history_size_bytes / 1024
        runs = queries.where(queries.eq(queries.WORKFLOW_ID, coordinator.id))  # each continue-as-new is a run
        run.coordinator_runs = (await patiently("the coordinator's runs", lambda: client.count_workflows(runs))).count
        for wf in await patiently("the coordinator's runs", lambda: _listed(client, runs)):
            # one chain: every run but the open one continued as new (none terminated, failed or timed out)
            check(
                wf.status in (WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.CONTINUED_AS_NEW),
                f"{name}: coordinator run {wf.run_id} ended {wf.status}",
            )
            scheduled: datetime | None = None
            async for e in client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history_events():
                run.coordinator_tasks += e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
                run.history_total_kb += e.ByteSize() / 1024
                kind = EventType.Name(e.event_type).removeprefix("EVENT_TYPE_").lower()
                run.history_by_kind[kind] = run.history_by_kind.get(kind, 0.0) + e.ByteSize() / 1024
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
                    scheduled = e.event_time.ToDatetime()
                elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED and scheduled is not None:
                    run.task_waits_ms.append((e.event_time.ToDatetime() - scheduled).total_seconds() * 1000)
                    scheduled = None
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
                    update = e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
                    run.updates[update] = run.updates.get(update, 0) + 1
        if not one_by_one:  # a storm queues requests in each worker: fewer updates than requests
            kinds = (FLEET_REQUEST_CAPACITY, FLEET_REQUEST_CAPACITY_MANY, FLEET_ADMIT_AND_REQUEST_MANY)
            asks = sum(run.updates.get(k.name, 0) for k in kinds)
            check(0 < asks < len(nodes), f"{name}: {asks} capacity updates for {len(nodes)} incidents ({run.updates})")
        gate = asyncio.Semaphore(16)
        latencies: dict[str, tuple[float, float]] = {}

        async def latency(node: str) -> None:
            async with gate:
                ms = await grant_latency_ms(client, ids.incident_id(cluster, node))
                if ms is not None:
                    latencies[node] = ms

        # The view's counts can run ahead of the incidents (a closed one counts as decided): every
        # incident's own first answer is waited for, and the time it took is the figure.
        while True:
            await asyncio.gather(*(latency(n) for n in nodes if n not in latencies))
            if len(latencies) == len(nodes) or time.monotonic() - t0 > ANSWERS_MAX_S * limit_s / DECIDE_MAX_S:
                break
            print(f"  {len(nodes) - len(latencies)} incident(s) not answered yet (slow to admit): waiting", flush=True)
            await asyncio.sleep(5)
            run.all_decided_s = time.monotonic() - t0
        run.grants_ms = [latencies[n][0] for n in nodes if n in latencies]
        run.answers_ms = [latencies[n][1] for n in nodes if n in latencies]
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
    found = await patiently("the self-check's listing", lambda: _listed(client, query))
    distinct(f"{run.name}: incident run", [wf.run_id for wf in found])
    distinct(f"{run.name}: incident", [wf.id for wf in found])
    check(len(found) == len(nodes), f"{run.name}: {len(found)} incidents for {len(nodes)} reports")
    check(all(wf.start_time >= since for wf in found), f"{run.name}: an incident started before the run")


async def _listed(client: Client, query: str) -> list[WorkflowExecution]:
    return [wf async for wf in client.list_workflows(query)]


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


def git_head(src: Path) -> str:
    done = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or str(src)


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reports", type=int, default=1000)
    ap.add_argument("--budget", default="5%")
    ap.add_argument("--in-flight", type=int, default=50, help="reports sent at once")
    ap.add_argument("--quiet", type=int, default=20, help="baseline: reports sent one at a time")
    ap.add_argument("--workers", default="1,2,4", help="storms with this many worker processes each")
    ap.add_argument("--temporal", default="dev", choices=KINDS, help="the dev server (default) or the cluster")
    ap.add_argument(
        "--own-coordinator",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the coordinator in a worker process of its own, as the chart deploys it (default)",
    )
    ap.add_argument("--baseline-src", type=Path, help="a checkout whose workers storm too, first (the before)")
    ap.add_argument(
        "--baseline-own",
        action="store_true",
        help="the before's coordinator in a process of its own too (a before that has GPUHEAL_WORKER_SERVES)",
    )
    args = ap.parse_args()
    # one file per size and server: a 10,000-report run does not overwrite the 1,000-report table
    stem = ("storm" if args.temporal == "dev" else "storm-cluster") + (
        "" if args.reports == 1000 else f"-{args.reports}"
    )
    results = RESULTS.with_name(f"{stem}.md")
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
    if args.baseline_src:
        src = args.baseline_src.resolve()
        apart = " + the coordinator" if args.baseline_own else ""
        before = f"before ({git_head(src)}): storm, {counts[0]} worker(s){apart}"
        runs.append(
            await one_run(
                sb, before, nodes, args.in_flight, one_by_one=False, workers=counts[0], own=args.baseline_own, src=src
            )
        )
    own = args.own_coordinator
    for n in counts:
        name = f"storm, {n} worker(s){' + the coordinator' if own else ''}"
        runs.append(await one_run(sb, name, nodes, args.in_flight, one_by_one=False, workers=n, own=own))
    lines = report(runs, args, len(nodes))
    results.write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"written to {results.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
