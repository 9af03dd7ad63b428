"""The Grafana dashboard's queries, evaluated by a real Prometheus scraping a real worker after a
real incident: every panel returns data (a dashboard whose queries name metrics that do not
exist shows empty panels, silently)."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from temporalio.client import Client

from gpuheal.triggers.start import start_or_join
from infra.sandbox import MONITORING
from infra.sandbox.monitoring import Monitoring
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import report, until, worker_env

pytestmark = pytest.mark.integration

DASHBOARD = MONITORING / "grafana-dashboard.json"


def panel_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p["targets"]]


def test_the_dashboard_is_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and dashboard["uid"] == "gpuheal"
    for p in dashboard["panels"]:
        assert p["targets"] and p["datasource"]["uid"] == "${datasource}", p["title"]
    exprs = " ".join(e for _, e in panel_queries())
    for metric in ("incidents_open", "mttr_seconds", "stage_duration", "detection_seconds", "fleet_budget", "breaker"):
        assert metric in exprs  # what the issue asks the dashboard to show


@pytest.fixture
def monitored(slurm: Sandbox, settings: Any) -> Iterator[Monitoring]:
    """The worker as its own process (metrics on slurm.metrics_port, the SDK's on +1), scraped."""
    with worker_env(slurm, settings):
        worker = slurm.start_worker()
        mon = Monitoring(
            slurm.root / "monitoring-dash",
            slurm.webhook_url,
            slurm.root / "webhook.token",
            agents={},
            workers=(slurm.metrics_port, slurm.metrics_port + 1),
        )
        try:
            mon.start()
            yield mon
        finally:
            mon.stop()
            Sandbox.stop_process(worker)


async def test_every_panel_returns_data_after_an_incident(
    monitored: Monitoring, slurm: Sandbox, settings: Any, client: Client
) -> None:
    # Scraped before anything happens: a rate needs a sample from before the first observation.
    def scraped() -> bool:
        return len([r for r in monitored.query('up{job="gpuheal-worker"} == 1')]) == 2

    await until(scraped, "Prometheus scraping the worker")

    async def incident(node: str) -> None:
        handle = await start_or_join(client, settings, report(settings, node, 48))
        result = await asyncio.wait_for(handle.result(), 120)
        assert result.outcome == "resolved"

    async def panels_without_data() -> list[str]:
        missing = []
        for title, expr in panel_queries():
            values = [float(r["value"][1]) for r in await asyncio.to_thread(monitored.query, expr)]  # type: ignore[index]
            if not any(math.isfinite(v) for v in values):
                missing.append(f"{title}: {expr}")
        return missing

    # Two incidents, so the SDK's own series move after they first appear; a third if a rate
    # still has only one sample of them (a slow scrape can land after the second incident).
    for node in ("gpu02", "gpu03"):
        await incident(node)
    # Scrapes every second; the fleet gauges refresh every 15 s in the worker.
    missing: list[str] = []
    for tick in range(60):
        missing = await panels_without_data()
        if not missing:
            return
        if tick == 20 and all("Temporal SDK" in m for m in missing):
            await incident("gpu01")
        await asyncio.sleep(1)
    samples = await asyncio.to_thread(monitored.query, "temporal_workflow_task_schedule_to_start_latency_count[5m]")
    raise AssertionError("panels without data:\n" + "\n".join(missing) + f"\nSDK samples: {samples}")
