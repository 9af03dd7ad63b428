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
from infra.soak.records import Bound, JobEnd, LogEvent, NodeSample, first_node, parse_slurmctld, parse_spares
from infra.soak.world import World, bound

SAMPLE_S = 1.0
BOUND_S = 3600.0  # each incident's bound: its hold (POLICY's 900 s) and its waits for capacity and a person


class Sampler:
    """Each cluster's drained nodes and their reasons, every second, a JSON line each
    (`sinfo -N`: every node, once per partition it is in)."""

    def __init__(self, world: World, path: Path) -> None:
        self.world, self.path = world, path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        with self.path.open("a") as out:
            while not self._stop.wait(SAMPLE_S):
                for c in self.world.clusters.values():
                    at = time.time()
                    try:
                        text = c.sb.slurm("sinfo", "-h", "-N", "-o", "%N|%T|%E", check=True)
                    except Exception as err:  # slurmctld stopped by a fault: a gap, said so
                        out.write(json.dumps({"at": at, "cluster": c.name, "error": str(err)[:200]}) + "\n")
                        continue
                    drained = {}
                    for line in text.splitlines():
                        node, state, reason = [*line.split("|", 2), "", ""][:3]
                        if "drain" in state:
                            drained[node] = reason
                    # Where each running job is: slurmctld logs a main scheduler's start, not a
                    # backfill's, at its info level.
                    running = c.sb.slurm("squeue", "-h", "-t", "R", "-o", "%i|%N", check=False)
                    jobs = dict(line.split("|", 1) for line in running.splitlines() if "|" in line)
                    out.write(json.dumps({"at": at, "cluster": c.name, "drained": drained, "jobs": jobs}) + "\n")
                out.flush()


def starts_seen(path: Path) -> list[LogEvent]:
    """A job seen running on a node it was not on at the sample before: its start there, as an
    allocation (the log's own allocations stand beside these; the checker reads the latest)."""
    seen: dict[tuple[str, int], str] = {}
    out = []
    for line in path.read_text().splitlines():
        s = json.loads(line)
        for job, nodes in s.get("jobs", {}).items():
            key, node = (s["cluster"], int(job)), first_node(nodes)
            if seen.get(key) != node:
                out.append(LogEvent(s["at"], s["cluster"], "allocate", node=node, job=int(job)))
                seen[key] = node
    return out


def samples(path: Path) -> list[NodeSample]:
    out = []
    for line in path.read_text().splitlines():
        s = json.loads(line)
        if "drained" in s:
            out.append(NodeSample(s["at"], s["cluster"], s["drained"]))
    return out


async def _history(client: Client, workflow_id: str, run_id: str) -> dict[str, Any]:
    h = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    return dict(json.loads(h.to_json()))


async def gather(world: World, client: Client, begun: float, end: float, soak_cancelled: set[int]) -> Records:
    """Every record the checker reads, from where each system keeps it."""
    events, runs, breaker, grants, spares, job_ends, reservations = [], [], [], [], [], [], []
    bounds = []
    for c in world.clusters.values():
        log = c.sb.slurm_dir / "log" / "slurmctld.log"
        events += [e for e in parse_slurmctld(log.read_text().splitlines(), c.name) if e.at >= begun - 60]
        bounds.append(Bound(c.name, 0.0, bound()))
        prefix = ids.incident_prefix(c.name)
        listing = queries.where(queries.of_type(INCIDENT), queries.eq(sa.CLUSTER, c.name))
        async for w in client.list_workflows(listing):
            node = w.id[len(prefix) :]
            h = await _history(client, w.id, w.run_id)
            runs.append(
                histories.incident_run(h, cluster=c.name, workflow_id=w.id, run_id=w.run_id, node=node, bound_s=BOUND_S)
            )
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
        record = c.sb.slurm_dir / "provider" / "replacements.json"
        spares += parse_spares(record.read_text() if record.exists() else "{}", c.name)
        for job in c.jobs:  # as scontrol says (ended jobs stay MinJobAge, an hour, in the sandbox)
            shown = c.sb.slurm("scontrol", "-o", "show", "job", str(job), check=False)
            state = m.group(1) if (m := re.search(r"\bJobState=(\S+)", shown)) else "UNKNOWN"
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
        runs=runs,
        grants=grants,
        breaker=breaker,
        spares=spares,
        bounds=bounds,
        job_ends=job_ends,
        reservations=reservations,
    )
