"""Dedupe by the failure, not the node, on the real Temporal dev server and Slurm sandbox: the
webhook with a 600 s duplicate window, alerts as Alertmanager posts them."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    Client,
    DescribeWorkflowInput,
    Interceptor,
    OutboundInterceptor,
    WorkflowExecutionDescription,
)

from gpuheal.core.messages import INCIDENT
from gpuheal.core.models.base import ActionClass
from gpuheal.core.models.report import HealthReport
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import AlreadyHandled, start_unless_handled
from gpuheal.triggers.webhook import serve
from gpuheal.workers.main import make_worker
from infra.sandbox.stack import Sandbox

pytestmark = pytest.mark.integration


async def post(sb: Sandbox, payload: dict[str, Any]) -> dict[str, Any]:
    status, body = await asyncio.to_thread(sb.post_alert, payload)
    assert status == 200, body
    return cast("dict[str, Any]", body)


async def test_xid_79_a_second_after_an_ignored_xid_63_starts_a_new_incident(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    settings = settings.model_copy(update={"fleet": settings.fleet.model_copy(update={"duplicate_window_s": 600})})
    first_alert = slurm.alertmanager_payload("gpu02", 63, cluster=settings.cluster)
    runner = await serve(settings, "127.0.0.1", slurm.webhook_port, client)  # the webhook's own window: 600 s
    try:
        async with make_worker(client, settings):
            (started,) = (await post(slurm, first_alert))["started_or_joined"]
            incident = started["workflow_id"]
            first_run = (await client.get_workflow_handle(incident).describe()).run_id
            ignored = await asyncio.wait_for(INCIDENT.handle(client, incident, run_id=first_run).result(), 90)
            assert (ignored.outcome, ignored.action) == ("ignored", ActionClass.IGNORE)
            await asyncio.sleep(1)

            body = await post(slurm, slurm.alertmanager_payload("gpu02", 79, cluster=settings.cluster))
            assert body["already_handled"] == [], body  # not handed the XID 63 incident
            (started,) = body["started_or_joined"]
            second_run = (await client.get_workflow_handle(incident).describe()).run_id
            assert started["workflow_id"] == incident and second_run != first_run
            replaced = await asyncio.wait_for(INCIDENT.handle(client, incident, run_id=second_run).result(), 120)
            assert replaced.action == ActionClass.REPLACE_NODE and [r.xid for r in replaced.reports] == [79]
            assert replaced.outcome == "resolved", replaced.reason

            again = await post(slurm, first_alert)  # the XID 63 alert re-sent: still that incident's
            (handled,) = again["already_handled"]
            assert again["started_or_joined"] == [] and (handled["by"], handled["run_id"]) == (incident, first_run)
    finally:
        await runner.cleanup()


class Describes(Interceptor):
    """Counts the workflow describes a client sends: the duplicate check's first call."""

    def __init__(self) -> None:
        self.count = 0

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        outer = self

        class Counting(OutboundInterceptor):
            async def describe_workflow(self, input: DescribeWorkflowInput) -> WorkflowExecutionDescription:
                outer.count += 1
                return await super().describe_workflow(input)

        return Counting(next)


async def test_a_report_is_started_or_joined_in_one_call_unless_the_node_has_a_closed_incident(
    settings: Settings, client: Client
) -> None:
    """start_unless_handled on the real server (no worker: nothing runs): a node's first report
    starts its incident and a second joins it, neither asking the duplicate check (one call each);
    once that incident is closed, the next report goes through the duplicate check, and starts a
    new run (a terminated run swallows nothing)."""
    describes = Describes()
    config = client.config()
    config["interceptors"] = [*config["interceptors"], describes]  # (its data converter kept: pydantic)
    counted = Client(**config)
    first = HealthReport(node="gpu01", cluster=settings.cluster, xid=79, gpu=0, observed_at=datetime.now(UTC))
    started = await start_unless_handled(counted, settings, first)
    assert not isinstance(started, AlreadyHandled) and describes.count == 0
    second = first.model_copy(update={"xid": 94, "gpu": 1})
    joined = await start_unless_handled(counted, settings, second)
    assert not isinstance(joined, AlreadyHandled) and describes.count == 0
    run = (await client.get_workflow_handle(started.id).describe()).run_id
    signals = [e async for e in client.get_workflow_handle(started.id).fetch_history_events()]
    signalled = [e for e in signals if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED]
    assert len(signalled) == 2 and joined.first_execution_run_id in (run, None)  # both reports, one run
    await client.get_workflow_handle(started.id).terminate("test: closed")
    again = await start_unless_handled(counted, settings, first.model_copy(update={"observed_at": datetime.now(UTC)}))
    assert not isinstance(again, AlreadyHandled) and describes.count >= 1  # the duplicate check was asked
    assert (await client.get_workflow_handle(started.id).describe()).run_id != run
    await client.get_workflow_handle(started.id).terminate("test over")
