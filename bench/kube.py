"""The Kubernetes side of a storm: cordon + taint for 1,000 incidents on a cluster of 10,000 Nodes.

    python -m bench.kube [--nodes 10000] [--incidents 1000] [--slots 100]

A fresh Kubernetes sandbox of its own (infra/k8s/cluster.sh: etcd, kube-apiserver, the
controller manager, the scheduler, and kwok keeping every Node Ready with its lease, as kubelets
would) with --nodes Nodes. Then --incidents incidents all ask at once, each on its own Node,
through gpuheal's own `cordon_and_taint_node` activity with the worker's ServiceAccount (its
least-privilege RBAC) in a process of its own, run the way the worker runs it: at most --slots at
once (temporalio's default `max_concurrent_activities`, which gpuheal's worker keeps), each
Kubernetes call on the event loop's default thread pool (`clients.kube.call`).

Measured per incident: the activity's own time (read + patch) and the time from the storm's
start until a watch on Nodes (what the scheduler sees) shows its Node cordoned and tainted with
its incident; the peak memory (VmHWM) of the worker process, the apiserver and etcd, and their
CPU. The Temporal side of the same storm is `bench.storm`'s.

Self-checked: the cluster holds --nodes Nodes, 99% Ready (kwok renews their leases on these same
cores; the Ready count at the storm's start and end is reported); every incident cordoned its own Node (its
taint carries the incident, no Node twice); every other Node is untouched; asking again (a
retried activity) changes nothing (`already_done`, the incident annotation's managedFields entry unchanged).
Writes bench/results/kube.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from bench.common import check, cpu_s, peak_rss_mb
from bench.kube_report import CREATE_THREADS, READY_SHARE, Result, report
from gpuheal.activities.kubernetes import INCIDENT_ANNOTATION, TAINT_KEY, KubernetesActivities, label_safe
from gpuheal.clients.kube import call, load_api, node_ready
from gpuheal.core import ids
from gpuheal.core.models.kubernetes import CordonRequest, KubeNodeRef
from gpuheal.providers.sandbox import kwok_node
from infra.sandbox import REPO, RUN
from infra.sandbox.kube import KubeSandbox

RESULTS = REPO / "bench" / "results" / "kube.md"
PORT = 22443  # its own apiserver (etcd on +1, +2): clear of the tests' 26443 and the demo's 16443
CLUSTER = "bench"
READY_TIMEOUT_S = 900
# kwok renews 10,000 leases on the same cores as everything else, and the controller manager
# marks a Node whose lease came late Unknown until the next renewal: Ready is a share (READY_SHARE).
READY_POLL_S = 10  # each look lists 10,000 Nodes
QUIET_S = 20  # before the storm: what the cluster costs with nothing but kwok's leases


def node_name(i: int) -> str:
    return f"kwok-{i:05d}"


def incident_of(node: str) -> str:
    return ids.incident_id(CLUSTER, node)


def cordon_of(node: str) -> CordonRequest:
    """Its incident's cordon, as the incident workflow asks it (the Kubernetes Node has the Slurm node's name)."""
    return CordonRequest(node=KubeNodeRef(slurm_node=node, kube_node=node, incident_id=incident_of(node)))


def all_nodes(core: Any) -> Iterator[Any]:
    """Every Node, paged as a controller lists them."""
    token = None
    while True:
        page = core.list_node(limit=2000, _continue=token)
        yield from page.items
        token = page.metadata._continue
        if not token:
            return


# --- the worker's side, in its own process ---------------------------------------------------


async def cordon_storm(kubeconfig: str, nodes: list[str], slots: int, pids: dict[str, int]) -> dict[str, Any]:
    """Every incident asks at once; at most `slots` activities run, as in one worker."""
    acts = KubernetesActivities(load_api(kubeconfig))
    gate = asyncio.Semaphore(slots)
    rows: dict[str, dict[str, Any]] = {}

    async def one(node: str) -> None:
        async with gate:
            began = time.time()
            result = await acts.cordon_and_taint_node(cordon_of(node))
            rows[node] = {"began": began, "ended": time.time(), "already_done": result.already_done}

    pids = {**pids, "worker": os.getpid()}
    cpu0 = {p: cpu_s(pid) for p, pid in pids.items()}
    t0 = time.time()
    await asyncio.gather(*(one(n) for n in nodes))
    first = time.time() - t0
    storm_cpu = {p: cpu_s(pid) - cpu0[p] for p, pid in pids.items()}  # the storm alone, not the retries
    rss_mb = peak_rss_mb(os.getpid())
    await asyncio.sleep(1.1)  # managedFields times are in seconds: a rewrite now would show
    retried, before, after = {}, {}, {}  # the same activity again: a retry after a lost answer
    for node in nodes:
        before[node] = our_write(await call(acts.core.read_node, node))
        retried[node] = (await acts.cordon_and_taint_node(cordon_of(node))).already_done
        after[node] = our_write(await call(acts.core.read_node, node))
    changed = [n for n in nodes if not before[n] or before[n] != after[n]]
    return {
        "t0": t0,
        "storm_s": first,
        "rows": rows,
        "retried": retried,
        "rewritten": changed,
        "rss_mb": rss_mb,
        "cpu": storm_cpu,
    }


def our_write(node: Any) -> str:
    """Who last wrote the incident's annotation, and when (managedFields): other writers of the
    Node (kwok's status, the node-lifecycle controller's taints) do not change it."""
    for entry in node.metadata.managed_fields or []:
        if f"f:{INCIDENT_ANNOTATION}" in json.dumps(entry.fields_v1 or {}):
            return f"{entry.manager} {entry.operation} {entry.time}"
    return ""


def worker_side(args: argparse.Namespace) -> int:
    plan = json.loads(Path(args.plan).read_text())
    out = asyncio.run(cordon_storm(plan["kubeconfig"], plan["nodes"], plan["slots"], plan["pids"]))
    out["cpu_s"] = cpu_s(os.getpid())
    Path(args.out).write_text(json.dumps(out))
    return 0


# --- the harness ------------------------------------------------------------------------------


@dataclass
class Seen:
    """When a watch on Nodes first showed each target cordoned and tainted with its incident."""

    at: dict[str, float] = field(default_factory=dict)
    wrong: list[str] = field(default_factory=list)


def watch_nodes(core: Any, resource_version: str, targets: set[str], seen: Seen, stop: threading.Event) -> None:
    w = watch.Watch()  # type: ignore[no-untyped-call]
    rv = resource_version
    while not stop.is_set():  # to the end of the retry pass: a stray taint then is caught too
        try:
            for ev in w.stream(core.list_node, resource_version=rv, timeout_seconds=5):  # type: ignore[no-untyped-call]
                node = ev["object"]
                rv = node.metadata.resource_version
                name = node.metadata.name
                taints = [t for t in (node.spec.taints or []) if t.key == TAINT_KEY]
                if not taints or name in seen.at:
                    continue
                if name not in targets or any(t.value != label_safe(incident_of(name)) for t in taints):
                    seen.wrong.append(name)
                elif node.spec.unschedulable:
                    seen.at[name] = time.time()
                if stop.is_set():
                    break
        except ApiException as err:
            if err.status != 410:  # an expired resourceVersion: list again
                raise
            rv = list_version(core)


def list_version(core: Any) -> str:
    """Where a watch starts: the Node list's resourceVersion now."""
    return str(core.list_node(limit=1).metadata.resource_version)


def create_nodes(ks: KubeSandbox, count: int) -> float:
    core = ks.core()
    began = time.monotonic()

    def make(i: int) -> None:
        try:
            core.create_node(kwok_node(node_name(i), "h100"))
        except ApiException as err:
            if err.status != 409:
                raise

    with ThreadPoolExecutor(CREATE_THREADS) as pool:
        list(pool.map(make, range(count)))
    return time.monotonic() - began


def ready_count(core: Any) -> tuple[int, int]:
    """(Nodes, Ready Nodes)."""
    nodes = list(all_nodes(core))
    return len(nodes), sum(node_ready(n) for n in nodes)


def pid_of(ks: KubeSandbox, name: str) -> int:
    return int((ks.root / f"{name}.pid").read_text())


def self_check(core: Any, out: dict[str, Any], targets: list[str], seen: Seen) -> None:
    rows = out["rows"]
    check(not any(r["already_done"] for r in rows.values()), "a first cordon said it was already done")
    check(all(out["retried"].values()), "a retried cordon did not see its own incident's cordon")
    check(not seen.wrong, f"a Node tainted by another incident or outside the storm: {seen.wrong[:5]}")
    check(set(seen.at) == set(targets), f"the watch saw {len(seen.at)} of {len(targets)} Nodes cordoned")
    check(not out["rewritten"], f"a retried cordon wrote Nodes again: {out['rewritten'][:5]}")
    tainted = []
    for n in all_nodes(core):
        name = n.metadata.name
        ours = (n.metadata.annotations or {}).get(INCIDENT_ANNOTATION)
        if ours or n.spec.unschedulable:
            tainted.append(name)
            check(ours == incident_of(name), f"{name} carries incident {ours!r}")
    check(sorted(tainted) == sorted(targets), f"{len(tainted)} Nodes cordoned, {len(targets)} incidents")


def run(args: argparse.Namespace) -> Result:
    root = RUN / "bench-kube"
    os.environ["GPUHEAL_KWOK_LOG_LEVEL"] = "WARN"  # cluster.sh: not a line per lease renewal
    ks = KubeSandbox(root, port=PORT)
    if root.exists():
        ks.stop()
        shutil.rmtree(root)
    ks.start()
    try:
        core = ks.core()
        create_s = create_nodes(ks, args.nodes)
        began = time.monotonic()
        while True:
            counts = ready_count(core)
            check(counts[0] == args.nodes, f"the cluster holds {counts[0]} Nodes, not {args.nodes}")
            if counts[1] >= READY_SHARE * args.nodes:
                break
            waited = time.monotonic() - began
            check(waited < READY_TIMEOUT_S, f"{counts[1]} of {args.nodes} Nodes Ready after {waited:.0f} s")
            time.sleep(READY_POLL_S)
        ready_s, ready_at_start = time.monotonic() - began, counts[1]
        step = args.nodes // args.incidents
        targets = [node_name(i * step) for i in range(args.incidents)]
        plan = root / "plan.json"
        parts = ("apiserver", "etcd", "kwok")
        pids = {p: pid_of(ks, p) for p in parts}
        quiet = {p: cpu_s(pid) for p, pid in pids.items()}  # what 10,000 Nodes' leases cost alone
        time.sleep(QUIET_S)
        idle = {p: (cpu_s(pid) - quiet[p]) / QUIET_S for p, pid in pids.items()}
        how = {"kubeconfig": str(ks.worker_kubeconfig), "nodes": targets, "slots": args.slots, "pids": pids}
        plan.write_text(json.dumps(how))
        seen, stop = Seen(), threading.Event()
        rv = list_version(core)
        watcher = threading.Thread(target=watch_nodes, args=(ks.core(), rv, set(targets), seen, stop), daemon=True)
        watcher.start()
        out_file = root / "storm.json"
        cmd = [sys.executable, "-m", "bench.kube", "--worker-side", str(plan), "--out", str(out_file)]
        subprocess.run(cmd, check=True, cwd=REPO, timeout=1800)
        out = json.loads(out_file.read_text())
        deadline = time.monotonic() + 60
        while len(seen.at) < len(targets) and time.monotonic() < deadline:
            time.sleep(0.2)
        stop.set()
        ready_at_end = ready_count(core)[1]
        self_check(core, out, targets, seen)
        t0, rows = out["t0"], out["rows"]
        per = [(n, (rows[n]["ended"] - rows[n]["began"]) * 1000, (seen.at[n] - t0) * 1000) for n in sorted(targets)]
        return Result(
            nodes=args.nodes,
            incidents=args.incidents,
            slots=args.slots,
            create_s=create_s,
            ready_s=ready_s,
            ready=(ready_at_start, ready_at_end),
            storm_s=out["storm_s"],
            worker_mb=out["rss_mb"],
            worker_cpu_s=out["cpu_s"],
            memory_mb={p: peak_rss_mb(pid_of(ks, p)) for p in parts},
            cpu=out["cpu"],
            idle_cpu=idle,
            rows=per,
        )
    finally:
        ks.stop()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--incidents", type=int, default=1_000)
    ap.add_argument("--slots", type=int, default=100, help="activities one worker runs at once")
    ap.add_argument("--worker-side", dest="plan", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.plan:
        return worker_side(args)
    if not 0 < args.incidents <= args.nodes:
        ap.error("--incidents must be between 1 and --nodes")
    text = report(run(args))
    RESULTS.write_text(text)
    print(text.split("## Per incident")[0] + f"wrote {RESULTS} (with a row per incident)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
