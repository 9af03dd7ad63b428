"""A postmortem a person would forward: one incident's record as Markdown, HTML and an SVG timeline.

Pure rendering: `gpuheal/cli/postmortem.py` reads the incident's result and history from Temporal and
hands them here. The Slurm side (drain, requeues), the Kubernetes side (the Events posted on the
Node) and the jobs (steps and GPU time lost) are one record.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from gpuheal.core import rma_policy
from gpuheal.core.models.result import RemediationResult, StageRecord

STAGE_COLOURS = {
    "triage": "#6c8ebf",
    "held": "#b85450",
    "approval": "#d6b656",
    "drain": "#82b366",
    "repair_or_replace": "#9673a6",
    "verify_resume": "#d79b00",
}


@dataclass
class ActionRecord:
    """One activity of the incident: what it did, how many attempts, how it ended."""

    name: str
    summary: str
    attempts: int
    outcome: str  # "completed", "failed: ...", "running"
    errors: list[str] = field(default_factory=list)


@dataclass
class Steering:
    """An update or signal the incident received (approve, abort, capacity, ...)."""

    at: datetime
    name: str
    detail: str


@dataclass
class Record:
    result: RemediationResult
    actions: list[ActionRecord]
    steering: list[Steering]
    node_events: list[str]  # the Kubernetes Events the incident posted on the Node
    url: str
    history_events: int


def _offset(t: datetime, t0: datetime) -> float:
    return (t - t0).total_seconds()


def timeline_svg(stages: Sequence[StageRecord], failure_at: datetime, width: int = 720) -> str:
    """One bar per stage on a common time axis from the failure, labelled with its duration."""
    ends = [s.ended_at or s.started_at for s in stages]
    span = max([_offset(t, failure_at) for t in ends] + [1e-3])
    row, left, right = 22, 150, 70
    scale = (width - left - right) / span
    height = row * len(stages) + 30
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="incident timeline" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
    ]
    for i, s in enumerate(stages):
        y = 10 + i * row
        x = left + max(0.0, _offset(s.started_at, failure_at)) * scale
        duration = s.duration_s or 0.0
        w = max(2.0, duration * scale)
        colour = STAGE_COLOURS.get(s.stage.value, "#7f7f7f")
        parts += [
            f'<text x="{left - 8}" y="{y + 13}" text-anchor="end">{html.escape(s.stage.value)}</text>',
            f'<rect class="stage" x="{x:.1f}" y="{y}" width="{w:.1f}" height="16" fill="{colour}" rx="2">'
            f"<title>{html.escape(s.stage.value)}: {duration:.1f} s, {html.escape(s.outcome)}</title></rect>",
            f'<text x="{x + w + 4:.1f}" y="{y + 13}" fill="#333">{duration:.1f} s</text>',
        ]
    axis_y = 10 + len(stages) * row + 12
    parts.append(f'<text x="{left}" y="{axis_y}" fill="#555">0 s (failure observed)</text>')
    parts.append(f'<text x="{width - right}" y="{axis_y}" text-anchor="end" fill="#555">{span:.1f} s</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _sections(rec: Record) -> list[tuple[str, list[str]]]:
    """The report's sections as plain lines (Markdown list items), shared by both renderings."""
    r = rec.result
    summary = [
        f"Node **{r.node}** in cluster **{r.cluster}**: {r.outcome} by {r.action.value} ({r.reason})",
        f"Failure observed {r.failure_observed_at:%Y-%m-%d %H:%M:%S} UTC; closed {r.closed_at:%H:%M:%S} UTC",
        f"Node now: {r.node_detail}",
        f"MTTR: {r.mttr_s:.1f} s" if r.mttr_s is not None else "MTTR: training did not resume under this incident",
        f"Training steps redone: {r.steps_lost}; GPU time lost: {r.gpu_seconds_lost / 3600:.2f} GPU-hours",
        f"Policy: version {r.policy_version}, mode {r.mode or 'auto'}",
    ]
    if r.replacement_node:
        summary.append(f"Replaced by: {r.replacement_node}")
    reports = [
        f"{p.observed_at:%H:%M:%S} from {p.source}: {p.describe()}" + (f" ({p.summary})" if p.summary else "")
        for p in r.reports
    ]
    decisions = []
    if r.decision is not None:
        d = r.decision
        how = " (by timeout)" if d.by_timeout else ""
        decisions.append(f"{d.at:%H:%M:%S} {d.verdict} by {d.operator}{how}: {d.reason}")
    decisions += [f"{s.at:%H:%M:%S} {s.name}: {s.detail}" for s in rec.steering]
    actions = [
        f"{a.name} — {a.summary}: {a.outcome}"
        + (f" after {a.attempts} attempts" if a.attempts > 1 else "")
        + "".join(f"; attempt error: {e}" for e in a.errors)
        for a in rec.actions
    ]
    jobs = []
    for j in r.jobs:
        line = f"job {j.job_id} ({j.name}, {j.user}): {j.fate} — {j.detail}"
        if j.resumed is not None:
            line += f"; resumed on {j.resumed.node} at step {j.resumed.step} (checkpoint {j.resumed.checkpoint_step})"
        jobs.append(line)
    return [
        ("Summary", summary),
        ("Reports received", reports or ["none"]),
        ("Decisions", decisions or ["none: no human was asked"]),
        ("Actions", actions or ["none"]),
        ("Jobs on the node", jobs or ["no job was on the node"]),
        ("Kubernetes Events on the Node", rec.node_events or ["none (no Kubernetes side)"]),
        ("RMA evidence", rma_policy.items(r.rma) if r.rma else ["none: the board was not replaced or failed"]),
        ("Links", [f"Temporal UI: {rec.url}", f"{rec.history_events} history events"]),
    ]


def markdown(rec: Record, svg_name: str | None = None) -> str:
    r = rec.result
    lines = [f"# Postmortem: {r.incident_id}", ""]
    if svg_name:
        lines += [f"![timeline of {r.incident_id}]({svg_name})", ""]
    lines += ["| stage | start (s) | duration (s) | outcome |", "|---|---|---|---|"]
    for s in r.stages:
        start = _offset(s.started_at, r.failure_observed_at)
        lines.append(f"| {s.stage.value} | {start:.1f} | {s.duration_s or 0:.1f} | {s.outcome} |")
    for title, items in _sections(rec):
        lines += ["", f"## {title}", ""] + [f"- {item}" for item in items]
    return "\n".join(lines) + "\n"


def _inline(text: str) -> str:
    """Markdown's **bold** in an escaped line."""
    out, bold = [], False
    for i, part in enumerate(html.escape(text).split("**")):
        if i:
            bold = not bold
            out.append("<strong>" if bold else "</strong>")
        out.append(part)
    return "".join(out)


def html_page(rec: Record) -> str:
    """A self-contained page: inline CSS and SVG, nothing fetched."""
    r = rec.result
    body = [
        f"<h1>Postmortem: {html.escape(r.incident_id)}</h1>",
        f'<figure id="timeline">{timeline_svg(r.stages, r.failure_observed_at)}</figure>',
    ]
    for title, items in _sections(rec):
        body.append(f"<h2>{html.escape(title)}</h2><ul>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + "</ul>")
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        f"<title>Postmortem {html.escape(r.incident_id)}</title>"
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto;color:#222}"
        "h1{font-size:1.4em}h2{font-size:1.1em;border-bottom:1px solid #ddd}li{margin:.2em 0}</style>"
        "</head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
