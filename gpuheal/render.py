"""Every word an incident says: stage outcomes, notifications, the timeline and the summary.

The workflow decides; this module words it. Keeping the wording here (pure functions, no I/O)
keeps the workflow thin and lets the CLI, the demo and the notifications say the same thing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from gpuheal.models import (
    ActionClass,
    CordonResult,
    DrainResult,
    EvictResult,
    HealthReport,
    Outcome,
    RecordedDecision,
    RemediationResult,
    RequeueResult,
    ResumedJob,
    StageRecord,
    UnrequeuedJob,
)

# --- stage outcomes (the line each stage leaves in the UI's current details) ----------------


def triaged(action: ActionClass, reason: str) -> str:
    return f"{action.value}: {reason}"


def decided(d: RecordedDecision) -> str:
    return f"{d.verdict} by {d.operator}: {d.reason}"


def checkpoint_asked(signalled: int, grace_s: float) -> str:
    return f"asked {signalled} job(s) to checkpoint, waited {grace_s:g} s" if signalled else "no job on the node"


def drained(result: DrainResult, why: str) -> str:
    if result.already_drained:
        return f"already drained: {result.previous_reason!r}"
    return f"drained ({why})"


def cordoned(result: CordonResult, no_execute: bool) -> str:
    taints = "NoSchedule" + (" + NoExecute" if no_execute else "")
    by_others = " (it was already cordoned by someone else)" if result.cordoned_by_others else ""
    return f"cordoned, tainted {taints}{by_others}"


def requeued(done: Sequence[RequeueResult], not_done: Sequence[UnrequeuedJob]) -> str:
    return f"requeued {[r.job_id for r in done]}, not requeued {[u.job_id for u in not_done]}"


def evicted(result: EvictResult) -> str:
    return (
        f"evicted {len(result.evicted)}, kept {len(result.kept)} (DaemonSet/mirror), "
        f"{result.retries_429} PDB retries"
        + (f", deleted {list(result.deleted)}" if result.deleted else "")
        + (f", BLOCKED {list(result.blocked)}" if result.blocked else "")
    )


def replaced(new_node: str, node: str) -> str:
    return f"{new_node} joined in place of {node}"


def resumed(jobs: Sequence[ResumedJob]) -> str:
    return "; ".join(f"job {r.job_id} at step {r.step} (> ckpt {r.checkpoint_step}) on {r.node}" for r in jobs)


# --- node states at the close ---------------------------------------------------------------


def aborted_node_state(node: str, drain: DrainResult | None) -> str:
    if drain is None or not drain.drained_by_us:
        return "untouched"
    return f"drained by this incident; not replaced; release with: scontrol update nodename={node} state=resume"


def blocked_node_state(blocked: Sequence[str]) -> str:
    return f"drained and cordoned; pods {list(blocked)} still there; not replaced"


def returned_repaired(detail: str) -> str:
    return f"repaired, health check passed; {detail}"


def left_drained(drain: DrainResult | None) -> str:
    before = drain.previous_reason if drain else ""
    return f"repaired, health check passed; left drained (drained before us: {before!r})"


def returned_replaced(new_node: str, detail: str) -> str:
    return f"replaced by {new_node}; {detail}"


NOT_DRAINED = "in service (not drained)"


# --- notifications --------------------------------------------------------------------------


def remediating(report: HealthReport, action: ActionClass, reason: str) -> str:
    return f"{report.describe()}: {action}. {reason}"


def approval_needed(report: HealthReport, action: ActionClass | None, why: str, timeout_s: float, default: str) -> str:
    return f"{report.describe()}: {action} awaits approval ({why}; default after {timeout_s:g} s: {default})"


def abort_notice(d: RecordedDecision) -> str:
    return f"remediation aborted by {d.operator}: {d.reason}"


def closed_notice(outcome: Outcome, node_state: str, result: RemediationResult) -> str:
    unrequeued = "".join(f"; job {u.job_id} NOT requeued: {u.reason}" for u in result.jobs_not_requeued)
    mttr = f", MTTR {result.mttr_s:.1f} s" if result.mttr_s is not None else ""
    return f"{outcome}: {node_state}{mttr}{unrequeued}"


# --- the timeline and the summary -----------------------------------------------------------


def _bar(offset: float, duration: float, total: float, width: int) -> str:
    start = int(offset / total * width) if total > 0 else 0
    length = max(1, round(duration / total * width)) if total > 0 else 1
    start = min(start, width - 1)
    length = min(length, width - start)
    return " " * start + "█" * length + " " * (width - start - length)


def render_timeline(
    stages: list[StageRecord], failure_at: datetime, end_at: datetime | None = None, width: int = 40
) -> str:
    """One row per stage, offsets from the failure being observed, bars to scale."""
    done = [s for s in stages if s.ended_at is not None]
    if not done:
        return "(no stage finished yet)"
    last = max([s.ended_at for s in done if s.ended_at] + ([end_at] if end_at else []))
    total = (last - failure_at).total_seconds()
    first = stages[0].started_at
    rows = [f"{'stage':<18} {'start':>8} {'took':>8}  |{'timeline':<{width}}|"]
    detect = (first - failure_at).total_seconds()
    rows.append(f"{'detect+start':<18} {0.0:>7.1f}s {detect:>7.1f}s  |{_bar(0, detect, total, width)}|")
    for s in done:
        assert s.ended_at is not None
        off = (s.started_at - failure_at).total_seconds()
        dur = (s.ended_at - s.started_at).total_seconds()
        rows.append(f"{s.stage.value:<18} {off:>7.1f}s {dur:>7.1f}s  |{_bar(off, dur, total, width)}|")
    return "\n".join(rows)


def render_result(result: RemediationResult, url: str | None = None) -> str:
    lines = [
        f"incident   {result.incident_id}  ({result.outcome}: {result.action.value})",
        f"reason     {result.reason}",
        f"node       {result.node_state}",
    ]
    for job in result.jobs_resumed:
        lines.append(
            f"job {job.job_id:<6} resumed on {job.node}: step {job.step} > checkpoint {job.checkpoint_step} "
            f"(restart {job.restart_count})"
        )
    for lost in result.jobs_not_requeued:
        lines.append(f"job {lost.job_id:<6} NOT requeued: {lost.reason}")
    if result.mttr_s is not None:
        until = "training past its checkpoint" if result.jobs_resumed else "capacity back in service"
        lines.append(f"MTTR       {result.mttr_s:.1f} s (failure observed -> {until})")
    lines.append(f"lost       {result.steps_lost} steps, {result.gpu_seconds_lost:.0f} GPU-seconds")
    if url:
        lines.append(f"Temporal   {url}")
    return "\n".join(lines)
