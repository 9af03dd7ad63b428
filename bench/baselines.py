"""Slurm left to itself after a GPU failure: two models, measured on real daemons.

(a) `slurmd_lost`: the node's slurmd dies with the GPU. Slurm marks the node DOWN after
    SlurmdTimeout (300 s, a stock slurm.conf), requeues the job (JobRequeue=1), which then waits
    for its begin time and restarts on another node from its checkpoint. This is the kindest
    case for Slurm: a real XID 79 leaves slurmd running.
(b) `healthcheck_drain`: what a real XID 79 leaves. slurmd keeps running; a site
    HealthCheckProgram (an NHC-style check, every HealthCheckInterval = 60 s) drains the node
    when it sees the GPU gone. Nobody requeues the job: it hangs (no steps) until its own time
    limit, ends TIMEOUT, and Slurm does not requeue a TIMEOUT. It is back only when a person
    resubmits it: that time is not measured here (a page's response is minutes to hours).

Each run has its own Slurm sandbox (directory, ports, job), so runs go side by side and no
figure can belong to another run; every run checks that what it measured happened to its own
job on its own node after its own injection (bench.common.check).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import check
from infra.sandbox import SLURM_SCRIPT
from infra.sandbox.stack import Sandbox

BASE_PORT = 30017  # run k's slurmctld on BASE_PORT + 300 k: below the ephemeral range, clear of PORTS
NHC_REASON = "NHC: GPU fell off the bus (XID 79)"
STEP_AT_FAILURE = 12  # the job checkpoints every 10 steps: it has one at step 10


@dataclass
class BaselineRun:
    model: str  # "slurmd_lost" (a) or "healthcheck_drain" (b)
    sandbox: str
    job: int
    node: str
    injected_at: float  # unix time of this run's injection
    out_of_service_s: float | None = None  # failure -> node DOWN (a) or DRAINED (b)
    job_ended_s: float | None = None  # (b) failure -> the hung job ended (its time limit)
    end_state: str = ""
    back_s: float | None = None  # failure -> training past its checkpoint again; None: never
    restarted_on: str = ""


def sandbox_for(run_root: Path, k: int, extra_env: dict[str, str]) -> Sandbox:
    return Sandbox(run_root / f"baseline-{k}", slurm_base_port=BASE_PORT + 300 * k, extra_env=extra_env)


def job_fields(sb: Sandbox, job: int) -> dict[str, str]:
    """`scontrol show job` as fields (it still knows an ended job, MinJobAge=3600)."""
    out = sb.slurm("scontrol", "-o", "show", "job", str(job), check=False)
    return dict(re.findall(r"(\w+)=(\S*)", out))


def node_state(sb: Sandbox, node: str) -> tuple[str, str]:
    fields = dict(re.findall(r"(\w+)=(\S*)", sb.slurm("scontrol", "-o", "show", "node", node)))
    reason = sb.slurm("sinfo", "-h", "-n", node, "-o", "%E", check=False).strip()
    return fields.get("State", ""), reason


def _start(sb: Sandbox, name: str, time_limit: str | None) -> tuple[int, str]:
    sb.start_slurm(clean=True)
    args = (f"--time={time_limit}",) if time_limit else ()
    job = sb.submit_training(name, sbatch_args=args)
    return job, sb.wait_for_step(job, STEP_AT_FAILURE, timeout=120)


def slurmd_lost(run_root: Path, k: int, slurmd_timeout: int) -> BaselineRun:
    """(a): kill the node's slurmd at the failure and wait for Slurm to bring the job back."""
    sb = sandbox_for(run_root, k, {"GPUHEAL_SLURMD_TIMEOUT": str(slurmd_timeout)})
    try:
        job, node = _start(sb, f"baseline-a{k}", None)
        before = sb.job_progress(job)
        check(before is not None and before.checkpoint_step >= 10, f"job {job} has no checkpoint before the failure")
        assert before is not None
        run = BaselineRun("slurmd_lost", sb.root.name, job, node, time.time())
        t0 = time.monotonic()
        sb.inject_gpu_fault(node)
        sb.run(SLURM_SCRIPT, "stop-node", node)
        while time.monotonic() - t0 < slurmd_timeout + 900:
            waited = time.monotonic() - t0
            state, _ = node_state(sb, node)
            if run.out_of_service_s is None and state.startswith("DOWN"):
                run.out_of_service_s = waited
            j, p = sb.job(job), sb.job_progress(job)
            if j and p and j.state == "RUNNING" and j.restart_count >= 1 and p.restart >= 1:
                if p.step > before.checkpoint_step:
                    run.back_s, run.restarted_on, run.end_state = waited, j.nodes, "RUNNING"
                    break
            time.sleep(1)
        check(run.back_s is not None, f"{sb.root.name}: job {job} never came back past its checkpoint")
        check(run.restarted_on != node, f"{sb.root.name}: job {job} restarted on the node that failed")
        check(run.out_of_service_s is not None, f"{sb.root.name}: {node} never went DOWN, yet the job moved")
        return run
    finally:
        sb.stop_slurm()


def write_healthcheck(sb: Sandbox) -> Path:
    """The site's health check: drain a node whose GPU is gone, nothing else (what NHC's
    nvidia-smi check does). Slurm runs it with a bare environment, so paths are written in."""
    script = sb.root / "nhc.sh"
    script.write_text(
        "#!/bin/sh\n"
        f'[ -e "{sb.fault_dir}/$SLURMD_NODENAME" ] || exit 0\n'
        f'SLURM_CONF={sb.slurm_conf} exec scontrol update nodename="$SLURMD_NODENAME" state=drain '
        f'reason="{NHC_REASON}"\n'
    )
    script.chmod(0o755)
    return script


def healthcheck_drain(run_root: Path, k: int, interval_s: int, time_limit_min: int, watch_s: int) -> BaselineRun:
    """(b): slurmd stays up, the health check drains, the job hangs to its time limit."""
    root = run_root / f"baseline-{k}"
    root.mkdir(parents=True, exist_ok=True)
    env = {
        "GPUHEAL_SLURM_HEALTHCHECK": str(root / "nhc.sh"),
        "GPUHEAL_SLURM_HEALTHCHECK_INTERVAL": str(interval_s),
    }
    sb = sandbox_for(run_root, k, env)
    write_healthcheck(sb)
    try:
        job, node = _start(sb, f"baseline-b{k}", str(time_limit_min))
        run = BaselineRun("healthcheck_drain", sb.root.name, job, node, time.time())
        t0 = time.monotonic()
        sb.inject_gpu_fault(node)
        step = job_fields(sb, job).get("step")  # its progress line (Comment=gpuheal step=N ...)
        limit = time_limit_min * 60 + 300
        while time.monotonic() - t0 < limit:
            waited = time.monotonic() - t0
            state, reason = node_state(sb, node)
            if run.out_of_service_s is None and "DRAIN" in state and reason == NHC_REASON:
                run.out_of_service_s = waited
            fields = job_fields(sb, job)
            if run.job_ended_s is None and fields.get("JobState") not in {"RUNNING", "PENDING", "COMPLETING"}:
                run.job_ended_s, run.end_state = waited, fields.get("JobState", "gone")
            if run.job_ended_s is not None and waited - run.job_ended_s >= watch_s:
                break
            time.sleep(0.5)
        fields = job_fields(sb, job)
        check(run.out_of_service_s is not None, f"{sb.root.name}: the health check never drained {node}")
        check(run.job_ended_s is not None, f"{sb.root.name}: job {job} still hung at its time limit + 5 min")
        check(run.end_state == "TIMEOUT", f"{sb.root.name}: job {job} ended {run.end_state}, not at its time limit")
        # The step in flight at the injection may still land; none after it (the job is hung).
        after = fields.get("step", "")
        check(
            step is not None and after.isdigit() and step.isdigit() and int(after) <= int(step) + 1,
            f"{sb.root.name}: job {job} went on from step {step} to {after} after the fault: not hung",
        )
        # Never back by itself: still ended, not requeued, `watch_s` after it ended.
        check(
            fields.get("JobState") == run.end_state and fields.get("Restarts", "0") == "0",
            f"{sb.root.name}: job {job} came back ({fields.get('JobState')}, restarts {fields.get('Restarts')})",
        )
        return run
    finally:
        sb.stop_slurm()
