"""`gpuheal simulate --recorded`: this cluster's own closed incidents, read from the real
Temporal's visibility and results, replayed under a candidate policy: what it would have held
beside what each incident did, and nothing changed on the cluster (the coordinator's policy
stands)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from temporalio.client import Client

from gpuheal.core import ids
from gpuheal.core.messages import FLEET_POLICY, INCIDENT
from gpuheal.core.settings import Settings
from gpuheal.triggers.alertmanager import firing_payload
from gpuheal.workers.main import make_worker
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import gpuheal

pytestmark = pytest.mark.integration


async def test_recorded_incidents_under_a_stricter_rate_show_what_it_would_have_held(
    webhook: Sandbox, settings: Settings, client: Client, tmp_path: Path
) -> None:
    async with make_worker(client, settings):
        for node, xid in (("gpu02", 48), ("gpu01", 79)):  # a reset, then a replacement
            status, body = await asyncio.to_thread(
                webhook.post_alert, firing_payload(node, xid=xid, gpu="0", cluster=settings.cluster)
            )
            assert status == 200, body
            handle = INCIDENT.handle(client, ids.incident_id(settings.cluster or "", node))
            assert (await asyncio.wait_for(handle.result(), 150)).outcome == "resolved"
        candidate = tmp_path / "candidate.yaml"
        candidate.write_text("budget:\n  rate: 1\n")  # one remediation an hour (the cluster's is 1000)
        # (with the worker up: it answers the coordinator's policy, the what-if's base)
        args = ("simulate", "--recorded", "--nodes", "6")
        shown = await gpuheal(webhook, settings, *args, "--policy", str(candidate))
        as_json = await gpuheal(webhook, settings, *args, "--json")
        # A what-if changes nothing: the cluster's policy is still its own.
        current = await FLEET_POLICY.ask(client.get_workflow_handle(ids.coordinator_id(settings.cluster or "")))
    assert current.version == 1 and current.policy.budget.rate == 1000
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "2 closed incidents" in text and "the cluster's policy version 1" in text and "budget.rate" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "gpu0" in line]
    assert len(rows) == 2, text
    first, second = rows  # oldest first
    assert "gpu02" in first and "reset_gpu -> resolved" in first and "granted" in first
    assert "gpu01" in second and "replace_node -> resolved" in second
    assert "held: rate: 1 remediations within 3600 s" in second  # what the candidate would have done
    assert "would have: held 1, replaced 1" in text

    assert as_json.returncode == 0, as_json.stderr
    result = json.loads(as_json.stdout)
    assert [d["decision"] for d in result["decisions"]] == ["granted", "granted"]  # the current policy
