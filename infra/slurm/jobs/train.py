"""A small checkpointing training job for the sandbox (CPU only, numpy).

It fits a linear model by SGD, one step every STEP_S seconds, checkpoints every CKPT_EVERY steps
and on SIGUSR1, resumes from its checkpoint when Slurm restarts it, and publishes its progress in
its job comment (gpuheal.progress). The sandbox's fault injection marks a node's "GPU" as failed
by creating $GPUHEAL_FAULT_DIR/<node>; a job on that node then hangs, as training does when a
GPU falls off the bus.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from gpuheal.progress import report_progress

STEP_S = float(os.environ.get("TRAIN_STEP_S", "0.5"))
CKPT_EVERY = int(os.environ.get("TRAIN_CKPT_EVERY", "10"))
MAX_STEPS = int(os.environ.get("TRAIN_MAX_STEPS", "100000"))
CKPT = Path(os.environ["TRAIN_CKPT"])
FAULTS = Path(os.environ.get("GPUHEAL_FAULT_DIR", "/nonexistent"))
NODE = os.environ.get("SLURMD_NODENAME", "?")

checkpoint_now = False


def on_usr1(signum: int, frame: object) -> None:
    global checkpoint_now
    checkpoint_now = True


def save(step: int, w: np.ndarray) -> float:
    tmp = CKPT.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": step, "w": w.tolist()}))
    tmp.replace(CKPT)  # atomic: a crash never leaves half a checkpoint
    return time.time()


def main() -> None:
    signal.signal(signal.SIGUSR1, on_usr1)
    rng = np.random.default_rng(0)
    true_w = np.arange(8, dtype=float)
    step, w = 0, np.zeros(8)
    if CKPT.exists():
        state = json.loads(CKPT.read_text())
        step, w = state["step"], np.array(state["w"])
        print(f"resumed from checkpoint at step {step} on {NODE}", flush=True)
    ckpt_step, ckpt_at = step, time.time()
    report_progress(step, ckpt_step, ckpt_at)
    global checkpoint_now
    while step < MAX_STEPS:
        if checkpoint_now:
            checkpoint_now = False
            ckpt_step, ckpt_at = step, save(step, w)
            print(f"checkpoint on request at step {step}", flush=True)
            report_progress(step, ckpt_step, ckpt_at)
        if (FAULTS / NODE).exists():
            time.sleep(0.1)  # the GPU is gone: no step can complete
            continue
        x = rng.normal(size=(32, 8))
        grad = x.T @ (x @ w - x @ true_w) / len(x)
        w -= 0.05 * grad
        step += 1
        time.sleep(STEP_S)
        if step % CKPT_EVERY == 0:
            ckpt_step, ckpt_at = step, save(step, w)
        report_progress(step, ckpt_step, ckpt_at)
    print(f"done at step {step}, loss {float(np.sum((w - true_w) ** 2)):.4f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
