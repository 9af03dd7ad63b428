"""The parts of one incident's MTTR as bench/mttr.py measures them, in order (they add up to
it), and the floor's two parts."""

BEFORE = "gpuheal: failure observed -> job requeued (seen PENDING)"
SLURM = "Slurm: requeued -> RUNNING again (its scheduler's next pass)"
AFTER = "job: RUNNING -> seen past its checkpoint (its restart + gpuheal's look)"
FLOOR_SLURM = "floor: submit -> RUNNING"
FLOOR_JOB = "floor: RUNNING -> past its checkpoint (the job's own restart)"
