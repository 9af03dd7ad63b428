"""Remediation policy: pure, deterministic functions the workflow calls to decide.

No I/O and no clocks here: the workflow passes in what it knows, so every decision is
replay-safe and unit-tested (tests/test_policy.py). The XID facts come from NVIDIA's XID
catalogue (https://docs.nvidia.com/deploy/xid-errors/) and field experience; docs/workflow.md says
what each action class does to a node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from gpuheal.core.models.base import LIVE_JOB_STATES, ActionClass
from gpuheal.core.models.report import HealthReport
from gpuheal.core.models.result import ResumedJob
from gpuheal.core.models.slurm import RequeueResult

A = ActionClass

# XID -> (action, why). Only the recommended *immediate* action; repeats escalate below.
XID_ACTIONS: dict[int, tuple[ActionClass, str]] = {
    13: (A.RESTART_APP, "graphics engine exception: usually the application"),
    31: (A.RESTART_APP, "GPU memory page fault: usually the application"),
    32: (A.RESET_GPU, "invalid or corrupted push buffer stream"),
    43: (A.RESTART_APP, "GPU stopped processing: restart the application"),
    45: (A.IGNORE, "preemptive cleanup: follows another error, remediate that one"),
    48: (A.RESET_GPU, "double-bit ECC error: reset the GPU"),
    63: (A.IGNORE, "row remap recorded: informational"),
    64: (A.RESET_GPU, "row remap failure: reset the GPU"),
    74: (A.RESET_GPU, "NVLink error: reset the GPU (may be the far end's sympathetic report)"),
    79: (A.REPLACE_NODE, "GPU fell off the bus: the GPU is gone, replace the node"),
    92: (A.IGNORE, "high single-bit ECC rate: watch"),
    94: (A.RESTART_APP, "contained ECC error: restart the application"),
    95: (A.RESET_GPU, "uncontained ECC error: reset the GPU"),
    119: (A.RESET_GPU, "GSP RPC timeout: reset the GPU"),
    120: (A.RESET_GPU, "GSP error: reset the GPU"),
    140: (A.RESET_GPU, "unrecovered ECC error: reset the GPU"),
    143: (A.RESET_GPU, "GPU initialisation failure: reset the GPU"),
}

# XID 154 carries the driver's own recovery action; the report's `signal` holds it.
XID_154_ACTIONS: dict[str, ActionClass] = {
    "none": A.IGNORE,
    "drain_p2p": A.RESET_GPU,
    "drain_and_reset": A.RESET_GPU,
    "gpu_reset": A.RESET_GPU,
    "node_reboot": A.REBOOT_NODE,
}

# Health signals that are not XIDs (from the node agent or Slurm's health check).
SIGNAL_ACTIONS: dict[str, tuple[ActionClass, str]] = {
    "gpu_lost": (A.REPLACE_NODE, "GPU lost: NVML can no longer reach it"),
    "ecc_dbe_volatile": (A.RESET_GPU, "uncorrectable ECC errors since the last reset"),
    "row_remap_failure": (A.RESET_GPU, "row remapping failed"),
    "row_remap_pending": (A.IGNORE, "row remap pending: apply at the next convenient reset"),
    "retired_pages_pending": (A.IGNORE, "page retirement pending: apply at the next reset"),
    "nvlink_down": (A.RESET_GPU, "NVLink errors"),
    "thermal_throttle": (A.IGNORE, "thermal throttling: watch"),
    "health_check_failed": (A.REBOOT_NODE, "node health check failed"),
    "agent_lost": (A.REBOOT_NODE, "node agent telemetry lost"),
}

# A GPU that keeps needing resets is on its way out: field practice (and NVIDIA's RMA guidance
# for repeated ECC errors) is to stop resetting and replace.
REPEATS_BEFORE_REPLACE = 3

_SEVERITY = {a: i for i, a in enumerate(ActionClass)}


@dataclass(frozen=True)
class Triage:
    action: ActionClass
    reason: str


@dataclass(frozen=True)
class Plan:
    """What each action class does to the node; the workflow runs only the stages it names."""

    drain: bool
    requeue: bool
    repair: ActionClass | None  # RESET_GPU, REBOOT_NODE or REPLACE_NODE
    avoid_failed_node: bool


PLANS: dict[ActionClass, Plan] = {
    A.IGNORE: Plan(drain=False, requeue=False, repair=None, avoid_failed_node=False),
    A.RESTART_APP: Plan(drain=False, requeue=True, repair=None, avoid_failed_node=False),
    A.RESET_GPU: Plan(drain=True, requeue=True, repair=A.RESET_GPU, avoid_failed_node=True),
    A.REBOOT_NODE: Plan(drain=True, requeue=True, repair=A.REBOOT_NODE, avoid_failed_node=True),
    A.REPLACE_NODE: Plan(drain=True, requeue=True, repair=A.REPLACE_NODE, avoid_failed_node=True),
}


# A repeat offender is replaced, whatever these would otherwise have done.
REPLACED_WHEN_REPEATED = frozenset({A.RESTART_APP, A.RESET_GPU, A.REBOOT_NODE})
# XIDs that say "usually the application" (NVIDIA's catalogue: restart it). Not XID 94: a contained
# ECC error restarts the application too, but it is the board's memory, and its repeats are the
# usual case for an RMA.
APPLICATION_XIDS = frozenset({13, 31, 43})


def is_application_fault(reports: Sequence[HealthReport]) -> bool:
    """Whether an incident's reports say only "the application": its action a restart, and every
    report that asks for one an application XID (informational ones aside). From APP_FAULTS_APART
    on, the coordinator counts such an incident towards no repeat offender, breaker or domain
    escalation, and tells it no repeat verdict: a job's crashes never condemn a board."""
    if not reports or triage_all(reports).action != A.RESTART_APP:
        return False
    return all(r.xid in APPLICATION_XIDS for r in reports if triage(r).action == A.RESTART_APP)


def triage(report: HealthReport) -> Triage:
    """Map one report to an action class, with the reason an operator will read."""
    if report.xid is not None:
        if report.xid == 154:
            recovery = report.signal or "unknown"
            action = XID_154_ACTIONS.get(recovery, A.REBOOT_NODE)
            return Triage(action, f"XID 154: driver asks for recovery action '{recovery}'")
        if report.xid in XID_ACTIONS:
            action, why = XID_ACTIONS[report.xid]
            return Triage(action, f"XID {report.xid}: {why}")
        return Triage(A.RESET_GPU, f"XID {report.xid}: not in the catalogue, reset to be safe")
    assert report.signal is not None  # HealthReport guarantees one of the two
    if report.signal in SIGNAL_ACTIONS:
        action, why = SIGNAL_ACTIONS[report.signal]
        return Triage(action, why)
    return Triage(A.REBOOT_NODE, f"unknown health signal '{report.signal}': reboot to be safe")


def more_severe(a: ActionClass, b: ActionClass) -> ActionClass:
    return a if _SEVERITY[a] >= _SEVERITY[b] else b


def asks_more(a: ActionClass, b: ActionClass) -> bool:
    """Whether `a` is strictly more severe than `b` (another action, not just as much)."""
    return a != b and more_severe(a, b) == a


def triage_all(reports: Sequence[HealthReport]) -> Triage:
    """The action for every report an incident has received: the most severe one wins, and a
    GPU that asks for a reset again and again is replaced."""
    if not reports:
        raise ValueError("triage_all needs at least one report")
    verdicts = [triage(r) for r in reports]
    worst = verdicts[0]
    for v in verdicts[1:]:
        if more_severe(v.action, worst.action) != worst.action:
            worst = v
    resets = Counter((r.gpu, r.xid) for r, v in zip(reports, verdicts, strict=True) if v.action == A.RESET_GPU)
    repeated = [key for key, n in resets.items() if n >= REPEATS_BEFORE_REPLACE]
    if repeated and more_severe(A.REPLACE_NODE, worst.action) == A.REPLACE_NODE:
        gpu, xid = repeated[0]
        return Triage(
            A.REPLACE_NODE,
            f"XID {xid} on GPU {gpu} reported {resets[repeated[0]]} times: replace, not reset",
        )
    return worst


def plan_for(action: ActionClass) -> Plan:
    return PLANS[action]


def takes_capacity(action: ActionClass) -> bool:
    """Whether the action takes its node out of service (a drain or a repair): it asks the
    coordinator for capacity first (the incident asks; the coordinator decides it with the
    admission when asked to, by this same rule)."""
    plan = PLANS[action]
    return plan.drain or plan.repair is not None


def as_admitted(action: ActionClass, repeat_offender: str | None) -> ActionClass:
    """The action once admitted: a repeat offender is replaced (the incident's current action,
    and the one the coordinator decides capacity for with the admission)."""
    return A.REPLACE_NODE if repeat_offender and action in REPLACED_WHEN_REPEATED else action


REPEAT_OFFENDER = "repeat offender"  # how a repeat offender's reason begins (core.fleet), and its drain's
GIVES_BACK = "borrowed node goes back"  # how every give-back drain's reason begins, after the incident id
DRAIN_REASON_MAX = 200  # characters: what sinfo and scontrol show whole


def drain_reason(incident_id: str, why: str) -> str:
    # Slurm shows the reason in sinfo/scontrol; it names the incident so an operator can find it,
    # and it is how we later recognise a drain as ours (never undrain someone else's). A longer
    # one is cut at a word, marked as cut.
    reason = f"{incident_id}: {why}"
    if len(reason) <= DRAIN_REASON_MAX:
        return reason
    return reason[: DRAIN_REASON_MAX - 3].rsplit(" ", 1)[0] + "..."


def is_our_drain(reason: str, incident_id: str) -> bool:
    return reason.startswith(f"{incident_id}:")


def draining_incident(reason: str, cluster_prefix: str) -> str | None:
    """The incident of this cluster (its ids start with `cluster_prefix`) whose drain this is."""
    incident, colon, _ = reason.partition(":")
    return incident if colon and incident.startswith(cluster_prefix) and " " not in incident else None


# A node that failed its burn-in is drained in its incident's name (the coordinator keeps it
# counted after the run closes), with this mark: the node's next incident (the same incident id,
# a new run) takes the drain for its own, but never resumes it (activities/remediation.py).
FAILED_VALIDATION = "GPU validation failed, for the vendor"


# What resume_slurm_node answers for such a node (the workflow reads it: still out, for the vendor).
KEPT_FOR_THE_VENDOR = "left drained: an earlier run's GPU validation failed"


def failed_validation_reason(incident_id: str, detail: str) -> str:
    """The drain reason of a failed validation."""
    return drain_reason(incident_id, f"{FAILED_VALIDATION}: {detail}")


# A burn-in that never ran to an end says nothing of the GPUs: the node is kept out in the
# incident's name (counted) for a person, with this mark; never "for the vendor".
UNVALIDATED = "GPU validation gave no verdict; validate it by hand, then resume it"


def unvalidated_reason(incident_id: str, detail: str) -> str:
    return drain_reason(incident_id, f"{UNVALIDATED}: {detail}")


def failed_validation_detail(reason: str, incident_id: str) -> str | None:
    """The detail of this incident's failed validation, if Slurm's drain reason is that one;
    None for any other reason, ours or not."""
    head = drain_reason(incident_id, FAILED_VALIDATION)  # cut at the same length as the reason, if ever
    return reason.removeprefix(head).removeprefix(":").lstrip() if reason.startswith(head) else None


def unrequeueable_reason(requeueable: bool, state: str, abnormal_ends: frozenset[str] = frozenset()) -> str | None:
    """Why a job must not be requeued, or None. A job that ended abnormally (in
    `abnormal_ends`: FAILED, NODE_FAIL...) is requeued like a running one; one that completed or
    was cancelled ended as its owner meant."""
    if not requeueable:
        return "submitted with --no-requeue: Slurm may not restart it; resubmit it by hand"
    if state in LIVE_JOB_STATES or state in abnormal_ends:
        return None
    if state == "PENDING":
        return "job is PENDING again (requeued by someone else): nothing to requeue"
    return f"ended {state} by itself during the incident: nothing to redo"


@dataclass(frozen=True)
class IncidentCost:
    mttr_s: float | None
    steps_lost: int
    gpu_seconds_lost: float


def incident_cost(
    failure_at: datetime,
    requeued: Iterable[RequeueResult],
    resumed: Iterable[ResumedJob],
    gpus_per_node: int,
    capacity_back_at: datetime | None = None,
) -> IncidentCost:
    """MTTR and what the failure cost.

    MTTR runs from the failure being observed to training making progress again: the moment the
    last affected job was seen past its pre-failure checkpoint. With no job affected, it runs to
    the moment capacity was back (node resumed or replacement joined).

    GPU time lost per job = GPUs x (downtime + recomputation), where recomputation is the wall
    time between the job's last checkpoint and the failure (work that has to be redone).
    """
    resumed_by_id = {r.job_id: r for r in resumed}
    requeued = [r for r in requeued if r.requeued]
    if not requeued:
        mttr = (capacity_back_at - failure_at).total_seconds() if capacity_back_at else None
        return IncidentCost(mttr_s=mttr, steps_lost=0, gpu_seconds_lost=0.0)
    steps = 0
    gpu_s = 0.0
    ends: list[datetime] = []
    for job in requeued:
        if job.step_at_failure is not None and job.checkpoint_step is not None:
            steps += max(0, job.step_at_failure - job.checkpoint_step)
        back = resumed_by_id.get(job.job_id)
        if back is None:
            continue
        ends.append(back.observed_at)
        downtime = (back.observed_at - failure_at).total_seconds()
        recompute = 0.0
        if job.checkpoint_at is not None:
            recompute = max(0.0, failure_at.timestamp() - job.checkpoint_at)
        gpu_s += job.node_count * gpus_per_node * (downtime + recompute)
    mttr = (max(ends) - failure_at).total_seconds() if ends else None
    return IncidentCost(mttr_s=mttr, steps_lost=steps, gpu_seconds_lost=round(gpu_s, 1))
