"""Incident runs as Temporal's histories record them: the JSON the server gives for a history
(`temporal workflow show --output json`, the SDK's `WorkflowHistory.to_json()`), read without
gpuheal's models, so the checker sees what the server kept, not what gpuheal would parse.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from infra.soak.records import BreakerChange, Grant, Run

# A run's last event, when it closed it, and the status Temporal gives it.
CLOSES = {
    "EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED": "COMPLETED",
    "EVENT_TYPE_WORKFLOW_EXECUTION_FAILED": "FAILED",
    "EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED": "TERMINATED",
    "EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED": "CANCELED",
    "EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT": "TIMED_OUT",
    "EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW": "CONTINUED_AS_NEW",
}
# The stages in which an open incident waits for a person (gpuheal's `Stage` search attribute).
WAITS_FOR_A_PERSON = {"approval": "an operator's approval"}
# gpuheal's named node states (gpuheal.core.models.base.NodeState): a result recorded before they
# were named carries words there instead, which the checker cannot hold to account.
NODE_STATES = frozenset(
    {
        "untouched",
        "in_service",
        "drained",
        "blocked",
        "escalated",
        "awaiting_replacement",
        "returned",
        "left_drained",
        "replaced",
        "failed_validation",
        "unvalidated",
        "already_replaced",
        "unknown",
    }
)
_FRACTION = re.compile(r"(\.\d{6})\d+")


def event_time(text: str) -> float:
    """The server's event time (RFC 3339, to the nanosecond) as seconds since the epoch."""
    return datetime.fromisoformat(_FRACTION.sub(r"\1", text).replace("Z", "+00:00")).timestamp()


def payload(p: Mapping[str, Any]) -> Any:
    """A JSON payload's value (the data converter's json/plain); anything else is refused."""
    encoding = base64.b64decode(p.get("metadata", {}).get("encoding", "")).decode()
    if encoding != "json/plain":
        raise ValueError(f"a payload encoded {encoding!r}: the soak reads json/plain only")
    return json.loads(base64.b64decode(p.get("data", "")) or b"null")


def _attributes(event: Mapping[str, Any]) -> Mapping[str, Any]:
    return next((v for k, v in event.items() if k.endswith("EventAttributes")), {})


def last_stage(events: Sequence[Mapping[str, Any]]) -> str:
    """The `Stage` search attribute as the run last set it."""
    stage = ""
    for e in events:
        if e["eventType"] == "EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES":
            fields = _attributes(e).get("searchAttributes", {}).get("indexedFields", {})
            if "Stage" in fields:
                stage = str(payload(fields["Stage"]))
    return stage


def incident_run(
    history: Mapping[str, Any], *, cluster: str, workflow_id: str, run_id: str, node: str, bound_s: float
) -> Run:
    """One incident run from its history: when it began and closed, how, and what its result names."""
    events: Sequence[Mapping[str, Any]] = history["events"]
    if not events or events[0]["eventType"] != "EVENT_TYPE_WORKFLOW_EXECUTION_STARTED":
        raise ValueError(f"{workflow_id}/{run_id}: a history must begin with the run's start")
    last = events[-1]
    status = CLOSES.get(last["eventType"], "RUNNING")
    closed = event_time(last["eventTime"]) if status != "RUNNING" else None
    outcome, node_state, fates, ended_by_it = "", "", {}, frozenset[int]()
    borrows: tuple[str, ...] = ()
    if status == "COMPLETED":
        result = payload(_attributes(last)["result"]["payloads"][0])
        outcome = str(result.get("outcome", ""))
        state = str(result.get("node_state", ""))
        node_state = state if state in NODE_STATES else ""
        fates = {int(j["job_id"]): str(j["fate"]) for j in result.get("jobs", [])}
        ended_by_it = frozenset(int(j["job_id"]) for j in result.get("jobs", []) if j.get("caused_by_gpuheal"))
        borrows = tuple(str(s.get("outcome", "")) for s in result.get("stages", []) if s.get("stage") == "borrow_node")
    stage = last_stage(events)
    waiting = WAITS_FOR_A_PERSON.get(stage, "") if status == "RUNNING" else ""
    return Run(
        cluster=cluster,
        workflow_id=workflow_id,
        run_id=run_id,
        node=node,
        started=event_time(events[0]["eventTime"]),
        closed=closed,
        status=status,
        outcome=outcome,
        node_state=node_state,
        job_fates=fates,
        jobs_ended_by_it=ended_by_it,
        waiting_for=waiting,
        stage=stage,
        bound_s=bound_s,
        borrows=borrows,
    )


def chained(runs: Sequence[Run]) -> list[Run]:
    """Each run with the chain it belongs to: runs of one workflow id, each started as the one
    before continued as new, are one incident (its first run's key, and when that began)."""
    out: list[Run] = []
    by_id: dict[str, list[Run]] = {}
    for r in runs:
        by_id.setdefault(r.workflow_id, []).append(r)
    for same in by_id.values():
        first, before = None, None
        for r in sorted(same, key=lambda r: r.started):
            if first is None or before is None or before.status != "CONTINUED_AS_NEW":
                first = r  # a run of its own, or a chain's first
            out.append(replace(r, chain=first.key, chain_started=first.started))
            before = r
    return out


def breaker_changes(histories: Sequence[Mapping[str, Any]], cluster: str) -> list[BreakerChange]:
    """The coordinator's breaker through its whole chain of runs (histories in the chain's order),
    as its `fleet` memo showed it at each change, each reset with the operator whose `resume`
    update the history accepted since the change before (none: it reset by itself)."""
    changes: list[BreakerChange] = []
    tripped, resumed_by = False, ""
    for history in histories:
        for e in history["events"]:
            kind, a = e["eventType"], _attributes(e)
            if kind == "EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED":
                request = a.get("acceptedRequest", {}).get("input", {})
                if request.get("name") == "resume":
                    args = request.get("args", {}).get("payloads", [])
                    resumed_by = str(payload(args[0]).get("operator", "")) if args else "?"
            elif kind == "EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED":
                view = a.get("upsertedMemo", {}).get("fields", {}).get("fleet")
                if view is None:
                    continue
                now = bool(payload(view).get("breaker", {}).get("tripped"))
                if now != tripped:
                    by = resumed_by if tripped and not now else ""
                    changes.append(BreakerChange(cluster, event_time(e["eventTime"]), now, by))
                    tripped, resumed_by = now, ""
    return changes


def grants_held(view: Mapping[str, Any], cluster: str, at: float) -> list[Grant]:
    """The grants the coordinator's last `fleet` memo shows still held: each node out (or drained
    as containment) for an incident, keyed by the incident's workflow id."""
    lines = [*view.get("out_nodes", []), *view.get("containing_nodes", [])]
    return [Grant(cluster, str(line["incident_id"]), at, None) for line in lines]
