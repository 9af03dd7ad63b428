"""Text rendering of an incident: a per-stage timeline (a small Gantt chart) and a summary."""

from __future__ import annotations

from datetime import datetime

from gpuheal.models import RemediationResult, StageRecord


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
