"""What bench/mttr.py records of each run: the parts of one incident's MTTR, in order (they add
up to it), the floor's two parts, and the run's record (read by bench/mttr_report.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from gpuheal.core.models.result import RemediationResult

BEFORE = "gpuheal: failure observed -> job requeued (seen PENDING)"
SLURM = "Slurm: requeued -> RUNNING again (its scheduler's next pass)"
JOB = "job: RUNNING -> its first step past its checkpoint (its own restart, seen every 50 ms)"
LOOK = "gpuheal: the job past its checkpoint -> gpuheal saw it (verify_resume's look)"
FLOOR_SLURM = "floor: submit -> RUNNING"
FLOOR_JOB = "floor: RUNNING -> past its checkpoint (the job's own restart)"


@dataclass
class Floor:
    total_s: float
    to_running_s: float


@dataclass
class GpuhealRun:
    index: int
    run_id: str
    node: str
    job: int
    injected_at: datetime
    started_at: datetime
    result: RemediationResult
    floor: Floor
    pending_at: float | None = None
    running_at: float | None = None
    past_at: float | None = None
    profile: dict[str, float] = field(default_factory=dict)

    @property
    def mttr(self) -> float:
        assert self.result.mttr_s is not None
        return self.result.mttr_s

    @property
    def checkpoint_s(self) -> float:
        confirmed = (a.checkpoint.after_s for a in self.result.jobs if a.checkpoint and a.checkpoint.confirmed)
        return max(confirmed, default=0.0)

    @property
    def overhead(self) -> float:
        """As the issue defines it: MTTR - the floor (a fresh submit on an idle node, Slurm's
        scheduling wait included) - the checkpoint."""
        return self.mttr - self.floor.total_s - self.checkpoint_s

    @property
    def own(self) -> float:
        """gpuheal's own part: MTTR - Slurm's wait for this run's requeued job - this run's job's
        own restart (RUNNING -> its first step past its checkpoint) - the checkpoint, all of this
        run. Slurm's scheduler passes every few seconds (batch_sched_delay, 3 s), and a job's
        restart itself varies from run to run (0.8 to 1.8 s here): pairing with a floor run would
        carry both as noise (one run came out at -0.27 s that way)."""
        p = self.profile
        return self.mttr - p[SLURM] - p[JOB] - self.checkpoint_s
