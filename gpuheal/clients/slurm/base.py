"""The Slurm backend interface: what the activities need from Slurm, and nothing else.

Two backends implement it: the command-line tools (clients/slurm/cli.py, any version with
`--json`: 22.05 to 26.05) and slurmrestd (clients/slurm/rest.py, 24.11 and later, JWT). Both read
Slurm's JSON through the same parsers (clients/slurm/parsers.py) into the project's models, and
count their calls to Slurm (`calls`), so a benchmark can say what each activity costs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from gpuheal.core.models.slurm import JobSnapshot, NodeInfo

NodeState = Literal["drain", "resume", "down", "future"]


class SlurmError(RuntimeError):
    """A call to Slurm failed; retrying may help (slurmctld busy or restarting)."""


class UnknownNode(LookupError):
    """Slurm has no node of that name."""


class NodeOutOfService(LookupError):
    """The node is defined but not in service (State=FUTURE: a spare, or already replaced)."""


class UnknownSchema(SlurmError):
    """Slurm answered in a JSON schema (data_parser version) this gpuheal does not read."""


class RequeueUnavailable(RuntimeError):
    """This backend cannot requeue the job without harming another one; the message says why."""


@dataclass(frozen=True)
class JobUpdate:
    """Fields a requeued (pending) job takes: run at once, and not on these nodes."""

    start_now: bool = False
    excluded_nodes: tuple[str, ...] | None = None


class SlurmBackend(Protocol):
    calls: int  # calls made to Slurm (commands run or HTTP requests), for benchmarks

    async def version(self) -> str:
        """Slurm's release, e.g. 24.11.5."""
        ...

    async def nodes(self) -> dict[str, NodeInfo]:
        """Nodes in service (FUTURE nodes are not)."""
        ...

    async def node(self, name: str) -> NodeInfo:
        """One node in service; raises UnknownNode or NodeOutOfService with a message naming it."""
        ...

    async def update_node(self, name: str, state: NodeState, reason: str | None = None) -> None: ...

    async def jobs_on_node(self, node: str) -> list[JobSnapshot]:
        """The live jobs (running, suspended, completing) that hold `node`."""
        ...

    async def job(self, job_id: int) -> JobSnapshot | None:
        """The job, or None once Slurm has forgotten it."""
        ...

    async def jobs(self, job_ids: Iterable[int]) -> list[JobSnapshot]:
        """These jobs (the ones Slurm still knows)."""
        ...

    async def mail_user(self, job_id: int) -> str:
        """Where Slurm mails the job's owner (--mail-user; Slurm's default is the user's name),
        including on 22.05, whose JSON leaves it out; "" once Slurm has forgotten the job."""
        ...

    async def update_job(self, job_id: int, update: JobUpdate) -> None: ...

    async def requeue(self, job_id: int, failed_node: str, hold: bool = False) -> None:
        """Requeue the job (it runs again later, its restart count one higher); with `hold`, it
        waits held until released. `failed_node` is where it failed: a backend without a requeue
        call may requeue through it. A finished job can be requeued too."""
        ...

    async def hold(self, job_id: int) -> None:
        """Keep a pending job from starting until someone releases it."""
        ...

    async def signal_job(self, job_id: int, signal: str, batch_only: bool) -> None:
        """Send `signal` to the job's batch script (`batch_only`) or to its steps."""
        ...
