"""The ladder for application faults (XID 13, 31, 43 alone): restart, then diagnose, then replace.

NVIDIA's guidance for these XIDs is to restart the application, and to run diagnostics only when
they recur on the same GPU across *different* jobs: one job crashing three times says nothing of
the board. So an application fault restarts its job (`restart_app`, no drain), counted towards no
hardware verdict (gpuheal.core.fleet.coordination); when this GPU's application faults within the
repeat window have hit `RepeatPolicy.incidents` different jobs, each incident bringing a job the
earlier ones had not, the node is drained for a burn-in (the validation job); only a failed burn-in
replaces it, and a passed one clears the count. Pure: the incident reads the GPU's earlier
incidents from Temporal (activities/rma.py) and decides here.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from gpuheal.core.models.base import Frozen

BurnInVerdict = Literal["passed", "failed"]


class AppFault(Frozen):
    """One earlier incident of this GPU that was an application fault, as its result says."""

    incident_id: str
    run_id: str
    closed_at: datetime
    jobs: tuple[int, ...] = ()  # the jobs on the node when it began
    burn_in: BurnInVerdict | None = None  # it drained the node for a burn-in, with this verdict


class AppFaultsRequest(Frozen):
    """This GPU's earlier incidents: by serial where the reports name one, else the node's with
    the same GPU index (or any, where the reports name none), closed since `since`."""

    cluster: str
    node: str
    gpu: int | None = None
    serials: tuple[str, ...] = ()
    since: datetime


class AppFaults(Frozen):
    faults: tuple[AppFault, ...] = ()


def burn_in_due(earlier: Sequence[AppFault], jobs_now: Sequence[int], needed: int) -> tuple[int, ...] | None:
    """The different jobs that make this GPU's application faults a pattern, or None (restart).

    Counted since the GPU's last passed burn-in: an incident counts when it brought a job none of
    the counted ones had, this one (with `jobs_now`) last. A job that crashes again and again counts
    once. Only an incident with one job on its node counts: with none, nothing says it was not the
    board, nor that it was; with several, which of them ran on this GPU is not known (Slurm's GPU
    index per job is not read), and a job crashing again beside a changing neighbour must not look
    like a new one. Shared nodes therefore never climb the ladder: their faults restart in place."""
    ordered = sorted(earlier, key=lambda f: f.closed_at)
    cleared = [i for i, f in enumerate(ordered) if f.burn_in == "passed"]
    since = ordered[cleared[-1] + 1 :] if cleared else ordered
    seen: set[int] = set()
    counted = 0
    for jobs in [*(f.jobs for f in since), tuple(jobs_now)]:
        if len(set(jobs)) != 1:
            continue
        new = set(jobs) - seen
        if new:
            counted += 1
            seen |= new
    return tuple(sorted(seen)) if counted >= needed else None
