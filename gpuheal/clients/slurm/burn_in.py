"""A burn-in job on one node, through Slurm's own commands, before the node takes jobs again.

The node is drained (by its incident), and a drained node runs nothing. So the node is held in a
maintenance reservation that only gpuheal's user may use (`flags=maint,ignore_jobs`), resumed,
and the site's batch script (`dcgmi diag -r 2`, a NCCL all-reduce, ...) runs there in that
reservation; no other job can start on it meanwhile. Each step reads before it acts, so a retried
activity finds its reservation and its job instead of making another: both are named after the
incident run.
"""

from __future__ import annotations

import getpass

from gpuheal.clients.slurm.cli import SlurmCli
from gpuheal.core.models import check_node_name

ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"})


def _fields(line: str) -> dict[str, str]:
    return dict(f.split("=", 1) for f in line.split() if "=" in f)


class BurnIn:
    def __init__(self, cli: SlurmCli, user: str | None = None) -> None:
        self._cli = cli
        self._user = user or getpass.getuser()  # who submits: the only user the reservation admits

    async def reserve(self, name: str, node: str) -> None:
        rc, out, _ = await self._cli.run("scontrol", "show", "reservation", name, check=False)
        if rc == 0 and f"ReservationName={name} " in out:
            return
        await self._cli.run(
            "scontrol",
            "create",
            "reservation",
            f"reservationname={name}",
            f"nodes={check_node_name(node)}",
            f"users={self._user}",
            "starttime=now",
            "duration=UNLIMITED",
            "flags=maint,ignore_jobs",
        )

    async def unreserve(self, name: str) -> None:
        rc, out, _ = await self._cli.run("scontrol", "show", "reservation", name, check=False)
        if rc == 0 and f"ReservationName={name} " in out:
            await self._cli.run("scontrol", "delete", f"reservationname={name}")

    async def submit(self, script: str, name: str, node: str) -> int:
        """The burn-in job in the reservation `name` (also its job name): the one already
        submitted for it, or a new one."""
        _, out, _ = await self._cli.run("squeue", "-h", "-t", "all", "-n", name, "-o", "%i", check=False)
        ids = [int(i) for i in out.split() if i.isdigit()]
        if ids:
            return max(ids)
        _, out, _ = await self._cli.run(
            "sbatch",
            "--parsable",
            f"--job-name={name}",
            f"--reservation={name}",
            f"--nodelist={check_node_name(node)}",
            "--nodes=1",
            "--exclusive",
            "--no-requeue",
            "--output=/dev/null",
            script,
        )
        return int(out.strip().split(";")[0])

    async def state(self, job_id: int) -> tuple[str, str] | None:
        """(JobState, ExitCode) once it ended; None while it runs."""
        rc, out, _ = await self._cli.run("scontrol", "show", "job", "-o", str(int(job_id)), check=False)
        if rc != 0:
            return ("PURGED", "?")  # Slurm forgot it: it ended long ago, outcome unknown
        f = _fields(out)
        state = f.get("JobState", "")
        return (state, f.get("ExitCode", "?")) if state in ENDED else None

    async def cancel(self, job_id: int) -> None:
        await self._cli.run("scancel", str(int(job_id)), check=False)
