"""The soak's world: the production topology on this machine, started and stopped as one.

One Temporal (the cluster on PostgreSQL with mTLS, or the dev server while developing) and two
gpuheal clusters on it, each its own Slurm release with its own two workers and its own webhook:
`east` on the host's Slurm 22.05, `west` on 26.05 with the Kubernetes sandbox. Training jobs on
most nodes, spares for replacements, a notice receiver that keeps what it was sent, and each
cluster's policy from a file (a realistic budget and breaker, not the tests' roomy one).

Every process runs under one root (ROOT/...), on the soak's own ports (infra.sandbox.stack.PORTS),
so a soak runs beside the tests, the benchmarks and the demo.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from gpuheal.core import envvars
from gpuheal.core.models.incident import JobRecoverySettings
from gpuheal.workflows.incident.jobs import ANSWER_MARGIN_S
from infra.sandbox import HOST_SLURM, NEWEST_SLURM, processes
from infra.sandbox.kube import KubeSandbox, binaries_built
from infra.sandbox.stack import PORTS, Sandbox
from infra.sandbox.temporal import TemporalKind

ACTIVE, SPARES = 12, 6  # nodes per cluster in service, and spares (Slurm's FUTURE) for replacements
IDLE = 2  # nodes left without a training job: room for a requeued job to start again
RACK = 4  # nodes per rack (the load's rack bursts)
STEP_S = 5.0  # a training job's step (its progress line in Slurm each step: 10 jobs a cluster)
WORKERS = 2  # worker processes per cluster
# Each cluster's policy, as its file says it (the chart's ConfigMap): a budget and a breaker that
# a rack or a false alarm trips, and the hold short enough that the soak sees every incident end.
POLICY = {
    # A node replaced waits for a person (the soak's operator approves most and aborts some).
    "approval": {"required_for": ["replace_node"], "timeout_s": 600, "default_on_timeout": "abort"},
    "budget": {"cluster": "3", "rate": 200, "node_cooldown_s": 0},
    "containment_limit": "2",
    # A rack at once trips it by its share (more than 3 of a rack's 4 within the window), a whole
    # cluster's false alarm by its count; no domain incidents (min_nodes past a rack's size): a
    # person looks at the tripped breaker instead.
    "breaker": {"max_incidents": 8, "window_s": 60, "domain_share": 0.75},
    "escalation": {"min_nodes": 99},
    "max_hold_s": 900,
    "duplicate_window_s": 600,
}
CAPACITY_WAIT_S = 900  # an incident with no spare tries this long (GPUHEAL_CAPACITY_WAIT_S)
STEPS_S = 600  # the rest of an incident's steps at most: drain, checkpoint, replace, burn-in
CLUSTERS = {"east": HOST_SLURM, "west": NEWEST_SLURM}
KUBE_CLUSTER = "west"
# The Kubernetes cluster's inference pool: a spare-less incident borrows one of its nodes, never
# taking its service below the floor (a PodDisruptionBudget keeps as many).
INFERENCE, INFERENCE_FLOOR = 4, 3
INFERENCE_NODES = tuple(f"inf{i:02d}" for i in range(1, INFERENCE + 1))
RACK_LABEL = "gpuheal.io/rack"  # west's racks, as Kubernetes labels them (gpuheal's default domain label)


def bound(policy: dict[str, object] = POLICY) -> int:
    """The most nodes gpuheal may hold drained in a soak cluster: its budget plus containment
    (both counts in POLICY, not shares)."""
    budget = policy["budget"]
    assert isinstance(budget, dict)
    return int(str(budget["cluster"])) + int(str(policy["containment_limit"]))


NODES = [f"gpu{i:02d}" for i in range(1, ACTIVE + 1)]  # each cluster's nodes in service at the start
RACKS = [NODES[i : i + RACK] for i in range(0, ACTIVE, RACK)]


def topology() -> str:
    """The racks as Slurm's topology.conf says them (a switch a rack, the spares under their own):
    the domains gpuheal reads from Slurm on a cluster without Kubernetes."""
    racks = [f"SwitchName=rack{i + 1} Nodes={','.join(r)}" for i, r in enumerate(RACKS)]
    spares = ",".join(f"gpu{i:02d}" for i in range(ACTIVE + 1, ACTIVE + SPARES + 1))
    switches = ",".join(f"rack{i + 1}" for i in range(len(RACKS)))
    return ";".join([*racks, f"SwitchName=spares Nodes={spares}", f"SwitchName=spine Switches={switches},spares"])


def incident_bound_s(policy: dict[str, object] = POLICY) -> float:
    """The longest an incident may stay open in a soak cluster, from its chain's start: its hold
    for a grant, its wait for a person's approval, its wait for a spare, its wait for its jobs to
    train again (verify_resume: gpuheal's own bound, the hour on 3ce428e waited 22 minutes), and
    its steps."""
    approval = policy["approval"]
    assert isinstance(approval, dict)
    waits = float(str(policy["max_hold_s"])) + float(approval["timeout_s"]) + CAPACITY_WAIT_S
    return waits + verify_wait_s() + STEPS_S


def verify_wait_s() -> float:
    """How long an incident's verify_resume waits for its jobs' answers, as gpuheal declares it
    (gpuheal.workflows.incident.jobs.verify_resume; the soak sets none of these)."""
    jobs = envvars.load(JobRecoverySettings, os.environ)
    return jobs.verify_timeout_s + jobs.gather_s + ANSWER_MARGIN_S


class Notices:
    """The notice receiver: keeps every notice it is sent (a JSON line each, with its
    Idempotency-Key) and, while told to, refuses them all with 503."""

    def __init__(self, path: Path, port: int) -> None:
        self.path, self.port, self.refusing_until = path, port, 0.0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                refused = time.time() < owner.refusing_until
                line = {"at": time.time(), "key": self.headers.get("Idempotency-Key", ""), "refused": refused}
                with owner.path.open("a") as f:
                    f.write(json.dumps({**line, "body": body.decode(errors="replace")}) + "\n")
                self.send_response(503 if refused else 200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/notices"

    def refuse_for(self, seconds: float) -> None:
        self.refusing_until = time.time() + seconds

    def stop(self) -> None:
        self._server.shutdown()


@dataclass
class Cluster:
    name: str
    sb: Sandbox  # its Slurm, and the environment its workers and webhook run with
    index: int  # its place in the world: its workers' and webhook's names and ports
    kube: KubeSandbox | None = None
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    webhook: subprocess.Popen[bytes] | None = None
    jobs: list[int] = field(default_factory=list)  # its training jobs (a whole node each, anywhere)

    @property
    def nodes(self) -> list[str]:
        return NODES

    @property
    def racks(self) -> list[list[str]]:
        return RACKS

    @property
    def webhook_port(self) -> int:
        return self.sb.webhook_port + self.index

    @property
    def webhook_url(self) -> str:
        return f"http://127.0.0.1:{self.webhook_port}/alertmanager"

    def worker_name(self, i: int) -> str:
        n = self.index * WORKERS + i
        return "worker" if n == 0 else f"worker-{n}"

    def start_worker(self, i: int, build: str = "") -> None:
        env = {**self.sb.env(), **({"GPUHEAL_BUILD_ID": build} if build else {})}
        port = self.sb.metrics_port + 10 * (self.index * WORKERS + i)
        argv = ["worker", "--metrics-port", str(port), "--sdk-metrics-port", str(port + 1)]
        proc = processes.spawn(self.sb.root, self.worker_name(i), argv, env)
        if i < len(self.workers):
            self.workers[i] = proc
        else:
            self.workers.append(proc)

    def start_webhook(self) -> None:
        name = "webhook" if self.index == 0 else f"webhook-{self.index}"
        proc = processes.spawn(self.sb.root, name, ["webhook", "--port", str(self.webhook_port)], self.sb.env())
        url = f"http://127.0.0.1:{self.webhook_port}/healthz"
        processes.wait_healthy(proc, name, url, self.sb.root / f"{name}.log")
        self.webhook = proc


class World:
    """Start everything (`start`), hand each part to the load, the faults and the operator, then
    stop everything (`stop`), whatever happened between."""

    def __init__(self, root: Path, temporal: TemporalKind = "cluster", ports: str = "soak") -> None:
        self.root, self.ports = root, ports
        root.mkdir(mode=0o711, parents=True, exist_ok=True)
        root.chmod(0o711)  # PostgreSQL runs as its own user and must pass through to its data
        self.notices = Notices(root / "notices.jsonl", PORTS[ports].webhook + 50)
        self.clusters = {
            name: Cluster(name, self._sandbox(name, version, temporal), i)
            for i, (name, version) in enumerate(CLUSTERS.items())
        }

    def _sandbox(self, name: str, version: str, temporal: TemporalKind) -> Sandbox:
        policy = self.root / f"policy-{name}.yaml"
        policy.write_text(yaml.safe_dump(POLICY, sort_keys=True))
        env = {
            "GPUHEAL_SLURM_ACTIVE": str(ACTIVE),
            "GPUHEAL_SLURM_SPARES": str(SPARES),
            "GPUHEAL_POLICY_FILE": str(policy),
            "GPUHEAL_NOTIFY_URL": self.notices.url,
            "GPUHEAL_OWNER_ROUTES": json.dumps({"*": self.notices.url}),
            "GPUHEAL_CHECKPOINT_GRACE_S": "10",
            "GPUHEAL_CAPACITY_WAIT_S": str(CAPACITY_WAIT_S),
            # slurmctld logs its local time, which the checker reads as UTC (records.log_clock_skew).
            "TZ": "UTC",
        }
        if name != KUBE_CLUSTER:
            env["GPUHEAL_SLURM_TOPOLOGY"] = topology()
        if name == KUBE_CLUSTER:
            env |= {
                "GPUHEAL_SLURM_INFERENCE": str(INFERENCE),
                "GPUHEAL_BORROW_POOL": "inference",
                "GPUHEAL_BORROW_FLOOR": str(INFERENCE_FLOOR),
            }
        sb = Sandbox.named(self.ports, self.root, temporal_kind=temporal, cluster=name, task_queue=f"gpuheal-{name}")
        sb.use_slurm(version)
        sb.extra_env.update(env)
        return sb

    @property
    def temporal(self) -> Sandbox:
        """The sandbox whose Temporal the clusters share (the first's: they share its root)."""
        return next(iter(self.clusters.values())).sb

    def start(self) -> None:
        self.stop()
        for record in ("acts.jsonl", "samples.jsonl", "notices.jsonl", "records.json", "verdicts.json", "soak.md"):
            (self.root / record).unlink(missing_ok=True)  # a soak's records are its own
        self.temporal.start_temporal(fresh=True)
        for c in self.clusters.values():
            c.sb.start_slurm(clean=True)
            if c.name == KUBE_CLUSTER and binaries_built():
                c.kube = KubeSandbox(self.root / "k8s", port=PORTS[self.ports].kube)
                c.kube.start()
                c.kube.reset_nodes(c.nodes)
                for i, rack in enumerate(c.racks):
                    for node in rack:
                        c.kube.label(node, {RACK_LABEL: f"rack{i + 1}"})
                c.kube.serve_inference(list(INFERENCE_NODES), INFERENCE_FLOOR)
                c.sb.extra_env.update(
                    {
                        "GPUHEAL_KUBECONFIG": str(c.kube.worker_kubeconfig),
                        "GPUHEAL_SANDBOX_KUBECONFIG": str(c.kube.admin_kubeconfig),
                    }
                )
            for i in range(WORKERS):
                c.start_worker(i)
            c.start_webhook()
            # A whole node each, on no node in particular: a requeued job starts again where Slurm
            # finds room (an idle node, a spare), as a real training job would.
            for i in range(ACTIVE - IDLE):
                c.jobs.append(c.sb.submit_training(name=f"train-{i}", step_s=STEP_S, sbatch_args=("--exclusive",)))

    def stop(self) -> None:
        """Everything this root runs, stopped (also what an interrupted soak left): each step
        on its own, so one that fails leaves none of the others running."""
        steps: list[tuple[str, Callable[[], object]]] = []
        for c in self.clusters.values():
            workers = ["worker" if n == 0 else f"worker-{n}" for n in range(len(self.clusters) * WORKERS)]
            webhooks = ["webhook" if n == 0 else f"webhook-{n}" for n in range(len(self.clusters))]
            steps += [(f"{c.name} {name}", partial(c.sb.stop_recorded, name)) for name in workers + webhooks]
            # A soak killed during its slurmctld fault left the daemon stopped (SIGSTOP): wake it first.
            steps.append((f"{c.name} slurmctld woken", partial(continue_slurmctld, c)))
            steps.append((f"{c.name} Slurm", c.sb.stop_slurm))
        if (self.root / "k8s").exists():
            steps.append(("the Kubernetes sandbox", KubeSandbox(self.root / "k8s", port=PORTS[self.ports].kube).stop))
        steps.append(("Temporal", self.temporal.stop_temporal))
        for what, step in steps:
            try:
                step()
            except Exception as err:
                print(f"soak: stopping {what} failed: {err}", flush=True)


def slurmctld_pid(c: Cluster) -> int | None:
    path = c.sb.slurm_dir / "run" / "slurmctld.pid"
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def continue_slurmctld(c: Cluster) -> None:
    if (pid := slurmctld_pid(c)) is not None:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
