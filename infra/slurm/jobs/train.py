"""A small checkpointing training job for the sandbox (CPU only, Python's standard library).

It runs on the sandbox's slurmd, so with a newer Slurm inside that Slurm's Debian root and its
python3: no third-party package, and only gpuheal.core.progress from the repository (PYTHONPATH).
It fits a linear model by SGD, one step every STEP_S seconds, checkpoints every CKPT_EVERY steps
and on SIGUSR1, resumes from its checkpoint when Slurm restarts it, and publishes its progress in
its job comment (gpuheal.core.progress). The sandbox's fault injection marks a node's "GPU" as failed
by creating $GPUHEAL_FAULT_DIR/<node>; a job on that node then hangs, as training does when a
GPU falls off the bus.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

from gpuheal.core.progress import report_progress

STEP_S = float(os.environ.get("TRAIN_STEP_S", "0.5"))
CKPT_EVERY = int(os.environ.get("TRAIN_CKPT_EVERY", "10"))
MAX_STEPS = int(os.environ.get("TRAIN_MAX_STEPS", "100000"))
NOTIFY = os.environ.get("TRAIN_NOTIFY", "")  # where the owner wants to hear, beside the Slurm user
# A job that traps SIGUSR1 (so it survives it) but never checkpoints when asked: for tests of
# gpuheal's "no confirmation" path.
IGNORE_REQUEST = os.environ.get("TRAIN_IGNORE_CHECKPOINT_REQUEST") == "1"
# A file: a checkpoint request waits until it exists (a test holds gpuheal's protect stage open
# for as long as it needs, instead of racing a grace period).
CHECKPOINT_WHEN = os.environ.get("TRAIN_CHECKPOINT_WHEN", "")
# After a requeue: fail at once (exit 1), or hang without a step (a broken restart), for tests of
# gpuheal's verification of the resume; "hang-first": hang after the first requeue only.
ON_RESTART = os.environ.get("TRAIN_ON_RESTART", "")  # "", "fail", "hang" or "hang-first"
RESTARTS = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
RESTARTED = RESTARTS > 0
CKPT = Path(os.environ["TRAIN_CKPT"])
FAULTS = Path(os.environ.get("GPUHEAL_FAULT_DIR", "/nonexistent"))
NODE = os.environ.get("SLURMD_NODENAME", "?")

checkpoint_now = False


def on_usr1(signum: int, frame: object) -> None:
    global checkpoint_now
    checkpoint_now = not IGNORE_REQUEST


def may_checkpoint() -> bool:
    return not CHECKPOINT_WHEN or Path(CHECKPOINT_WHEN).exists()


def publish(step: int, ckpt_step: int, ckpt_at: float) -> None:
    # signal=USR1: this job traps SIGUSR1 and checkpoints at once (its opt-in to gpuheal's signal)
    report_progress(step, ckpt_step, ckpt_at, signal="USR1", notify=NOTIFY)


def save(step: int, w: list[float]) -> float:
    tmp = CKPT.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": step, "w": w}))
    tmp.replace(CKPT)  # atomic: a crash never leaves half a checkpoint
    return time.time()


def sgd_step(w: list[float], true_w: list[float], rng: random.Random, batch: int = 32) -> list[float]:
    """One step of least squares on a random batch: w -= lr * X^T (X w - X w*) / n."""
    grad = [0.0] * len(w)
    for _ in range(batch):
        x = [rng.gauss(0, 1) for _ in w]
        err = sum(xi * (wi - ti) for xi, wi, ti in zip(x, w, true_w, strict=True))
        grad = [g + xi * err / batch for g, xi in zip(grad, x, strict=True)]
    return [wi - 0.05 * g for wi, g in zip(w, grad, strict=True)]


def main() -> int:
    signal.signal(signal.SIGUSR1, on_usr1)
    if RESTARTED and ON_RESTART == "fail":
        print("cannot find my checkpoint: giving up", flush=True)
        return 1
    if (RESTARTED and ON_RESTART == "hang") or (RESTARTS == 1 and ON_RESTART == "hang-first"):
        print("stuck in NCCL set-up", flush=True)
        time.sleep(3600)
    rng = random.Random(0)
    true_w = [float(i) for i in range(8)]
    step, w = 0, [0.0] * 8
    if CKPT.exists():
        state = json.loads(CKPT.read_text())
        step, w = state["step"], list(state["w"])
        print(f"resumed from checkpoint at step {step} on {NODE}", flush=True)
    ckpt_step, ckpt_at = step, time.time()
    publish(step, ckpt_step, ckpt_at)
    global checkpoint_now
    while step < MAX_STEPS:
        if checkpoint_now and may_checkpoint():
            checkpoint_now = False
            ckpt_step, ckpt_at = step, save(step, w)
            print(f"checkpoint on request at step {step}", flush=True)
            publish(step, ckpt_step, ckpt_at)
        if (FAULTS / NODE).exists():
            time.sleep(0.1)  # the GPU is gone: no step can complete
            continue
        w = sgd_step(w, true_w, rng)
        step += 1
        time.sleep(STEP_S)
        if step % CKPT_EVERY == 0:
            ckpt_step, ckpt_at = step, save(step, w)
        publish(step, ckpt_step, ckpt_at)
    print(f"done at step {step}, loss {sum((a - b) ** 2 for a, b in zip(w, true_w, strict=True)):.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
