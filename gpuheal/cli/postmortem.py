"""`gpuheal postmortem INCIDENT`: the incident's record from its result and its history.

Every action comes from the history (attempts and errors included), every decision from the
updates and signals it received, the Kubernetes Events from what it asked to post on the Node.
Writes NAME.md, NAME.html and NAME.svg (the timeline) into --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus

from gpuheal.activities import interface as act
from gpuheal.cli.targets import incident_id
from gpuheal.clients.temporal import connect
from gpuheal.core import postmortem
from gpuheal.core.messages import INCIDENT
from gpuheal.core.settings import Settings


def _decode(payload: Payload) -> Any:
    try:
        return json.loads(payload.data)
    except ValueError:
        return payload.data.decode(errors="replace")


def read_history(events: list[Any]) -> tuple[list[postmortem.ActionRecord], list[postmortem.Steering], list[str]]:
    """Actions (one per scheduled activity), the steering it received, the Node Events it posted."""
    actions: dict[int, postmortem.ActionRecord] = {}
    steering: list[postmortem.Steering] = []
    node_events: list[str] = []
    for e in events:
        t = e.event_type
        if t == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            a = e.activity_task_scheduled_event_attributes
            summary = _decode(e.user_metadata.summary) if e.user_metadata.HasField("summary") else ""
            actions[e.event_id] = postmortem.ActionRecord(a.activity_type.name, str(summary), 0, "running")
            if a.activity_type.name == act.POST_NODE_EVENT.name and a.input.payloads:
                ev = _decode(a.input.payloads[0])
                if isinstance(ev, dict):
                    kind = "Warning" if ev.get("warning") else "Normal"
                    node_events.append(f"{kind} {ev.get('reason')}: {ev.get('message')}")
        elif t == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            a = e.activity_task_started_event_attributes
            if a.scheduled_event_id in actions:
                actions[a.scheduled_event_id].attempts = a.attempt
                if a.HasField("last_failure") and a.last_failure.message:
                    actions[a.scheduled_event_id].errors.append(a.last_failure.message[:200])
        elif t == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            actions[e.activity_task_completed_event_attributes.scheduled_event_id].outcome = "completed"
        elif t == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            a = e.activity_task_failed_event_attributes
            actions[a.scheduled_event_id].outcome = f"failed: {a.failure.message[:200]}"
        elif t == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
            actions[e.activity_task_timed_out_event_attributes.scheduled_event_id].outcome = "timed out"
        elif t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            a = e.workflow_execution_signaled_event_attributes
            args = [_decode(p) for p in a.input.payloads]
            steering.append(postmortem.Steering(e.event_time.ToDatetime(), f"signal {a.signal_name}", _describe(args)))
        elif t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            req = e.workflow_execution_update_accepted_event_attributes.accepted_request
            args = [_decode(p) for p in req.input.args.payloads]
            steering.append(postmortem.Steering(e.event_time.ToDatetime(), f"update {req.input.name}", _describe(args)))
    return list(actions.values()), steering, node_events


def _describe(args: list[Any]) -> str:
    """Who and why, when the input is a decision; else what was reported (never a secret: inputs
    carry operators, reasons and reports only)."""
    first = args[0] if args else {}
    if isinstance(first, dict) and "operator" in first:
        return f"{first['operator']}: {first.get('reason', '')}"
    if isinstance(first, dict) and "node" in first:
        what = f"XID {first['xid']}" if first.get("xid") is not None else str(first.get("signal"))
        return f"{what} on {first['node']} from {first.get('source', '?')}"
    return json.dumps(first)[:120]


async def gather_record(settings: Settings, incident: str) -> postmortem.Record | None:
    """The closed incident's record; None while it is still open."""
    client = await connect(settings.temporal)
    handle = INCIDENT.handle(client, incident)
    if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
        return None
    result = await handle.result()
    history = await handle.fetch_history()
    actions, steering, node_events = read_history(list(history.events))
    url = settings.incident_url(incident)
    return postmortem.Record(result, actions, steering, node_events, url, len(history.events))


def write_postmortem(settings: Settings, args: argparse.Namespace) -> int:
    incident = incident_id(settings, args.target)
    record = asyncio.run(gather_record(settings, incident))
    if record is None:
        print(f"incident {incident} is still open: `gpuheal status {args.target}` shows where it is")
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    svg, md, page = out / f"{incident}.svg", out / f"{incident}.md", out / f"{incident}.html"
    svg.write_text(postmortem.timeline_svg(record.result.stages, record.result.failure_observed_at))
    md.write_text(postmortem.markdown(record, svg.name))
    page.write_text(postmortem.html_page(record))
    print(f"postmortem of {incident}: {md}, {page} (timeline {svg})")
    return 0
