"""The webhook's HTTP contract, in process (the integration tests run it against Temporal)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from pydantic import SecretStr

from gpuheal.core import ids
from gpuheal.core.errors import SettingsError
from gpuheal.core.models.report import HealthReport
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import AlreadyHandled
from gpuheal.triggers.webhook import make_app

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def body(status: str = "firing", **labels: str) -> dict[str, Any]:
    alert = {"status": status, "labels": labels or {"node": "gpu01", "xid": "79"}, "startsAt": "2026-11-30T01:00:00Z"}
    return {"version": "4", "status": status, "alerts": [alert]}


async def client_for(
    started: list[HealthReport], settings: dict[str, Any] | None = None, **kw: Any
) -> TestClient[Any, Any]:
    async def start(report: HealthReport) -> str:
        started.append(report)
        return ids.incident_id(report.cluster, report.node)

    app = make_app(Settings(webhook_token=SecretStr(TOKEN), cluster="c1", **(settings or {})), start, **kw)
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


def test_refuses_to_run_without_a_token() -> None:
    async def start(report: HealthReport) -> str:
        return ""

    with pytest.raises(ValueError, match="GPUHEAL_WEBHOOK_TOKEN"):
        make_app(Settings(cluster="c1"), start)


async def test_good_alert_starts_and_resolved_alert_does_not() -> None:
    started: list[HealthReport] = []
    client = await client_for(started)
    try:
        resp = await client.post("/alertmanager", json=body(), headers=AUTH)
        assert resp.status == 200
        assert (await resp.json())["started_or_joined"][0]["workflow_id"] == "gpuheal-c1-gpu01"
        resp = await client.post("/alertmanager", json=body(status="resolved", node="gpu02", xid="79"), headers=AUTH)
        assert resp.status == 200 and (await resp.json())["resolved_ignored"] == 1
        assert [r.node for r in started] == ["gpu01"]
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("data", "headers", "status", "reason"),
    [
        (b'{"version": "4"', AUTH, 400, "not JSON"),
        (b'{"version": "4", "status": "firing", "alerts": []}', AUTH, 400, "alerts"),
        (b"{}", {"Authorization": "Bearer nope"}, 401, "bearer token"),
        (b"{}", {}, 401, "bearer token"),
        (b"x" * (257 * 1024), AUTH, 413, "larger than"),
    ],
)
async def test_bad_requests_are_refused_with_a_reason(
    data: bytes, headers: dict[str, str], status: int, reason: str
) -> None:
    started: list[HealthReport] = []
    client = await client_for(started)
    try:
        resp = await client.post("/alertmanager", data=data, headers=headers)
        assert resp.status == status
        assert reason in (await resp.text())
        assert started == []
    finally:
        await client.close()


async def test_a_request_beyond_the_rate_limit_gets_a_503_alertmanager_retries() -> None:
    """Alertmanager's webhook notifier retries a 5xx at once and a 429 never (only at the group's
    next interval): the limit answers 503 with Retry-After, and the limit is the settings'."""
    started: list[HealthReport] = []
    client = await client_for(started, {"webhook_rate": 0.001, "webhook_burst": 2})
    try:
        answers = [await client.post("/alertmanager", json=body(), headers=AUTH) for _ in range(3)]
        assert [a.status for a in answers] == [200, 200, 503]
        assert 990 <= int(answers[2].headers["Retry-After"]) <= 1000  # the next token, at 0.001 a second
        assert "GPUHEAL_WEBHOOK_RATE" in (await answers[2].json())["error"]
    finally:
        await client.close()
    assert len(started) == 2  # the refused one started nothing


def test_the_rate_limit_is_read_from_the_environment_and_checked() -> None:
    s = Settings.from_env({"GPUHEAL_WEBHOOK_RATE": "5", "GPUHEAL_WEBHOOK_BURST": "7"})
    assert (s.webhook_rate, s.webhook_burst) == (5.0, 7)
    with pytest.raises(SettingsError, match="GPUHEAL_WEBHOOK_RATE"):
        Settings.from_env({"GPUHEAL_WEBHOOK_RATE": "0"})


async def test_a_payloads_nodes_start_together_each_nodes_reports_in_order() -> None:
    """gpu01's first start waits until gpu02's has begun: handled one after another, this payload
    would never finish. gpu01's second report waits for its first (it joins what that started)."""
    calls: list[str] = []
    gpu02_begun = asyncio.Event()

    async def start(report: HealthReport) -> str:
        calls.append(f"{report.node}:{report.xid}:begin")
        if report.node == "gpu02":
            gpu02_begun.set()
        elif report.xid == 79:
            await asyncio.wait_for(gpu02_begun.wait(), 5)
        calls.append(f"{report.node}:{report.xid}:end")
        return ids.incident_id(report.cluster, report.node)

    client = TestClient(TestServer(make_app(Settings(webhook_token=SecretStr(TOKEN), cluster="c1"), start)))
    await client.start_server()
    payload = body(node="gpu01", xid="79")
    for node, xid in (("gpu01", "48"), ("gpu02", "79")):
        payload["alerts"].append({**payload["alerts"][0], "labels": {"node": node, "xid": xid}})
    try:
        resp = await client.post("/alertmanager", json=payload, headers=AUTH)
        assert resp.status == 200, await resp.text()
        answer = await resp.json()
    finally:
        await client.close()
    assert [s["workflow_id"] for s in answer["started_or_joined"]] == ["gpuheal-c1-gpu01"] * 2 + ["gpuheal-c1-gpu02"]
    gpu01 = [c for c in calls if c.startswith("gpu01")]
    assert gpu01 == ["gpu01:79:begin", "gpu01:79:end", "gpu01:48:begin", "gpu01:48:end"]


async def test_an_alert_already_handled_names_its_incident_and_starts_nothing() -> None:
    asked: list[HealthReport] = []

    async def start(report: HealthReport) -> str | AlreadyHandled:
        """As start_unless_handled answers a report an incident already handled: nothing started."""
        asked.append(report)
        return AlreadyHandled(
            incident_id=ids.incident_id(report.cluster, "gpu01"), run_id="r1", kind="same_alert", why="the same alert"
        )

    app = make_app(Settings(webhook_token=SecretStr(TOKEN), cluster="c1"), start)
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        resp = await client.post("/alertmanager", json=body(), headers=AUTH)
        assert resp.status == 200
        answer = await resp.json()
    finally:
        await client.close()
    (skipped,) = answer["already_handled"]
    assert (skipped["by"], skipped["run_id"]) == ("gpuheal-c1-gpu01", "r1")
    assert skipped["why"] == "gpuheal-c1-gpu01 (the same alert)" and "gpu01" in skipped["report"]
    assert answer["started_or_joined"] == [] and [r.node for r in asked] == ["gpu01"]  # asked once, one Temporal call


async def test_a_give_back_alert_asks_the_borrowing_incident_and_starts_nothing() -> None:
    started: list[HealthReport] = []
    asked: list[str] = []

    async def start(report: HealthReport) -> str:
        started.append(report)
        return ""

    async def give_back(request: object) -> str:
        asked.append(getattr(request, "node", ""))
        return "inf02 goes back"

    app = make_app(Settings(webhook_token=SecretStr(TOKEN), cluster="c1"), start, give_back=give_back)
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        resp = await client.post("/alertmanager", json=body(node="inf02", gpuheal_action="give_back"), headers=AUTH)
        assert resp.status == 200
        assert (await resp.json())["give_back"] == ["inf02 goes back"]
    finally:
        await client.close()
    assert asked == ["inf02"] and started == []


async def test_a_refused_alert_quotes_the_offending_value_escaped_and_cut() -> None:
    started: list[HealthReport] = []
    client = await client_for(started)
    try:
        resp = await client.post("/alertmanager", json=body(node="gpu01;reboot\n" + "x" * 200, xid="79"), headers=AUTH)
        assert resp.status == 400
        (rejected,) = (await resp.json())["rejected"]
        assert "node: String should match pattern" in rejected["reason"]
        assert "(got 'gpu01;reboot\\n" in rejected["reason"] and "...')" in rejected["reason"]  # escaped, cut
        assert len(rejected["reason"]) < 200 and started == []
    finally:
        await client.close()


@pytest.mark.parametrize("labels", [{"cluster": "prod-east"}, {"cluster": "c2", "gpuheal_action": "give_back"}])
async def test_an_alert_labelled_for_another_cluster_is_refused_and_starts_nothing(labels: dict[str, str]) -> None:
    """Prometheus's external label (or a forged one) never picks another coordinator: the whole
    payload is refused, the good alert beside it included, naming the label and this cluster."""
    started: list[HealthReport] = []
    asked: list[object] = []

    async def give_back(request: object) -> str:
        asked.append(request)
        return ""

    client = await client_for(started, give_back=give_back)
    try:
        payload = body(node="gpu01", xid="79")
        foreign = {
            "status": "firing",
            "labels": {"node": "gpu02", "xid": "79", **labels},
            "startsAt": "2026-11-30T01:00:00Z",
        }
        payload["alerts"].append(foreign)
        resp = await client.post("/alertmanager", json=payload, headers=AUTH)
        assert resp.status == 400
        error = (await resp.json())["error"]
        assert f"cluster label {labels['cluster']!r} is not this endpoint's cluster 'c1'" in error
        assert "nothing started" in error
    finally:
        await client.close()
    assert started == [] and asked == []
