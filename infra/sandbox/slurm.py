"""The Slurm side of the sandbox (infra/slurm/sandbox.sh runs the daemons): where each release's
Debian root is, the sbatch command lines of its jobs, and the burn-in script that fails while a
node's GPU fault is marked.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from infra.sandbox import SLURM_ROOTS_SCRIPT


@functools.cache
def root_path(version: str) -> Path:
    """The Debian root of a Slurm release (infra/slurm/roots.sh; not necessarily built yet)."""
    out = subprocess.run([str(SLURM_ROOTS_SCRIPT), "path", version], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def sbatch_argv(
    name: str,
    wrap: str,
    exports: dict[str, str],
    jobs: Path,
    requeue: bool,
    nodelist: str | None,
    nodes: int,
    exclusive: bool = False,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """`sbatch --parsable ... --wrap=WRAP`, its output in JOBS/NAME-JOBID.out."""
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={name}",
        f"--output={jobs}/{name}-%j.out",
        "--export=" + ",".join(["ALL", *(f"{k}={v}" for k, v in exports.items())]),
        "--requeue" if requeue else "--no-requeue",
        f"--nodes={nodes}",
    ]
    if nodelist:
        argv.append(f"--nodelist={nodelist}")
    if exclusive:
        argv.append("--exclusive")
    argv.extend(extra)
    argv.append(f"--wrap={wrap}")
    return argv


def write_burn_in(script: Path, faults: Path) -> None:
    """The burn-in job (GPUHEAL_VALIDATE_JOB): its "GPU" fails while FAULTS/NODE (the fault a
    repair clears) or FAULTS/NODE.lasting (one no repair mends) exists."""
    script.write_text(
        "#!/bin/sh\n"
        f'for f in "{faults}/$SLURMD_NODENAME" "{faults}/$SLURMD_NODENAME.lasting"; do\n'
        '  if [ -e "$f" ]; then echo "GPU fault on $SLURMD_NODENAME" >&2; exit 1; fi\n'
        "done\n"
        'echo "GPUs of $SLURMD_NODENAME pass"\n'
    )
    script.chmod(0o755)


def progress_bar(job_id: int, done: int, step: int) -> str:
    """A training job's progress as the demo shows it (on one line, redrawn)."""
    bar = "█" * (done * 20 // step) + "░" * (20 - done * 20 // step)
    return f"\r  training job {job_id}: step {done:>3}/{step} {bar}"
