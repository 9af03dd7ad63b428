"""Health signals start remediations: agent -> Prometheus -> Alertmanager -> webhook -> workflow,
with Debian's real Prometheus and Alertmanager on loopback; plus the agent's direct path and the
Slurm health-check hook."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from gpuheal.core import ids, queries
from gpuheal.core import search_attributes as sa
from gpuheal.core.messages import INCIDENT
from gpuheal.core.settings import Settings
from gpuheal.triggers.webhook import serve
from gpuheal.workers.main import make_worker
from infra.sandbox.monitoring import Monitoring
from infra.sandbox.stack import Sandbox

pytestmark = pytest.mark.integration
GPUHEAL = os.path.join(os.path.dirname(sys.executable), "gpuheal")
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2345, name=python, GPU has fallen off the bus.\n"


def spawn_agent(sb: Sandbox, settings: Settings, kmsg: Path, port: int, *extra: str) -> subprocess.Popen[bytes]:
    env = {**sb.env(), "GPUHEAL_CLUSTER": settings.cluster}
    log = open(sb.root / f"agent-{port}.log", "ab")
    proc = subprocess.Popen(
        [GPUHEAL, "agent", "--node", "gpu01", "--metrics-port", str(port), "--kmsg", str(kmsg), *extra],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    for _ in range(100):  # ready when it serves metrics
        if "agent metrics on" in (sb.root / f"agent-{port}.log").read_text():
            return proc
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("agent did not start")


async def incident_started(client: Client, workflow_id: str, timeout: float) -> WorkflowHandle[object, object]:
    handle = client.get_workflow_handle(workflow_id)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            await handle.describe()
            return handle
        except RPCError:
            await asyncio.sleep(0.2)
    raise AssertionError(f"no workflow {workflow_id} within {timeout:.0f} s")


@pytest.fixture
def kmsg(tmp_path: Path) -> Path:
    path = tmp_path / "kmsg"
    path.write_text("NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n")
    return path


@pytest.fixture
def agent(webhook: Sandbox, settings: Settings, kmsg: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = spawn_agent(webhook, settings, kmsg, 29410)
    yield proc
    Sandbox.stop_process(proc)


@pytest.fixture
def monitoring(webhook: Sandbox, agent: subprocess.Popen[bytes]) -> Iterator[Monitoring]:
    mon = Monitoring(
        webhook.root / "monitoring", webhook.webhook_url, webhook.root / "webhook.token", agents={"gpu01": 29410}
    )
    mon.start()
    yield mon
    mon.stop()


@pytest.fixture
async def cleanup(client: Client, settings: Settings) -> AsyncIterator[None]:
    yield  # no worker runs here: end the incidents these tests start
    running = queries.where(queries.eq(sa.CLUSTER, settings.cluster or ""), queries.status("Running"))
    async for wf in client.list_workflows(running):
        await client.get_workflow_handle(wf.id).terminate("test over")


async def test_kernel_xid_reaches_a_workflow_through_prometheus_and_alertmanager(
    monitoring: Monitoring, kmsg: Path, settings: Settings, client: Client, cleanup: None
) -> None:
    with kmsg.open("a") as f:
        f.write(XID79)
    handle = await incident_started(client, ids.incident_id(settings.cluster, "gpu01"), 60)
    history = await handle.fetch_history()
    start = history.events[0].workflow_execution_started_event_attributes
    payload = start.input.payloads[0].data.decode()
    assert '"source":"alertmanager"' in payload and '"xid":79' in payload and '"node":"gpu01"' in payload
    summary = await (await handle.describe()).static_summary()
    assert summary is not None and "XID 79" in summary


async def test_agent_direct_report_starts_a_workflow(
    webhook: Sandbox, settings: Settings, client: Client, kmsg: Path, cleanup: None
) -> None:
    proc = spawn_agent(webhook, settings, kmsg, 29411, "--report-to", webhook.webhook_url)
    try:
        with kmsg.open("a") as f:
            f.write(XID79)
        handle = await incident_started(client, ids.incident_id(settings.cluster, "gpu01"), 20)
    finally:
        Sandbox.stop_process(proc)
    history = await handle.fetch_history()
    assert (
        b'"source":"alertmanager"'
        in history.events[0].workflow_execution_started_event_attributes.input.payloads[0].data
    )  # the agent speaks the Alertmanager format to the one webhook


async def test_slurm_health_check_hook_reports_instead_of_draining(
    webhook: Sandbox, settings: Settings, client: Client, cleanup: None
) -> None:
    # No NVIDIA driver here while the node should have 8 GPUs: a real failure mode.
    env = {
        **webhook.env(),
        "GPUHEAL_CLUSTER": settings.cluster,
        "SLURMD_NODENAME": "gpu02",
        "GPUHEAL_EXPECT_GPUS": "8",
        "GPUHEAL_WEBHOOK_URL": webhook.webhook_url,
        "GPUHEAL_BIN": GPUHEAL,
        "GPUHEAL_HEALTHCHECK_ENV": "/nonexistent",
    }
    script = Path(__file__).parents[2] / "infra" / "slurm" / "healthcheck.sh"
    out = await asyncio.to_thread(subprocess.run, [str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "health_check_failed" in out.stdout and "(reported)" in out.stdout
    handle = await incident_started(client, ids.incident_id(settings.cluster, "gpu02"), 10)
    assert handle.id.endswith("gpu02")
    assert "DRAIN" not in webhook.slurm("sinfo", "-h", "-n", "gpu02", "-o", "%T").upper()


async def test_fifty_firing_alerts_for_one_node_start_one_workflow(
    webhook: Sandbox, settings: Settings, client: Client, cleanup: None
) -> None:
    payload = webhook.alertmanager_payload("gpu01", 79)
    alert = payload["alerts"][0]  # type: ignore[index]
    alert["labels"]["cluster"] = settings.cluster
    alerts = []
    for i in range(50):
        a = {**alert, "labels": {**alert["labels"], "gpu": str(i % 8)}, "fingerprint": f"fp{i}"}
        alerts.append(a)
    payload["alerts"] = alerts
    status, body = await asyncio.to_thread(webhook.post_alert, payload)
    assert status == 200, body
    assert {s["workflow_id"] for s in body["started_or_joined"]} == {  # type: ignore[union-attr]
        ids.incident_id(settings.cluster, "gpu01")
    }
    await asyncio.sleep(1)
    incidents = queries.where(queries.of_type(INCIDENT), queries.eq(sa.CLUSTER, settings.cluster or ""))
    assert (await client.count_workflows(incidents)).count == 1


async def test_an_alert_for_another_cluster_is_refused_by_the_running_webhook(
    webhook: Sandbox, settings: Settings, client: Client, cleanup: None
) -> None:
    """Prometheus's `cluster` external label differing from GPUHEAL_CLUSTER (or a forged label):
    the webhook refuses the payload (400, naming both), and no incident, no coordinator of that
    name and no drain come of it, with this cluster's worker running."""
    payload = webhook.alertmanager_payload("gpu01", 79, cluster="prod-east")
    async with make_worker(client, settings):
        status, body = await asyncio.to_thread(webhook.post_alert, payload)
        assert status == 400, body
        assert f"'prod-east' is not this endpoint's cluster {settings.cluster!r}" in str(body["error"])
        await asyncio.sleep(3)
    anything = queries.where(queries.eq(sa.CLUSTER, "prod-east"))
    assert (await client.count_workflows(anything)).count == 0
    with pytest.raises(RPCError):
        await client.get_workflow_handle(ids.coordinator_id("prod-east")).describe()
    with pytest.raises(RPCError):
        await client.get_workflow_handle(ids.incident_id(settings.cluster or "", "gpu01")).describe()
    assert not webhook.nodes()["gpu01"].drained


async def test_alerts_beyond_the_rate_limit_still_start_through_alertmanagers_retries(
    slurm: Sandbox, settings: Settings, client: Client, tmp_path: Path, cleanup: None
) -> None:
    """Three nodes' alerts (grouped by node: three POSTs at once) against a webhook admitting one
    now and one every 5 s: the refused POSTs are answered 503, which Debian's real Alertmanager
    retries at once; a 429 it would keep until the group's next interval (5 minutes here)."""
    limited = settings.model_copy(update={"webhook_rate": 0.2, "webhook_burst": 1})
    runner = await serve(limited, "127.0.0.1", slurm.webhook_port, client)
    am = Monitoring(
        tmp_path / "am",
        slurm.webhook_url,
        slurm.root / "webhook.token",
        agents={},
        alertmanager_port=slurm.webhook_port + 7,
        group_interval="5m",
    )
    try:
        await asyncio.to_thread(am.start, False)
        nodes = ("gpu01", "gpu02", "gpu03")
        labels = {"alertname": "GpuXidError", "gpuheal": "true", "cluster": settings.cluster or "", "xid": "79"}
        await asyncio.to_thread(am.fire, *({**labels, "node": node, "gpu": "0"} for node in nodes))
        for node in nodes:
            await incident_started(client, ids.incident_id(settings.cluster, node), 60)
        refused = await asyncio.to_thread(am.metric, "alertmanager_notification_requests_failed_total")
        assert refused >= 2  # each of two nodes' first POSTs was refused, then retried and started
    finally:
        am.stop()
        await runner.cleanup()
