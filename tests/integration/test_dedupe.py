"""Dedupe by the failure, not the node, on the real Temporal dev server and Slurm sandbox: the
webhook with a 600 s duplicate window, alerts as Alertmanager posts them."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from temporalio.client import Client

from gpuheal.core.messages import INCIDENT
from gpuheal.core.models.base import ActionClass
from gpuheal.core.settings import Settings
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
