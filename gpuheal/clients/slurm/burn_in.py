"""A burn-in job on one node, through Slurm's own commands, before the node takes jobs again.

The node is drained (by its incident), and a drained node runs nothing. So the node is held in a
maintenance reservation that only gpuheal's Slurm user may use (`flags=maint,ignore_jobs`, for a
bounded time), resumed, and the site's batch script (`dcgmi diag -r 2`, a NCCL all-reduce, ...)
runs there in that reservation; no other job can start on it meanwhile. Each step reads before
it acts, so a retried activity finds its reservation and its job instead of making another: both
are named after the incident run, and the job is looked up by name, user and reservation.
"""

from __future__ import annotations

import getpass
import math

from gpuheal.clients.slurm.base import SlurmError
from gpuheal.clients.slurm.cli import SlurmCli
from gpuheal.core.models.base import check_node_name

# How a burn-in job ended says whether its GPUs were tried: these ran (or booted) and failed...
RAN_AND_FAILED = frozenset({"FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"})
# ...these may never have run at all (cancelled, preempted, past its deadline, forgotten by Slurm).
NO_VERDICT = frozenset({"CANCELLED", "PREEMPTED", "DEADLINE", "PURGED"})
ENDED = frozenset({"COMPLETED"}) | RAN_AND_FAILED | NO_VERDICT
WAITING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})  # not started (yet)
MARGIN_S = 600  # the reservation outlives the burn-in's bound by this, then ends by itself


def _fields(line: str) -> dict[str, str]:
    return dict(f.split("=", 1) for f in line.split() if "=" in f)


class BurnIn:
    def __init__(self, cli: SlurmCli, user: str | None = None, sbatch_args: tuple[str, ...] = ()) -> None:
        self._cli = cli
        self._user = user  # who submits (the only user the reservation admits); else this process's
        self._sbatch_args = sbatch_args  # the site's partition, account, GPUs, time limit

    @property
    def user(self) -> str:
        return self._user or getpass.getuser()

    async def reserve(self, name: str, node: str, timeout_s: float) -> None:
        """Hold `node` for the burn-in from now until its bound and margin have passed. A
        reservation already made (a retry; a new node held before it joined) is extended to that,
        so a slow replacement never eats the burn-in's time."""
        minutes = math.ceil((timeout_s + MARGIN_S) / 60)
        if await self._reserved(name):
            await self._cli.run("scontrol", "update", f"reservationname={name}", f"endtime=now+{minutes}minutes")
            return
        await self._cli.run(
            "scontrol",
            "create",
            "reservation",
            f"reservationname={name}",
            f"nodes={check_node_name(node)}",
            f"users={self.user}",
            "starttime=now",
            f"duration={minutes}",
            "flags=maint,ignore_jobs",
        )

    async def _reserved(self, name: str) -> bool:
        rc, out, err = await self._cli.run("scontrol", "show", "reservation", name, check=False)
        if rc == 0 and f"ReservationName={name} " in out:
            return True
        if rc == 0 or "not found" in (out + err).lower():
            return False
        raise SlurmError(f"scontrol show reservation {name} failed (exit {rc}): {err}")

    async def unreserve(self, name: str) -> None:
        if await self._reserved(name):
            await self._cli.run("scontrol", "delete", f"reservationname={name}")

    async def submit(self, script: str, reservation: str, node: str, job_name: str) -> int:
        """The burn-in job `job_name` in `reservation`: the one already submitted under that name
        by this user, or a new one."""
        _, out, _ = await self._cli.run(
            "squeue", "-h", "-t", "all", "-n", job_name, "-u", self.user, f"--reservation={reservation}", "-o", "%i"
        )
        ids = [int(i) for i in out.split() if i.isdigit()]
        if ids:
            return max(ids)
        _, out, _ = await self._cli.run(
            "sbatch",
            "--parsable",
            f"--job-name={job_name}",
            f"--reservation={reservation}",
            f"--nodelist={check_node_name(node)}",
            "--nodes=1",
            "--exclusive",
            "--no-requeue",
            "--chdir=/tmp",  # its output (/tmp/slurm-JOB.out on the node) stays for the vendor
            *self._sbatch_args,
            script,
        )
        return int(out.strip().split(";")[0])

    async def state(self, job_id: int) -> tuple[str, str]:
        """(JobState, ExitCode) as Slurm shows them now: PENDING, RUNNING, ... or how it ended.
        Slurm unreachable is an error (the activity retries), never a verdict."""
        rc, out, err = await self._cli.run("scontrol", "show", "job", "-o", str(int(job_id)), check=False)
        if rc != 0:
            if "invalid job id" in err.lower():
                return ("PURGED", "?")  # Slurm forgot it: it ended long ago, outcome unknown
            raise SlurmError(f"scontrol show job {job_id} failed (exit {rc}): {err}")
        f = _fields(out)
        return (f.get("JobState", ""), f.get("ExitCode", "?"))

    async def cancel(self, job_id: int) -> None:
        await self._cli.run("scancel", str(int(job_id)), check=False)
