"""What the soak gathers while it runs (Slurm sampled every second) and after it (each system's
own record), into infra.soak.invariants.Records. Temporal is read as any client reads it: the
visibility listing of the clusters' workflows, and each run's history as the server keeps it.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus

from gpuheal.core import ids, queries
from gpuheal.core import search_attributes as sa
from gpuheal.core.messages import INCIDENT
from infra.soak import histories
from infra.soak.invariants import Records
from infra.soak.records import (
    CLOCK_SKEW_S,
    Bound,
    JobEnd,
    LogEvent,
    NodeSample,
    first_node,
    log_clock_skew,
    parse_audit,
    parse_jobcomp,
    parse_slurmctld,
    parse_spares,
)
from infra.soak.world import INFERENCE_NODES, Cluster, World, bound, incident_bound_s

SAMPLE_S = 1.0


class Sampler:
    """Each cluster's drained and DOWN nodes with their reasons, and where each job runs, every
    second, a JSON line each. A thread per cluster: a slurmctld the soak stopped delays only its
    own cluster's samples, and a command that fails is written as a gap (the checker names gaps)."""

    def __init__(self, world: World, path: Path) -> None:
        self.world, self.path = world, path
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(c,), daemon=True) for c in world.clusters.values()]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            if t.ident is not None:  # started (a world that failed to start never started them)
                t.join(timeout=30)

    def _write(self, line: dict[str, Any]) -> None:
        with self._lock, self.path.open("a") as out:
            out.write(json.dumps(line) + "\n")

    def _run(self, c: Cluster) -> None:
        while not self._stop.wait(SAMPLE_S):
            try:
                self._write(sample(c))
            except Exception as err:  # slurmctld stopped by a fault, a command timed out: a gap, said so
                self._write({"at": time.time(), "cluster": c.name, "error": str(err)[:200]})


def sample(c: Cluster) -> dict[str, Any]:
    """One look at a cluster: `sinfo -N` (every node, once per partition it is in), dated when it
    answered, then `squeue` of the running jobs, dated when it answered."""
    text = c.sb.slurm("sinfo", "-h", "-N", "-o", "%N|%T|%E", check=True)
    at = time.time()
    drained, down = {}, {}
    for line in text.splitlines():
        node, state, reason = [*line.split("|", 2), "", ""][:3]
        if "drain" in state:
            drained[node] = reason
        elif state.startswith("down"):
            down[node] = reason
    # Where each running job is: slurmctld logs a main scheduler's start, not a backfill's, at its
    # info level.
    running = c.sb.slurm("squeue", "-h", "-t", "R", "-o", "%i|%N", check=True)
    jobs = dict(line.split("|", 1) for line in running.splitlines() if "|" in line)
    return {"at": at, "cluster": c.name, "drained": drained, "down": down, "jobs_at": time.time(), "jobs": jobs}


def starts_seen(path: Path) -> list[LogEvent]:
    """A job seen running on a node it was not on at the sample before: its start there, as an
    allocation (the log's own allocations stand beside these; the checker reads the latest)."""
    seen: dict[tuple[str, int], str] = {}
    before: dict[str, set[int]] = {}  # each cluster's running jobs at its sample before
    out = []
    for line in path.read_text().splitlines():
        s = json.loads(line)
        if "jobs" not in s:
            continue  # a gap: what ran meanwhile is unknown, and the next sample says what runs
        now = {int(job) for job in s["jobs"]}
        was = before.get(s["cluster"], set())
        before[s["cluster"]] = now
        for job, nodes in s["jobs"].items():
            key, node = (s["cluster"], int(job)), first_node(nodes)
            # A start: on a node it was not on, or running again after a sample without it (a
            # stay ended, Slurm's job completion log says, and began again on the same node).
            if seen.get(key) != node or int(job) not in was:
                out.append(LogEvent(s.get("jobs_at", s["at"]), s["cluster"], "allocate", node=node, job=int(job)))
                seen[key] = node
    return out


def samples(path: Path) -> list[NodeSample]:
    out = []
    for line in path.read_text().splitlines():
        s = json.loads(line)
        if "drained" in s:
            out.append(NodeSample(s["at"], s["cluster"], s["drained"], s.get("down", {})))
    return out


async def _history(client: Client, workflow_id: str, run_id: str) -> dict[str, Any]:
    h = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    return dict(json.loads(h.to_json()))


BORROWED_RUN = "gpuheal.io/borrowed-run"  # on a borrowed Node: the incident run holding it (docs/slurm-kubernetes.md)


def still_borrowed(c: Cluster) -> list[tuple[str, str, str]]:
    """The cluster's Kubernetes Nodes that bear gpuheal's borrowed-run mark, as the apiserver has them."""
    assert c.kube is not None
    core: Any = c.kube.core()  # the typed client's Optionals do not help a harness
    out = []
    for n in core.list_node().items:
        run = (n.metadata.annotations or {}).get(BORROWED_RUN)
        if run:
            out.append((c.name, str(n.metadata.name), str(run)))
    return out


class SoakError(RuntimeError):
    """A record the checker cannot read truly: said, never checked on nothing."""


def read_log(log: Path, cluster: str, begun: float) -> list[LogEvent]:
    """slurmctld's events from the soak's start on, once its clock is shown to be UTC."""
    lines = log.read_text().splitlines()
    skew = log_clock_skew(lines, log.stat().st_mtime)
    if abs(skew) > CLOCK_SKEW_S:
        raise SoakError(f"{log}: its last line is {skew:+.0f} s from its last write: slurmctld is not logging in UTC")
    return [e for e in parse_slurmctld(lines, cluster) if e.at >= begun - 60]


async def gather(
    world: World,
    client: Client,
    begun: float,
    end: float,
    soak_cancelled: set[int],
    quiet: list[tuple[str, float, float]],
) -> Records:
    """Every record the checker reads, from where each system keeps it."""
    events, runs, breaker, grants, spares, job_ends, reservations = [], [], [], [], [], [], []
    bounds: list[Bound] = []
    borrowed: list[tuple[str, str, str]] = []
    lendable: list[tuple[str, str]] = []
    for c in world.clusters.values():
        events += read_log(c.sb.slurm_dir / "log" / "slurmctld.log", c.name, begun)
        jobcomp = c.sb.slurm_dir / "log" / "jobcomp.log"
        lines = jobcomp.read_text().splitlines() if jobcomp.exists() else []  # written at a job's first end
        ended = [e for e in parse_jobcomp(lines, c.name) if e.at >= begun - 60]
        events += ended
        accounted = {e.job: e.text for e in ended}  # each job's last end: Slurm's account of it
        if c.kube is not None:
            audit = c.kube.root / "audit.log"
            events += [e for e in parse_audit(audit.read_text().splitlines(), c.name) if e.at >= begun - 60]
            borrowed += still_borrowed(c)
            lendable += [(c.name, node) for node in INFERENCE_NODES]
        bounds.append(Bound(c.name, 0.0, bound()))
        prefix = ids.incident_prefix(c.name)
        listing = queries.where(queries.of_type(INCIDENT), queries.eq(sa.CLUSTER, c.name))
        async for w in client.list_workflows(listing):
            node = w.id[len(prefix) :]
            h = await _history(client, w.id, w.run_id)
            run = histories.incident_run(
                h, cluster=c.name, workflow_id=w.id, run_id=w.run_id, node=node, bound_s=incident_bound_s()
            )
            runs.append(run)
        fleet_id = ids.coordinator_id(c.name)
        chain = [w async for w in client.list_workflows(queries.where(queries.eq(queries.WORKFLOW_ID, fleet_id)))]
        chain.sort(key=lambda w: w.start_time)
        breaker += histories.breaker_changes([await _history(client, fleet_id, w.run_id) for w in chain], c.name)
        running = [w for w in chain if w.status == WorkflowExecutionStatus.RUNNING]
        if running:
            described = await client.get_workflow_handle(fleet_id).describe()
            view = await described.memo_value("fleet", None)
            if isinstance(view, dict):
                grants += histories.grants_held(view, c.name, end)
        record = c.sb.slurm_dir / "provider" / "given.jsonl"
        spares += parse_spares(record.read_text() if record.exists() else "", c.name)
        for job in c.jobs:  # as scontrol says (ended jobs stay MinJobAge, an hour), else as jobcomp does
            shown = c.sb.slurm("scontrol", "-o", "show", "job", str(job), check=False)
            state = m.group(1) if (m := re.search(r"\bJobState=(\S+)", shown)) else accounted.get(job, "UNKNOWN")
            job_ends.append(JobEnd(c.name, job, state, job in soak_cancelled))
        shown = c.sb.slurm("scontrol", "-o", "show", "reservation", check=False)
        for line in shown.splitlines():
            name = line.split()[0].removeprefix("ReservationName=") if line.startswith("ReservationName=") else ""
            if name.startswith("gpuheal-validate-"):
                reservations.append((c.name, name))
    events += starts_seen(world.root / "samples.jsonl")
    return Records(
        end=end,
        events=sorted(events, key=lambda e: e.at),
        samples=samples(world.root / "samples.jsonl"),
        runs=histories.chained(runs),
        grants=grants,
        breaker=breaker,
        spares=spares,
        bounds=bounds,
        job_ends=job_ends,
        reservations=reservations,
        borrowed=borrowed,
        lendable=lendable,
        begun=begun,
        clusters=list(world.clusters),
        quiet=quiet,
    )
