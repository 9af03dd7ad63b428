"""MTTR benchmark: gpuheal against Slurm left to itself, side by side, on the local sandbox.

    python -m bench.mttr [--runs 5] [--baseline-runs 3] [--slurmd-timeout 300]

gpuheal: the demo scenario --runs times, each a new incident (a checkpointing job, XID 79 on its
node, alert through the webhook); MTTR is the workflow's own figure (failure observed -> the job
seen past its pre-failure checkpoint on another node), with the per-stage breakdown and a profile
of where the time goes (gpuheal's stages, Slurm's start of the requeued job, the job's restart).

The physical floor, paired with each gpuheal run: the same job restarted from its checkpoint on
an idle node with no failure at all (submit -> first step past the checkpoint), plus the time the
job took to checkpoint when asked. gpuheal's overhead = MTTR - floor - checkpoint time.

Baselines (bench/baselines.py, each run on its own Slurm sandbox, side by side): (a) slurmd lost,
DOWN after SlurmdTimeout, requeue; (b) slurmd up, a HealthCheckProgram drains every 60 s, the
job hung until its time limit.

Self-checks (bench.common): every gpuheal run is its own workflow run, started after its own
injection, for its own alert, and resumed its own job; every baseline run happened on its own
sandbox to its own job. Any that fails stops the benchmark before a figure is written.
Writes bench/results/mttr.md.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import statistics
import sys
import threading
import time
from datetime import UTC, datetime

from temporalio.client import Client

from bench import baselines
from bench.baselines import BaselineRun
from bench.common import BenchCheckFailed, check, distinct, summary
from bench.mttr_parts import BEFORE, FLOOR_JOB, FLOOR_SLURM, JOB, LOOK, SLURM, Floor, GpuhealRun
from bench.mttr_report import report
from gpuheal.clients.temporal import connect
from gpuheal.core import ids
from gpuheal.core import search_attributes as sa
from gpuheal.core.models.base import Stage
from gpuheal.core.progress import parse_progress
from gpuheal.core.settings import Settings
from gpuheal.workflows.remediation import GpuRemediationWorkflow
from infra.sandbox import REPO, RUN
from infra.sandbox.demo import follow
from infra.sandbox.stack import Sandbox

RESULTS = REPO / "bench" / "results" / "mttr.md"
FIGURES = REPO / "bench" / "results" / "mttr.json"  # the timings `gpuheal simulate --timings` reads


class JobWatch:
    """The job's state and progress line as Slurm shows them, every 50 ms in a thread: when it
    was first seen PENDING (requeued), then RUNNING again, then its restarted run's first step
    past its checkpoint (the job's own restart done, before gpuheal looks), in unix time."""

    def __init__(self, sb: Sandbox, job: int, fresh: bool = False) -> None:
        self.sb, self.job = sb, job
        self.fresh = fresh  # a new submission: its first RUNNING counts, PENDING seen or not
        self.pending_at: float | None = None
        self.running_at: float | None = None
        self.past_at: float | None = None
        self._on = True
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> JobWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._on = False
        self._thread.join()

    def _loop(self) -> None:
        while self._on:
            line = self.sb.slurm("squeue", "-h", "-j", str(self.job), "-o", "%T|%k", check=False).strip()
            now = time.time()
            state, _, comment = line.partition("|")
            if state == "PENDING" and self.pending_at is None:
                self.pending_at = now
            if state == "RUNNING" and self.running_at is None and (self.pending_at is not None or self.fresh):
                self.running_at = now
            p = parse_progress(comment)
            restarted = self.fresh or (p is not None and p.restart > 0)
            if self.running_at is not None and self.past_at is None and p and restarted and p.step > p.checkpoint_step:
                self.past_at = now
            time.sleep(0.05)


def floor_run(sb: Sandbox) -> Floor:
    """Submit -> the job's first step past its checkpoint, restarting from a checkpoint on an
    idle node, with nothing failed: what a restart costs the job itself."""
    sb.start_slurm(clean=True)
    ckpt = sb.slurm_dir / "jobs" / f"floor-{time.time_ns()}.ckpt.json"
    warm = sb.submit_training("floor-warm", checkpoint=ckpt)
    sb.wait_for_step(warm, 12)  # a checkpoint at step 10 on disk
    sb.slurm("scancel", str(warm))
    t0 = time.time()
    job = sb.submit_training("floor", checkpoint=ckpt)
    with JobWatch(sb, job, fresh=True) as watch:
        while True:
            p = sb.job_progress(job)
            if p is not None and p.step > p.checkpoint_step > 0:
                done = time.time()
                break
            check(time.time() - t0 < 120, "the floor job never stepped past its checkpoint")
            time.sleep(0.05)
    check(watch.running_at is not None, f"floor job {job}: never seen RUNNING")
    assert watch.running_at is not None
    return Floor(total_s=done - t0, to_running_s=watch.running_at - t0)


async def gpuheal_run(sb: Sandbox, client: Client, index: int, seen: set[str]) -> GpuhealRun:
    # Each run's Slurm starts clean, with its own job ids: a real controller never reuses one,
    # and gpuheal's retry budget (requeues per job id per 24 h) would count the earlier runs'.
    sb.extra_env["GPUHEAL_SLURM_FIRST_JOB_ID"] = str(1000 * index + 500)
    floor = floor_run(sb)
    sb.extra_env["GPUHEAL_SLURM_FIRST_JOB_ID"] = str(1000 * index)
    sb.start_slurm(clean=True)
    job = sb.submit_training(f"bench-{index}")
    node = sb.wait_for_step(job, 12)
    workflow_id = ids.incident_id(sb.cluster, node)
    with JobWatch(sb, job) as watch:
        injected_at = datetime.now(UTC)
        sb.inject_gpu_fault(node)
        payload = sb.alertmanager_payload(node, 79)
        status, body = sb.post_alert(payload)
        check(status == 200, f"run {index}: the webhook answered {status}: {body}")
        check(not body.get("already_handled"), f"run {index}: the alert started nothing: {body.get('already_handled')}")
        desc = await client.get_workflow_handle(workflow_id).describe()
        check(desc.run_id not in seen, f"run {index}: {workflow_id} run {desc.run_id} is an earlier run's")
        check(desc.start_time >= injected_at, f"run {index}: run {desc.run_id} started before this run's injection")
        seen.add(desc.run_id)
        handle = client.get_workflow_handle_for(GpuRemediationWorkflow.run, workflow_id, run_id=desc.run_id)
        try:
            result = await asyncio.wait_for(follow(handle, echo=False), 300)
        except TimeoutError:
            where = (await handle.describe()).typed_search_attributes.get(sa.STAGE)
            raise BenchCheckFailed(f"run {index}: {workflow_id} not closed in 300 s, at {where}") from None
    alert_at = payload["alerts"][0]["startsAt"]
    check(result.failure_observed_at >= injected_at, f"run {index}: its MTTR starts before this run's injection")
    held = [st.outcome for st in result.stages if st.stage == Stage.HELD]
    check(not held, f"run {index}: the incident was held ({held}): its MTTR would measure the hold")
    check(result.mttr_s is not None, f"run {index}: no MTTR ({result.outcome}: {result.reason})")
    resumed = [r for r in result.jobs_resumed if r.job_id == job]
    check(bool(resumed) and node not in resumed[0].node, f"run {index}: job {job} not resumed elsewhere ({alert_at})")
    run = GpuhealRun(index, desc.run_id, node, job, injected_at, desc.start_time, result, floor)
    run.pending_at, run.running_at, run.past_at = watch.pending_at, watch.running_at, watch.past_at
    run.profile = profile(run)
    return run


def profile(run: GpuhealRun) -> dict[str, float]:
    """Where one incident's MTTR goes, from its stages and the job's states as Slurm showed them."""
    r = run.result
    t0 = r.failure_observed_at.timestamp()
    requeued = run.pending_at  # Slurm showed it requeued (the incident's own stage ends at the hand-off)
    resumed = max(j.observed_at.timestamp() for j in r.jobs_resumed)
    # The job was past its checkpoint by the first time anyone saw it so: the watch (every 50 ms)
    # or gpuheal's own look, whichever came first.
    past = None if run.past_at is None else min(run.past_at, resumed)
    check(requeued is not None and run.running_at is not None, f"run {run.index}: no requeue or restart seen")
    check(past is not None, f"run {run.index}: the restarted job never showed a step past its checkpoint")
    assert requeued is not None and run.running_at is not None and past is not None
    check(t0 <= requeued <= run.running_at <= past <= resumed, f"run {run.index}: its parts are out of order")
    return {
        BEFORE: requeued - t0,
        SLURM: run.running_at - requeued,
        JOB: past - run.running_at,
        LOOK: resumed - past,
        FLOOR_SLURM: run.floor.to_running_s,
        FLOOR_JOB: run.floor.total_s - run.floor.to_running_s,
    }


def figures(runs: list[GpuhealRun], base: list[BaselineRun]) -> dict[str, object]:
    """The medians the simulator takes (gpuheal.core.simulate.models.Timings), with the runs they
    come from: gpuheal's part = MTTR - the floor (what it adds before the job's own restart);
    Slurm's part in (a) = its time back - the floor median."""
    floor = statistics.median(r.floor.total_s for r in runs)
    back = [b.back_s for b in base if b.model == "slurmd_lost" and b.back_s is not None]
    return {
        "gpuheal_s": round(statistics.median(r.mttr - r.floor.total_s for r in runs), 3),
        "slurm_down_s": round(statistics.median(back) - floor, 1),
        "runs": [r.run_id for r in runs],
        "baseline_sandboxes": [b.sandbox for b in base],
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def run_baselines(args: argparse.Namespace) -> list[BaselineRun]:
    """Both models, every run on its own sandbox, all side by side (they wait on Slurm's clocks)."""
    n = args.baseline_runs
    with concurrent.futures.ThreadPoolExecutor(2 * n) as pool:
        a = [pool.submit(baselines.slurmd_lost, RUN / "bench", k, args.slurmd_timeout) for k in range(n)]
        b = [
            pool.submit(baselines.healthcheck_drain, RUN / "bench", n + k, 60, args.time_limit_min, 60)
            for k in range(n)
        ]
        return [f.result() for f in (*a, *b)]


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--baseline-runs", type=int, default=3)
    ap.add_argument("--slurmd-timeout", type=int, default=300)
    ap.add_argument("--time-limit-min", type=int, default=3, help="(b): the hung job's own time limit")
    args = ap.parse_args()
    check(args.runs >= 5 and args.baseline_runs >= 3, "at least 5 gpuheal runs and 3 of each baseline")

    started = time.time()
    # Each run is a new incident on a freshly started Slurm: the node's cooldown (which protects a
    # node gpuheal just gave back) would hold every run after the first on the same node name.
    env = {"GPUHEAL_CHECKPOINT_GRACE_S": "30", "GPUHEAL_NODE_COOLDOWN_S": "0"}
    sb = Sandbox.named("bench", RUN / "bench", extra_env=env)
    sb.start_slurm(clean=True)
    sb.stop_temporal()  # incidents left by an earlier run (maybe of older code) must not join this one
    sb.start_temporal(fresh=True)
    client = await connect(Settings.from_env(sb.env()).temporal)
    worker, webhook = sb.start_worker(), sb.start_webhook()
    runs: list[GpuhealRun] = []
    seen: set[str] = set()
    try:
        for i in range(1, args.runs + 1):
            runs.append(await gpuheal_run(sb, client, i, seen))
            r = runs[-1]
            print(f"  run {i}: {r.run_id[:8]} MTTR {r.mttr:.2f} s, floor {r.floor.total_s:.2f} s", flush=True)
    finally:
        Sandbox.stop_process(webhook)
        Sandbox.stop_process(worker)
        sb.stop_slurm()
        sb.stop_temporal()
    # After gpuheal's runs, not during them: six sandboxes beside it would load the machine.
    print(f"  baselines: {2 * args.baseline_runs} sandboxes side by side (Slurm's own timers)...", flush=True)
    base = run_baselines(args)
    distinct("gpuheal workflow run", [r.run_id for r in runs])
    distinct("baseline sandbox", [b.sandbox for b in base])
    check(len(runs) == args.runs, f"{len(runs)} of {args.runs} gpuheal runs")
    text = report(runs, base, args, time.time() - started)
    print(text)
    RESULTS.write_text(text)
    FIGURES.write_text(json.dumps(figures(runs, base), indent=1) + "\n")
    print(f"overhead: median / p95 / min / max {summary([r.overhead for r in runs])}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
