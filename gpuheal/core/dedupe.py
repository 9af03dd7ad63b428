"""Is a report news, or a failure an earlier incident of its node already handled? Pure.

The start path (gpuheal.triggers.start) reads the node's recent incidents from Temporal (and,
where it can, whether the scheduler has the node in service now); this decides. It dedupes by the
failure, not by the node:

- the same alert (fingerprint@startsAt) is a duplicate of whichever incident acted on it, always:
  Alertmanager re-sends a firing alert every repeat_interval. An incident that failed or was
  terminated handled nothing, and one never granted (`not_granted`) did nothing: the alert is news
  again. A run that passed a more severe report to its follow-up keeps only the alerts it acted
  on (workflows/incident/follow_up.py);
- the same failure (XID or signal, on the same GPU) while the node is still out of service from
  the incident that handled it, within the duplicate window, is a duplicate of that incident: a
  second source (the agent and a DCGM rule) or a late delivery of what it already acted on;
- anything else is new and starts (or, as a repeat offender, escalates) a remediation: another
  failure, one more severe than that incident's action, a recurrence on a node back in service
  (repaired, never drained, or resumed by a person since), anything after an ignored incident.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from gpuheal.core import policy
from gpuheal.core.models.base import ActionClass, Frozen, NodeState, Outcome
from gpuheal.core.models.report import HealthReport

# An incident that closed with the node in one of these left it out of service: drained (and
# maybe cordoned), with its domain incident, waiting for a replacement, or gone from the cluster.
OUT_OF_SERVICE = frozenset(
    {
        NodeState.DRAINED,
        NodeState.BLOCKED,
        NodeState.ESCALATED,
        NodeState.AWAITING_REPLACEMENT,
        NodeState.REPLACED,
        NodeState.ALREADY_REPLACED,
    }
)
# One that closed in one of these did nothing to the node's service: the node is as it was before,
# so an earlier incident's state still stands (an XID 63 ignored on a node still drained by the
# XID 79 before it leaves it drained). Every other state (returned, left_drained: someone else's
# drain, unknown) says the node is no longer out from any incident of ours.
AS_FOUND = frozenset({NodeState.UNTOUCHED, NodeState.IN_SERVICE})
# Incidents that ran to a close without acting on what they had: their alerts are news again.
# (A report on a node not yet in service is news again once it is.)
NOT_ACTED_ON: frozenset[Outcome] = frozenset({"not_granted", "not_in_service"})


class Failure(Frozen):
    """What one report says failed: the XID or signal, and on which GPU (where it says)."""

    xid: int | None = None
    signal: str | None = None
    gpu: int | None = None
    gpu_uuid: str | None = None

    @classmethod
    def of(cls, report: HealthReport) -> Failure:
        return cls(xid=report.xid, signal=report.signal, gpu=report.gpu, gpu_uuid=report.gpu_uuid)

    def same_as(self, other: Failure) -> bool:
        """The same XID (or signal) on the same GPU. The NVML UUID decides where both carry one;
        a report that names no GPU cannot be told apart from one that does."""
        if (self.xid, self.signal) != (other.xid, other.signal):
            return False
        if self.gpu_uuid and other.gpu_uuid:
            return self.gpu_uuid == other.gpu_uuid
        return self.gpu is None or other.gpu is None or self.gpu == other.gpu

    def describe(self) -> str:
        what = f"XID {self.xid}" if self.xid is not None else f"{self.signal}"
        if self.xid == 154 and self.signal:
            what += f" ({self.signal})"
        return what + (f" on GPU {self.gpu}" if self.gpu is not None else "")


class PastIncident(Frozen):
    """A closed incident of the node, as Temporal's record and its result show it. Without a
    result (it failed or was terminated) only its alert keys are known: node_state UNKNOWN."""

    incident_id: str
    run_id: str
    closed_at: datetime
    alert_keys: frozenset[str] = frozenset()
    failures: tuple[Failure, ...] = ()  # one per report it received
    action: ActionClass | None = None
    outcome: Outcome | None = None
    node_state: NodeState = NodeState.UNKNOWN
    completed: bool = True  # ran to its close (not failed, terminated, cancelled or timed out)

    @property
    def acted(self) -> bool:
        """Whether it acted on the alerts it names (an outcome not known is taken as acted)."""
        return self.completed and self.outcome not in NOT_ACTED_ON


class Duplicate(Frozen):
    """The incident that already handled the report: the caller starts nothing and says so."""

    incident_id: str
    run_id: str
    kind: Literal["same_alert", "same_failure"]
    why: str  # "the same alert, fp@start" or "XID 79 on GPU 0 again while gpu01 is still drained ..."

    def __str__(self) -> str:
        return f"{self.incident_id} ({self.why})"


class New(Frozen):
    """The report is news: start (or join) a remediation."""

    why: str


def out_of_service_from(incidents: Sequence[PastIncident]) -> PastIncident | None:
    """The incident the node is still out of service from, by gpuheal's records: the newest one
    that changed the node's service, if it left the node out."""
    for incident in sorted(incidents, key=lambda i: i.closed_at, reverse=True):
        if incident.node_state in AS_FOUND:
            continue
        return incident if incident.node_state in OUT_OF_SERVICE else None
    return None


def decide(
    report: HealthReport,
    incidents: Sequence[PastIncident],
    *,
    now: datetime,
    window_s: float,
    in_service_now: bool | None = None,
) -> Duplicate | New:
    """Duplicate of one of the node's closed `incidents`, or new. `in_service_now`: what the
    scheduler says of the node now (None: not asked; the incidents' records stand), so a node a
    person resumed after an aborted incident takes the next failure as news."""
    if report.alert_key:
        for incident in incidents:
            # Only an incident that acted on the alert handled it: one that failed or was
            # terminated (a Slurm outage at triage), or was never granted, must not swallow every
            # re-send of it forever.
            if report.alert_key in incident.alert_keys and incident.acted:
                return Duplicate(
                    incident_id=incident.incident_id,
                    run_id=incident.run_id,
                    kind="same_alert",
                    why=f"the same alert, {report.alert_key}",
                )
    if not incidents:
        return New(why=f"no earlier incident of {report.node}")
    if window_s <= 0:
        return New(why="no duplicate window")
    out = out_of_service_from(incidents)
    if out is None:
        return New(why=f"{report.node} is not out of service from an earlier incident")
    if in_service_now:
        return New(why=f"{report.node} is back in service since {out.incident_id} left it {out.node_state.value}")
    ago = (now - out.closed_at).total_seconds()
    if ago >= window_s:
        return New(why=f"{out.incident_id} closed {ago:.0f} s ago, past the {window_s:g} s duplicate window")
    failure = Failure.of(report)
    if not any(failure.same_as(f) for f in out.failures):
        handled = ", ".join(sorted({f.describe() for f in out.failures})) or "nothing known"
        return New(why=f"{failure.describe()} is not what {out.incident_id} handled ({handled})")
    action = policy.triage(report).action
    if out.action is not None and policy.asks_more(action, out.action):
        return New(why=f"{action.value} is more severe than {out.incident_id}'s {out.action.value}")
    return Duplicate(
        incident_id=out.incident_id,
        run_id=out.run_id,
        kind="same_failure",
        why=(
            f"{failure.describe()} again while {report.node} is still {out.node_state.value} from it, "
            f"closed {ago:.0f} s ago, within the {window_s:g} s duplicate window"
        ),
    )
