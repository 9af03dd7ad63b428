"""MTTR benchmark: gpuheal against Slurm left to itself, side by side, on the local sandbox.

    python bench/mttr.py [--runs 5] [--baseline-runs 1] [--slurmd-timeout 300]

gpuheal: the demo scenario N times (a checkpointing job, XID 79 on its node, alert through the
webhook); MTTR is the workflow's own figure (failure observed -> the job seen past its
pre-failure checkpoint on another node), with the per-stage breakdown.

The physical floor, side by side (paired with each gpuheal run): the same job restarted from its
checkpoint on an idle node with no failure at all (submit -> first step past the checkpoint),
plus the time the job took to checkpoint when asked. gpuheal's overhead = MTTR - floor -
checkpoint time: what gpuheal itself adds to what the job needs to checkpoint and restart.

Baseline: the same job, the node's slurmd killed at the failure; Slurm marks the node DOWN after
SlurmdTimeout (300 s by default, as in a stock slurm.conf), requeues the job, which then waits
for its begin time. Measured from the kill until the job's comment shows it past its checkpoint
after the restart.

Writes a Markdown report to bench/results/mttr.md. Figures, not assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from datetime import UTC, datetime

from temporalio.client import Client

from gpuheal.clients.temporal import connect
from gpuheal.core import ids
from gpuheal.core.models import RemediationResult
from gpuheal.core.settings import Settings
from gpuheal.workflows.remediation import GpuRemediationWorkflow
from infra.sandbox import REPO, RUN, SLURM_SCRIPT
from infra.sandbox.demo import follow
from infra.sandbox.stack import Sandbox

RESULTS = REPO / "bench" / "results" / "mttr.md"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def row(name: str, v: list[float]) -> str:
    return (
        f"| {name} | {len(v)} | {statistics.median(v):.2f} s | {pct(v, 0.95):.2f} s | {min(v):.2f} s | {max(v):.2f} s |"
    )


def floor_run(sb: Sandbox) -> float:
    """Submit -> the job's first step past its checkpoint, restarting from a checkpoint on an
    idle node, with nothing failed: what a restart costs the job itself."""
    sb.start_slurm(clean=True)
    ckpt = sb.slurm_dir / "jobs" / "floor.ckpt.json"
    warm = sb.submit_training("floor-warm", checkpoint=ckpt)
    sb.wait_for_step(warm, 12)  # a checkpoint at step 10 on disk
    sb.slurm("scancel", str(warm))
    t0 = time.monotonic()
    job = sb.submit_training("floor", checkpoint=ckpt)
    while True:
        p = sb.job_progress(job)
        if p is not None and p.step > p.checkpoint_step > 0:
            return time.monotonic() - t0
        if time.monotonic() - t0 > 120:
            raise TimeoutError("the floor job never stepped past its checkpoint")
        time.sleep(0.05)


async def gpuheal_run(sb: Sandbox, client: Client) -> RemediationResult:
    sb.start_slurm(clean=True)
    job = sb.submit_training("bench")
    node = sb.wait_for_step(job, 12)
    sb.inject_gpu_fault(node)
    status, body = sb.post_alert(sb.alertmanager_payload(node, 79))
    assert status == 200, body
    handle = client.get_workflow_handle_for(GpuRemediationWorkflow.run, ids.incident_id(sb.cluster, node))
    result = await asyncio.wait_for(follow(handle, echo=False), 300)
    resumed = [r for r in result.jobs_resumed if r.job_id == job]
    assert resumed and node not in resumed[0].node, result
    return result


def baseline_run(sb: Sandbox, slurmd_timeout: int) -> float:
    sb.extra_env["GPUHEAL_SLURMD_TIMEOUT"] = str(slurmd_timeout)
    try:
        sb.start_slurm(clean=True)
        job = sb.submit_training("baseline")
        node = sb.wait_for_step(job, 12)
        before = sb.job_progress(job)
        assert before is not None
        t0 = time.monotonic()
        sb.inject_gpu_fault(node)
        sb.run(SLURM_SCRIPT, "stop-node", node)
        last = -1.0
        while True:
            j = sb.job(job)
            p = sb.job_progress(job)
            waited = time.monotonic() - t0
            if j and p and j.restart_count >= 1 and p.restart >= 1 and p.step > before.checkpoint_step:
                print(f"\r  baseline: job back past its checkpoint after {waited:.0f} s" + " " * 20, flush=True)
                return waited
            if waited - last >= 5:
                state = f"{j.state} ({j.state_reason})" if j else "gone"
                print(f"\r  baseline: {waited:4.0f} s, job {state}" + " " * 10, end="", flush=True)
                last = waited
            if waited > slurmd_timeout + 900:
                raise TimeoutError("baseline job never came back")
            time.sleep(1)
    finally:
        sb.extra_env.pop("GPUHEAL_SLURMD_TIMEOUT", None)


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--baseline-runs", type=int, default=1)
    ap.add_argument("--slurmd-timeout", type=int, default=300)
    args = ap.parse_args()

    sb = Sandbox.named("bench", RUN / "bench", extra_env={"GPUHEAL_CHECKPOINT_GRACE_S": "30"})
    sb.start_slurm(clean=True)
    sb.stop_temporal()  # incidents left by an earlier run (maybe of older code) must not join this one
    sb.start_temporal(fresh=True)
    client = await connect(Settings.from_env(sb.env()).temporal)
    worker, webhook = sb.start_worker(), sb.start_webhook()
    results: list[RemediationResult] = []
    floors: list[float] = []
    try:
        for i in range(args.runs):
            floors.append(floor_run(sb))
            r = await gpuheal_run(sb, client)
            results.append(r)
            print(f"  run {i + 1}/{args.runs}: MTTR {r.mttr_s:.1f} s, floor {floors[-1]:.1f} s", flush=True)
    finally:
        Sandbox.stop_process(webhook)
        Sandbox.stop_process(worker)
    baselines = [baseline_run(sb, args.slurmd_timeout) for _ in range(args.baseline_runs)]
    sb.stop_slurm()
    sb.stop_temporal()

    mttrs = [r.mttr_s for r in results if r.mttr_s is not None]
    ckpts = [
        max((a.checkpoint.after_s for a in r.jobs if a.checkpoint and a.checkpoint.confirmed), default=0.0)
        for r in results
    ]
    overheads = [m - f - c for m, f, c in zip(mttrs, floors, ckpts, strict=True)]
    stages: dict[str, list[float]] = {}
    for r in results:
        for st in r.stages:
            if st.duration_s is not None:
                stages.setdefault(st.stage.value, []).append(st.duration_s)
    base_med = statistics.median(baselines)
    lines = [
        f"# MTTR benchmark ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)",
        "",
        f"Machine: {sys.platform}, sandbox on loopback. Checkpoint grace 30 s (a confirmed checkpoint ends it). "
        f"Baseline SlurmdTimeout {args.slurmd_timeout} s.",
        "",
        "| scenario | runs | median | p95 | min | max |",
        "|---|---|---|---|---|---|",
        f"| gpuheal (XID 79 -> replace, job resumed past checkpoint) | {len(mttrs)} | "
        f"{statistics.median(mttrs):.1f} s | {pct(mttrs, 0.95):.1f} s | {min(mttrs):.1f} s | {max(mttrs):.1f} s |",
        f"| Slurm alone (slurmd killed, DOWN after SlurmdTimeout, requeue) | {len(baselines)} | "
        f"{base_med:.1f} s | {pct(baselines, 0.95):.1f} s | {min(baselines):.1f} s | {max(baselines):.1f} s |",
        row("physical floor: restart from the checkpoint on an idle node, no failure", floors),
        row("the job's own checkpoint on SIGUSR1 (confirmed)", ckpts),
        row("**gpuheal's overhead** = MTTR - floor - checkpoint (paired per run)", overheads),
        "",
        f"Ratio (Slurm alone / gpuheal, medians): **{base_med / statistics.median(mttrs):.1f}x**",
        "",
        "gpuheal stage breakdown (median of runs):",
        "",
        "| stage | median | p95 |",
        "|---|---|---|",
        *[f"| {k} | {statistics.median(v):.2f} s | {pct(v, 0.95):.2f} s |" for k, v in stages.items()],
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
