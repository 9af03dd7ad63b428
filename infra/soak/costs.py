"""What each fault met while it lasted (the soak's report): the incidents open and the jobs
waiting to train again, and their seconds under it.

Exposure, not cause, and said so in the report: a refusal of notices delays no step, and what a
fault delays after it ends (a retry's backoff, a killed worker's activity timing out) is not
counted. A second under two faults counts for each. Only waits that ended in training again are
counted: a job that had not trained again by the soak's end waits on something the soak does not
name, and the report counts those apart. A causal figure would need the same seed run without
faults, which the soak does not do."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infra.soak.records import Run

Wait = tuple[str, float, float]  # a job's wait to train again: (cluster, failed at, trained again at)


@dataclass(frozen=True)
class FaultCost:
    fault: str
    cluster: str  # "" for what the clusters share
    began: float
    lasted: float
    incidents: int  # incident runs open at some moment of it
    incident_s: float  # their seconds open while it lasted
    jobs: int  # jobs waiting to train again at some moment of it
    waited_s: float  # job-seconds of that waiting while it lasted


def ended(act: Mapping[str, Any]) -> float:
    """When a fault stopped acting on the world: its act's `over` (a refusal of notices goes on
    after its act), else when its act was done."""
    return float(act.get("over", act["at"]))


def _under(start: float, stop: float, began: float, over: float) -> float | None:
    """Seconds of [start, stop] within [began, over]; None when they do not meet (touching meets:
    a fault of a second still meets what was open then)."""
    if start > over or stop < began:
        return None
    return max(0.0, min(stop, over) - max(start, began))


def fault_costs(
    runs: Sequence[Run], waits: Sequence[Wait], acts: Sequence[Mapping[str, Any]], end: float
) -> list[FaultCost]:
    """Each fault of the soak, with the incident runs and the jobs' waits on its cluster (both
    clusters for a shared fault) that it met, and their seconds under it."""
    costs = []
    for a in acts:
        if a["kind"] != "fault":
            continue
        began, over, where = float(a["began"]), ended(a), a.get("cluster", "")
        met_runs = [
            s
            for r in runs
            if where in ("", r.cluster)
            if (s := _under(r.started, r.closed if r.closed is not None else end, began, over)) is not None
        ]
        met_waits = [
            s for c, start, stop in waits if where in ("", c) if (s := _under(start, stop, began, over)) is not None
        ]
        costs.append(
            FaultCost(
                a["fault"], where, began, over - began, len(met_runs), sum(met_runs), len(met_waits), sum(met_waits)
            )
        )
    return costs


def lines(costs: Sequence[FaultCost], unfinished: int, begun: float) -> list[str]:
    """The report's section on what each fault met."""
    return [
        "## What each fault met (while it lasted)",
        "",
        "The incident runs open and the jobs waiting to train again that each fault met, and their "
        "seconds under it while it lasted: what it exposed, not what it caused (a refusal of notices "
        "delays no step; what a fault delays after it ends is not counted). A second under two faults "
        f"counts for each. Waits that never ended in training again are left out ({unfinished} jobs).",
        "",
        "| fault | cluster | at | lasted | incident runs open through it | their seconds under it "
        "| jobs waiting to train again through it | their job-seconds waiting under it |",
        "|---|---|---|---|---|---|---|---|",
        *[
            f"| {c.fault} | {c.cluster or 'shared'} | {c.began - begun:+.0f} s | {c.lasted:.0f} s | {c.incidents} "
            f"| {c.incident_s:.0f} | {c.jobs} | {c.waited_s:.0f} |"
            for c in costs
        ],
        "",
    ]
