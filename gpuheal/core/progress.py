"""The training-progress contract between users' jobs and gpuheal.

RUNNING is not proof that training came back: a restarted job can hang in NCCL set-up or fail to
find its checkpoint. So gpuheal asks each job to publish its progress in its Slurm job comment:

    gpuheal step=<int> ckpt=<int> ckpt_at=<unix seconds> restart=<SLURM_RESTART_COUNT> [signal=USR1] [notify=<who>]

- ``step``: the last optimizer step completed;
- ``ckpt``: the step stored in the newest durable checkpoint; ``ckpt_at``: when it was written
  (to the millisecond: gpuheal compares it with the moment it asked for a checkpoint);
- ``restart``: the job's ``SLURM_RESTART_COUNT`` (0 before any requeue). The comment survives a
  requeue, so this field tells gpuheal's verifier whether the line is from the restarted run;
- ``signal`` (optional): the signal the job traps to checkpoint at once. **A job is signalled
  only when it says so** (here, or with sbatch's ``--signal=B:USR1@...`` where Slurm reports it):
  a signal's default action is to terminate, so a job that does not trap it would be killed.
  It speaks for the run that wrote the line (its ``restart`` the job's restart count): after a
  requeue the old run's line asks for nothing until the new run publishes its own, so a job
  should trap the signal first and publish a line at once (as infra/slurm/jobs/train.py does);
- ``notify`` (optional): where its owner wants to hear about the job (beside the Slurm user).

A job updates it with ``scontrol update jobid=$SLURM_JOB_ID comment="..."`` (what
:func:`report_progress` does); a job owner may update their own job's comment.

A job is *resumed* when it runs on a healthy node with a larger restart count than before the
failure and its comment, written by that run, shows a step past the checkpoint it had before
the failure.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuheal.core.models.slurm import JobProgress

_FIELD = re.compile(r"(\w+)=(\S+)")
_SIGNAL = re.compile(r"^(SIG)?[A-Z0-9]{2,8}$")
PREFIX = "gpuheal"


def format_progress(
    step: int, checkpoint_step: int, checkpoint_at: float, restart: int, signal: str = "", notify: str = ""
) -> str:
    line = f"{PREFIX} step={step} ckpt={checkpoint_step} ckpt_at={checkpoint_at:.3f} restart={restart}"
    if signal:
        line += f" signal={signal}"
    if notify:
        line += f" notify={notify}"
    return line


def parse_progress(comment: str | None) -> JobProgress | None:
    """Parse a job comment; None when the job does not follow the contract."""
    # Imported here: a training job imports this module for report_progress() in its own
    # environment (often without pydantic); only the reader needs the model.
    from gpuheal.core.models.slurm import JobProgress

    if not comment or not comment.startswith(PREFIX + " "):
        return None
    fields = dict(_FIELD.findall(comment))
    signal = fields.get("signal", "").upper()
    try:
        return JobProgress(
            step=int(fields["step"]),
            checkpoint_step=int(fields["ckpt"]),
            checkpoint_at=float(fields["ckpt_at"]) if "ckpt_at" in fields else None,
            restart=int(fields.get("restart", "0")),
            signal=signal.removeprefix("SIG") if _SIGNAL.match(signal) else None,
            notify=fields.get("notify") or None,
        )
    except (KeyError, ValueError):
        return None


PUBLISH_TIMEOUT_S = 10.0  # scontrol's answer, at most; past it, this step's progress goes unsaid


def report_progress(
    step: int, checkpoint_step: int, checkpoint_at: float | None = None, signal: str = "", notify: str = ""
) -> bool:
    """Called from inside a Slurm job: publish progress in the job's comment (True: published).
    Pass `signal` only if the job traps it and checkpoints when it arrives."""
    job_id = os.environ["SLURM_JOB_ID"]
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    comment = format_progress(step, checkpoint_step, checkpoint_at or time.time(), restart, signal, notify)
    # Best effort: a controller that does not answer (restarting, overloaded) must never end the
    # training that calls this; the next step publishes again. Said on stderr, the job's own log.
    try:
        subprocess.run(
            ["scontrol", "update", f"jobid={job_id}", f"comment={comment}"],
            check=True,
            capture_output=True,
            timeout=PUBLISH_TIMEOUT_S,
        )
    except (subprocess.SubprocessError, OSError) as err:
        print(f"gpuheal: progress at step {step} not published ({err}); training goes on", file=sys.stderr)
        return False
    return True
