"""`jobs_on_node` on the CLI backend (24.11+, where squeue filters by node): a node not in service
has no jobs, but a squeue that did not answer says nothing, and is never read as "none runs there"
(a caller would take the node out of Slurm, and its jobs with it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuheal.clients.slurm.base import SlurmError
from gpuheal.clients.slurm.cli import SlurmCli

# squeue's own words on 22.05 (the sandbox's host Slurm), the same on later releases
NOT_IN_SERVICE = "squeue: error: Invalid node name gpu99\n"
UNREACHABLE = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n"
SQUEUE = Path(__file__).parent / "data" / "slurm" / "26.05" / "squeue-jobs.json"  # squeue --json, as written


class Answering(SlurmCli):
    """A CLI backend whose squeue answers `rc`, `out`, `err` (and says it filters by node)."""

    def __init__(self, rc: int, out: str = "", err: str = "") -> None:
        super().__init__()
        self.answer = (rc, out, err)

    async def _filters(self) -> bool:
        return True

    async def run(self, *argv: str, check: bool = True) -> tuple[int, str, str]:
        return self.answer


async def test_a_node_not_in_service_runs_nothing() -> None:
    assert await Answering(1, err=NOT_IN_SERVICE).jobs_on_node("gpu99") == []


async def test_a_squeue_that_did_not_answer_is_an_error_not_none() -> None:
    with pytest.raises(SlurmError, match="Unable to contact slurm controller"):
        await Answering(1, err=UNREACHABLE).jobs_on_node("gpu05")


async def test_an_answer_is_read() -> None:
    answered = Answering(0, out=SQUEUE.read_text())
    assert [j.job_id for j in await answered.jobs_on_node("gpu01")] == [1, 3]  # (3 runs on gpu[01-02])
