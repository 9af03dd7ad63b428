"""Replay a stored history and check, besides its commands (the SDK's replayer), that every update
answers now what it answered then: a decision changed without its workflow.patched marker (a grant
become a hold, a repeat offender named or not) changes no command, so only its answer shows it."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.worker import (
    Interceptor,
    Replayer,
    UnsandboxedWorkflowRunner,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)
from temporalio.worker._interceptor import HandleUpdateInput

from gpuheal.clients.temporal import DATA_CONVERTER
from gpuheal.core import ids
from gpuheal.core import messages as m
from gpuheal.workflows.domain import DomainIncidentWorkflow
from gpuheal.workflows.fleet import FleetCoordinator
from gpuheal.workflows.job_recovery import JobRecoveryWorkflow
from gpuheal.workflows.remediation import GpuRemediationWorkflow

WORKFLOWS = [GpuRemediationWorkflow, JobRecoveryWorkflow, FleetCoordinator, DomainIncidentWorkflow]
ANSWERS: dict[str, Any] = {}  # update id -> what the replayed handler answered (JSON, and the object)


class _Answers(WorkflowInboundInterceptor):
    async def handle_update_handler(self, input: HandleUpdateInput) -> Any:
        answer = await super().handle_update_handler(input)
        with workflow.unsafe.sandbox_unrestricted():
            payload = DATA_CONVERTER.payload_converter.to_payload(answer)
            ANSWERS[input.id] = (json.loads(payload.data) if payload.data else None, answer)
        return answer


class RecordAnswers(Interceptor):
    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        return _Answers


def recorded_answers(history: WorkflowHistory) -> dict[str, Any]:
    """Each update's answer as the history recorded it (successful ones: a rejection is a failure)."""
    found: dict[str, Any] = {}
    for event in history.events:
        if event.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED:
            continue
        attrs = event.workflow_execution_update_completed_event_attributes
        if attrs.outcome.HasField("success"):
            payloads = attrs.outcome.success.payloads
            found[attrs.meta.update_id] = json.loads(payloads[0].data) if payloads and payloads[0].data else None
    return found


def as_recorded(history: WorkflowHistory) -> WorkflowHistory:
    """The history under the workflow id it ran with (answers name it), derived from its input as
    gpuheal.core.ids derives it; a stored history's file name is not its id."""
    start = history.events[0].workflow_execution_started_event_attributes
    kind = start.workflow_type.name
    payloads = start.input.payloads
    inp = json.loads(payloads[0].data) if payloads else {}
    if kind == m.INCIDENT.name:
        wid = ids.incident_id(inp["report"]["cluster"], inp["report"]["node"])
    elif kind == m.COORDINATOR.name:
        wid = ids.coordinator_id(inp["cluster"])
    elif kind == m.DOMAIN_INCIDENT.name:
        wid = inp["incident"]["incident_id"]
    else:
        return history
    return WorkflowHistory(workflow_id=wid, events=history.events)


async def replay(history: WorkflowHistory, unsandboxed: bool = False) -> list[str]:
    """Replay the history; the updates whose answer differs now, each with both answers.
    `unsandboxed`: with the module constants as the caller patched them (a fresh import would not)."""
    history = as_recorded(history)
    ANSWERS.clear()
    runner = {"workflow_runner": UnsandboxedWorkflowRunner()} if unsandboxed else {}
    replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER, interceptors=[RecordAnswers()], **runner)
    await replayer.replay_workflow(history)
    then = recorded_answers(history)
    now = {i: ANSWERS.get(i, (None, None)) for i in then}
    return [f"{i}: then {then[i]!r}, now {now[i][0]!r}" for i in then if not says_the_same(then[i], *now[i])]


def says_the_same(then: Any, now: Any, answer: Any) -> bool:
    """As `same`, or, for a model's answer, the recorded one read as that model equals it: a field
    now left out at its default (SentWhereSet) says what it said then."""
    if same(then, now):
        return True
    if not isinstance(answer, BaseModel):
        return False
    try:
        return bool(type(answer).model_validate(then) == answer)
    except ValidationError:
        return False


def same(then: Any, now: Any) -> bool:
    """The answer now says what it said then: every field it had is the same (a field added since,
    with its default, is not a decision)."""
    if isinstance(then, dict):
        return isinstance(now, dict) and all(k in now and same(v, now[k]) for k, v in then.items())
    if isinstance(then, list):
        return isinstance(now, list) and len(then) == len(now) and all(map(same, then, now))
    return bool(then == now)
