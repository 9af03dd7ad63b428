"""The local stack: Temporal dev server, Slurm cluster, worker and webhook as real processes.

Used by the demo, the benchmarks and the integration tests, so all of them run the same stack the
same way: `Sandbox.named("tests", root)` and friends. Each use has its own run directory and
ports (PORTS), so a test run, a benchmark and a demo can coexist. The worker's and webhook's
processes (pid files, `make stop`) are handled in processes.py, Slurm's jobs and burn-in in slurm.py.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuheal.clients.slurm.parsers import parse_jobs, parse_nodes
from gpuheal.core.models.slurm import JobProgress, JobSnapshot, NodeInfo
from gpuheal.triggers.alertmanager import firing_payload
from infra.sandbox import HOST_SLURM, REPO, SLURM_ROOTS_SCRIPT, SLURM_SCRIPT, SLURM_VERSIONS, TRAIN_JOB, processes
from infra.sandbox.processes import BIN, SandboxError
from infra.sandbox.slurm import progress_bar, root_path, sbatch_argv, write_burn_in
from infra.sandbox.temporal import DIRS, TemporalKind, TemporalSandbox


@dataclass(frozen=True)
class Ports:
    temporal: int
    slurm: int
    webhook: int
    metrics: int
    kube: int  # the Kubernetes sandbox's apiserver; its etcd on +1 and +2


# One set of ports per use, so they can run side by side (the UI is on temporal + 1000; Slurm
# takes slurm + 0..106, newer releases 200 and 400 lower). All below Linux's ephemeral range
# (32768+), where a client socket could hold a port a daemon is about to bind.
PORTS = {
    "demo": Ports(temporal=7233, slurm=16817, webhook=8088, metrics=9464, kube=16443),
    "tests": Ports(temporal=27233, slurm=26817, webhook=28088, metrics=29464, kube=26443),
    "bench": Ports(temporal=21233, slurm=21817, webhook=22088, metrics=22464, kube=22943),
    "detect": Ports(temporal=23233, slurm=23817, webhook=24088, metrics=24464, kube=24943),
    # The production tests' Temporal cluster: PORT..+40 and membership PORT-300..-297.
    "production": Ports(temporal=19233, slurm=19817, webhook=20088, metrics=20464, kube=20443),
    # The chaos soak (infra/soak): its Temporal cluster as production's; its clusters' webhooks
    # on webhook + 0, 1, its notice receiver on webhook + 50; its workers' metrics on metrics + 0..31.
    "soak": Ports(temporal=12233, slurm=14817, webhook=15088, metrics=15464, kube=15943),
    # A second soak beside `make test`'s five minutes (the hour on record, run beside the suite).
    "soak-long": Ports(temporal=10233, slurm=13817, webhook=11588, metrics=11664, kube=11943),
}


@dataclass
class Sandbox:
    root: Path
    temporal_port: int = 7233
    slurm_base_port: int = 16817
    webhook_port: int = 8088
    metrics_port: int = 9464
    cluster: str = "sandbox"
    task_queue: str = "gpuheal"
    extra_env: dict[str, str] = field(default_factory=dict)
    # Which Slurm the sandbox runs (HOST_SLURM or a root of infra/slurm/roots.sh), and how the
    # worker talks to it: "cli" (Slurm's commands) or "rest" (slurmrestd with a JWT, roots only).
    slurm_version: str = HOST_SLURM
    slurm_backend: str = "cli"
    temporal_kind: TemporalKind = "dev"  # or "cluster": infra/sandbox/temporal.py

    @classmethod
    def named(cls, use: str, root: Path, **kw: object) -> Sandbox:
        """The sandbox for one use (demo, tests, bench, detect), on that use's ports."""
        p = PORTS[use]
        return cls(
            root,
            temporal_port=p.temporal,
            slurm_base_port=p.slurm,
            webhook_port=p.webhook,
            metrics_port=p.metrics,
            **kw,  # type: ignore[arg-type]
        )

    def __post_init__(self) -> None:
        self.root = self.root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        token_file = self.root / "webhook.token"
        if not token_file.exists():
            token_file.write_text(secrets.token_urlsafe(24))
            token_file.chmod(0o600)
        self.webhook_token = token_file.read_text().strip()

    # --- paths and environment -----------------------------------------------------------

    def use_slurm(self, version: str, backend: str = "cli") -> None:
        """Switch the sandbox to another Slurm (each version has its own directory and ports)."""
        if backend == "rest" and version == HOST_SLURM:
            raise SandboxError("the REST backend needs Slurm 24.11+ (22.05's slurmrestd cannot update nodes)")
        self.slurm_version, self.slurm_backend = version, backend

    @property
    def slurm_root(self) -> Path | None:
        """The Debian root this version runs in (None: the host's Slurm)."""
        return None if self.slurm_version == HOST_SLURM else root_path(self.slurm_version)

    @property
    def slurm_port(self) -> int:
        """slurmctld's port: the base for the host's Slurm, 200 lower per newer release."""
        index = SLURM_VERSIONS.index(self.slurm_version)
        return self.slurm_base_port - 200 * index

    @property
    def slurm_dir(self) -> Path:
        return self.root / ("slurm" if self.slurm_version == HOST_SLURM else f"slurm-{self.slurm_version}")

    @property
    def slurm_conf(self) -> Path:
        return self.slurm_dir / "slurm.conf"

    @property
    def fault_dir(self) -> Path:
        return self.slurm_dir / "faults"

    @property
    def temporal(self) -> TemporalSandbox:
        return TemporalSandbox(self.temporal_kind, self.root / DIRS[self.temporal_kind], self.temporal_port)

    @property
    def temporal_address(self) -> str:
        return self.temporal.address

    @property
    def ui_url(self) -> str | None:
        return self.temporal.ui_url

    @property
    def webhook_url(self) -> str:
        return f"http://127.0.0.1:{self.webhook_port}/alertmanager"

    def slurm_env(self) -> dict[str, str]:
        """What the worker needs to reach this sandbox's Slurm, by CLI or by REST."""
        env = {"SLURM_CONF": str(self.slurm_conf), "GPUHEAL_SLURM_BACKEND": self.slurm_backend}
        root = self.slurm_root
        if root is not None:
            env["GPUHEAL_SLURM_ROOT"] = str(root)
            env["GPUHEAL_SLURM_CLI_WRAPPER"] = (
                f"chroot {root} /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "
                f"SLURM_CONF={self.slurm_conf}"
            )
        if self.slurm_backend == "rest":
            env["GPUHEAL_SLURM_REST_URL"] = f"http://127.0.0.1:{self.slurm_port + 3}"
            env["GPUHEAL_SLURM_REST_USER"] = "root"
            env["GPUHEAL_SLURM_REST_TOKEN_FILE"] = str(self.slurm_dir / "rest.token")
        return env

    def env(self) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("GPUHEAL_SLURM_")}
        return {
            **base,
            **self.slurm_env(),
            "GPUHEAL_SLURM_DIR": str(self.slurm_dir),
            "GPUHEAL_SLURM_PORT": str(self.slurm_port),
            "GPUHEAL_SLURM_CLUSTER": self.cluster,
            "GPUHEAL_CLUSTER": self.cluster,
            **self.temporal.env(),
            "GPUHEAL_TASK_QUEUE": self.task_queue,
            "GPUHEAL_PROVIDER": "sandbox",
            "GPUHEAL_SANDBOX_SCRIPT": str(SLURM_SCRIPT),
            "GPUHEAL_WEBHOOK_TOKEN": self.webhook_token,
            "TEMPORAL_BIN": str(BIN / "temporal"),
            "GPUHEAL_PYTHON": sys.executable,
            **self.extra_env,
        }

    def run(self, *argv: str | Path, check: bool = True, timeout: float = 60) -> str:
        proc = subprocess.run([str(a) for a in argv], env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise SandboxError(f"{' '.join(map(str, argv))} failed: {proc.stderr.strip()}")
        return proc.stdout

    # --- services ------------------------------------------------------------------------

    def start_slurm(self, clean: bool = True) -> None:
        if self.slurm_version != HOST_SLURM:
            self.run(SLURM_ROOTS_SCRIPT, "build", self.slurm_version, timeout=900)  # once, then reused
        self.run(SLURM_SCRIPT, "start", *(["--clean"] if clean else []), timeout=180)
        self.fault_dir.mkdir(parents=True, exist_ok=True)
        write_burn_in(self.validate_job, self.fault_dir)
        if self.slurm_backend == "rest":
            self.run(SLURM_SCRIPT, "start-rest")
            self.run(SLURM_SCRIPT, "token")

    def slurm(self, *argv: str, check: bool = True) -> str:
        """A Slurm command of this sandbox's version (inside its root when it has one)."""
        return self.run(SLURM_SCRIPT, "run", *argv, check=check)

    def start_temporal(self, fresh: bool = False) -> None:
        """Temporal of this sandbox's kind; `fresh`: new databases (nothing an earlier run left
        carries over). The cluster's first start builds the server (minutes, then cached)."""
        self.run(self.temporal.script, "start", *(["--fresh"] if fresh else []), timeout=1200)

    def stop_temporal(self) -> None:
        self.run(self.temporal.script, "stop", check=False)

    def restart_temporal_server(self) -> None:
        """The cluster's server process stopped (SIGTERM) and started again on its databases."""
        self._cluster_only("restart-server")

    def restart_postgres(self) -> None:
        """The cluster's PostgreSQL stopped (fast shutdown: connections cut) and started again."""
        self._cluster_only("restart-postgres")

    def _cluster_only(self, verb: str) -> None:
        if self.temporal_kind != "cluster":
            raise SandboxError(f"{verb}: the dev server has no separate database or services")
        self.run(self.temporal.script, verb, timeout=120)

    def stop_slurm(self) -> None:
        self.run(SLURM_SCRIPT, "stop", check=False)

    def stop_recorded(self, name: str, sig: int = signal.SIGTERM) -> str:
        """Stop the `name` process (worker, webhook) this sandbox recorded, if it is still ours,
        and forget its pid file. Says what it did."""
        return processes.stop_recorded(self.root, name, sig)

    def start_worker(self, index: int = 0, serves: str = "all") -> subprocess.Popen[bytes]:
        """The worker (`index` > 0: one more on the same task queue, its own log and ports),
        serving `serves` (GPUHEAL_WORKER_SERVES)."""
        port = self.metrics_port + 10 * index
        name = "worker" if index == 0 else f"worker-{index}"
        argv = ["worker", "--metrics-port", str(port), "--sdk-metrics-port", str(port + 1)]
        env = self.env() if serves == "all" else {**self.env(), "GPUHEAL_WORKER_SERVES": serves}
        return processes.spawn(self.root, name, argv, env)

    def start_webhook(self) -> subprocess.Popen[bytes]:
        proc = processes.spawn(self.root, "webhook", ["webhook", "--port", str(self.webhook_port)], self.env())
        url = f"http://127.0.0.1:{self.webhook_port}/healthz"
        processes.wait_healthy(proc, "webhook", url, self.root / "webhook.log")
        return proc

    stop_process = staticmethod(processes.stop_process)

    # --- Slurm helpers for scenarios -----------------------------------------------------

    def submit_training(
        self,
        name: str = "train",
        requeue: bool = True,
        step_s: float = 0.5,
        ckpt_every: int = 10,
        nodelist: str | None = None,
        nodes: int = 1,
        env: dict[str, str] | None = None,
        checkpoint: Path | None = None,
        sbatch_args: tuple[str, ...] = (),
    ) -> int:
        """The example training job (infra/slurm/jobs/train.py): it traps SIGUSR1 and says so.
        `checkpoint`: its checkpoint file (default: a fresh one; an existing one resumes it).
        `sbatch_args`: more of sbatch's options (`--mail-user=...`, `--account=...`)."""
        ckpt = checkpoint or self.slurm_dir / "jobs" / f"{name}-{time.time_ns()}.ckpt.json"
        exports = {
            "TRAIN_CKPT": str(ckpt),
            "TRAIN_STEP_S": str(step_s),
            "TRAIN_CKPT_EVERY": str(ckpt_every),
            "GPUHEAL_FAULT_DIR": str(self.fault_dir),
            "PYTHONPATH": str(REPO),
            **(env or {}),
        }
        python = sys.executable if self.slurm_root is None else "python3"  # the root's own python3
        return self._sbatch(name, f"exec {python} {TRAIN_JOB}", exports, requeue, nodelist, nodes, extra=sbatch_args)

    def submit_script(
        self, name: str, script: str, nodelist: str | None = None, exclusive: bool = False, requeue: bool = True
    ) -> int:
        """A plain batch script (e.g. `sleep 600`): no progress line, no signal trapped."""
        return self._sbatch(name, script, {}, requeue, nodelist, 1, exclusive)

    def _sbatch(
        self,
        name: str,
        wrap: str,
        exports: dict[str, str],
        requeue: bool,
        nodelist: str | None,
        nodes: int,
        exclusive: bool = False,
        extra: tuple[str, ...] = (),
    ) -> int:
        jobs = self.slurm_dir / "jobs"  # inside the sandbox's directory: seen from its root too
        jobs.mkdir(parents=True, exist_ok=True)
        argv = sbatch_argv(name, wrap, exports, jobs, requeue, nodelist, nodes, exclusive, extra)
        return int(self.slurm(*argv).strip().split(";")[0])

    def spares_out_of_stock(self, out: bool = True) -> None:
        """The sandbox's cloud has no spare node to give (or has again)."""
        stock = self.slurm_dir / "provider" / "out-of-stock"
        stock.parent.mkdir(parents=True, exist_ok=True)
        if out:
            stock.write_text("*\n")
        else:
            stock.unlink(missing_ok=True)

    def job(self, job_id: int) -> JobSnapshot | None:
        """What Slurm says of the job, read by the product's own parser."""
        return next((j for j in parse_jobs(json.loads(self.slurm("squeue", "--json"))) if j.job_id == job_id), None)

    def nodes(self) -> dict[str, NodeInfo]:
        """Nodes in service, as the product's parser reads `sinfo --json`."""
        return parse_nodes(json.loads(self.slurm("sinfo", "--json")))

    def job_progress(self, job_id: int) -> JobProgress | None:
        job = self.job(job_id)
        return job.progress if job else None

    def wait_for_step(self, job_id: int, step: int, timeout: float = 60, show: bool = False) -> str:
        """Wait until the job has passed `step`; returns the node it runs on."""
        deadline = time.monotonic() + timeout
        shown = -1
        while time.monotonic() < deadline:
            j = self.job(job_id)
            p = j.progress if j else None
            done = min(step, p.step if p else 0)
            if show and done != shown:
                print(progress_bar(job_id, done, step), end="", flush=True)
                shown = done
            if j and p and p.step >= step and j.state == "RUNNING":
                if show:
                    print()
                return j.nodes
            time.sleep(0.3)
        raise SandboxError(f"job {job_id} did not reach step {step} within {timeout:.0f} s")

    @property
    def validate_job(self) -> Path:
        """The sandbox's burn-in script (GPUHEAL_VALIDATE_JOB): its "GPU" fails while a fault is
        marked, the one a repair clears or a lasting one (inject_lasting_fault)."""
        return self.slurm_dir / "burn-in.sh"

    def inject_lasting_fault(self, node: str) -> None:
        """A GPU no reset or reboot mends (an HBM with remapping exhausted): jobs stop, and the
        burn-in fails after any repair."""
        self.inject_gpu_fault(node)
        (self.fault_dir / f"{node}.lasting").touch()

    def inject_gpu_fault(self, node: str) -> None:
        """The sandbox's stand-in for a GPU falling off the bus: jobs on the node stop stepping."""
        self.fault_dir.mkdir(parents=True, exist_ok=True)
        (self.fault_dir / node).touch()

    def alertmanager_payload(self, node: str, xid: int, gpu: int = 0, cluster: str | None = None) -> dict[str, Any]:
        return firing_payload(
            node, xid=xid, gpu=str(gpu), cluster=cluster or self.cluster, summary=f"XID {xid} on {node} GPU {gpu}"
        )

    def post_alert(self, payload: dict[str, object] | bytes, token: str | None = None) -> tuple[int, dict[str, object]]:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        req = urllib.request.Request(
            self.webhook_url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {self.webhook_token if token is None else token}",
            },
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                return err.code, json.loads(raw or b"{}")
            except json.JSONDecodeError:
                return err.code, {"error": raw.decode(errors="replace")}


if __name__ == "__main__":  # `make stop`: python -m infra.sandbox.stack stop RUN_DIR
    processes.main(sys.argv[1:])
