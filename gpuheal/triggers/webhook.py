"""HTTP endpoint for Alertmanager's webhook receiver: POST /alertmanager.

It starts (or joins) one remediation per failing node. Because it can start remediations, every
request must carry `Authorization: Bearer <GPUHEAL_WEBHOOK_TOKEN>`; the server will not start
without a token. Bodies are limited in size and validated; a malformed body gets HTTP 400 with
the reason and starts nothing. A token bucket limits the request rate (GPUHEAL_WEBHOOK_RATE and
GPUHEAL_WEBHOOK_BURST); a request beyond it gets 503 with Retry-After, because Alertmanager's
webhook notifier retries only a 5xx: a 429 would wait for the group's next interval (minutes).

Reports are checked and started at most REPORTS_AT_ONCE at a time in the whole process (what it
asks of Temporal at once, whatever the burst admits); a payload's nodes together, one node's
reports in order, so what the first started the next joins or names as handled.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from pydantic import ValidationError
from temporalio.client import Client

from gpuheal.clients.slurm import build_slurm
from gpuheal.core.errors import describe_error
from gpuheal.core.models.report import HealthReport
from gpuheal.core.settings import Settings
from gpuheal.triggers.alertmanager import AlertmanagerPayload, GiveBack, to_reports
from gpuheal.triggers.start import (
    AlreadyHandled,
    NodeProbe,
    foreign_cluster,
    give_back_borrowed,
    slurm_probe,
    start_unless_handled,
)

log = logging.getLogger("gpuheal.webhook")

MAX_BODY_BYTES = 256 * 1024
REPORTS_AT_ONCE = 16  # reports checked and started at once by one webhook process (Temporal calls in flight)
# Starts or joins the node's incident (its workflow id), or says which incident already handled it.
Starter = Callable[[HealthReport], Awaitable[str | AlreadyHandled]]
GiveBacker = Callable[[GiveBack], Awaitable[str]]  # asks the incident that borrowed the node


class TokenBucket:
    def __init__(self, rate_per_s: float, burst: int) -> None:
        self.rate, self.burst = rate_per_s, float(burst)
        self.tokens, self.at = float(burst), time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False

    def wait_s(self) -> int:
        """Whole seconds until the next token (Retry-After), at least 1."""
        return max(1, math.ceil((1 - self.tokens) / self.rate))


Outcome = tuple[str, str] | AlreadyHandled | Exception  # (workflow id, report) started, or why not
Handler = Callable[[HealthReport], Awaitable[Outcome]]


async def _each_node_in_turn(reports: list[HealthReport], one: Handler, gate: asyncio.Semaphore) -> list[Outcome]:
    """`one` for every report: nodes together (within the process's `gate`), each node's in order."""
    by_node: dict[str, list[int]] = {}
    for i, report in enumerate(reports):
        by_node.setdefault(report.node, []).append(i)
    outcomes: list[Outcome | None] = [None] * len(reports)

    async def node(indexes: list[int]) -> None:
        async with gate:
            for i in indexes:
                outcomes[i] = await one(reports[i])

    await asyncio.gather(*(node(indexes) for indexes in by_node.values()))
    return [o for o in outcomes if o is not None]  # every one set: gather waited for each node


def _error(status: int, reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=status)


def make_app(
    settings: Settings,
    start: Starter,
    *,
    give_back: GiveBacker | None = None,
) -> web.Application:
    if settings.webhook_token is None or not settings.webhook_token.get_secret_value():
        raise ValueError("GPUHEAL_WEBHOOK_TOKEN is not set: the webhook refuses to run unauthenticated")
    expected = f"Bearer {settings.webhook_token.get_secret_value()}".encode()
    cluster = settings.require_cluster()  # alerts without a cluster label belong to this one
    bucket = TokenBucket(settings.webhook_rate, settings.webhook_burst)
    gate = asyncio.Semaphore(REPORTS_AT_ONCE)  # the whole process's reports in flight to Temporal

    async def check_and_start(report: HealthReport) -> Outcome:
        try:
            # the same alert, or the same failure while its node is out: the starter starts
            # nothing and names the incident that handled it (start_unless_handled)
            started = await start(report)
            return started if isinstance(started, AlreadyHandled) else (started, report.describe())
        except Exception as err:
            # Neither a guess nor the whole payload: the other reports go on, and the 503 below
            # makes Alertmanager send the group again (a started one is joined then).
            log.error("could not check or start remediation for %s: %s", report.describe(), err)
            return err

    async def alertmanager(request: web.Request) -> web.Response:
        given = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            return _error(401, "missing or wrong bearer token")
        if not bucket.take():
            wait = bucket.wait_s()
            response = _error(503, f"rate limit exceeded (GPUHEAL_WEBHOOK_RATE); retry in {wait} s")
            response.headers["Retry-After"] = str(wait)
            return response
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            return _error(413, f"body larger than {MAX_BODY_BYTES} bytes")
        try:
            raw = await request.content.read(MAX_BODY_BYTES + 1)
        except Exception as err:
            return _error(400, f"could not read body: {err}")
        if len(raw) > MAX_BODY_BYTES:
            return _error(413, f"body larger than {MAX_BODY_BYTES} bytes")
        try:
            payload = AlertmanagerPayload.model_validate(json.loads(raw))
        except json.JSONDecodeError as err:
            return _error(400, f"body is not JSON: {err}")
        except ValidationError as err:
            return _error(400, f"not an Alertmanager v4 payload: {describe_error(err)}")
        parsed = to_reports(payload, cluster)
        # One cluster, one authority: a label never picks another coordinator (its own budget and
        # breaker) or reaches another cluster's incidents. The whole payload is refused, so the
        # misrouting shows in Alertmanager's log instead of half a group being acted on.
        foreign = sorted(({r.cluster for r in parsed.reports} | {g.cluster for g in parsed.give_backs}) - {cluster})
        if foreign:  # Alertmanager does not retry a 400: said loudly here too
            log.error("refused a payload of %d alert(s): %s", len(payload.alerts), foreign_cluster(foreign, cluster))
            return _error(400, foreign_cluster(foreign, cluster))
        if not parsed.reports and not parsed.give_backs and parsed.rejected:
            return web.json_response(
                {"error": "no alert could be used", "rejected": [r.model_dump() for r in parsed.rejected]},
                status=400,
            )
        started: list[dict[str, str]] = []
        skipped: list[dict[str, str]] = []
        failed: list[dict[str, str]] = []
        for report, outcome in zip(
            parsed.reports, await _each_node_in_turn(parsed.reports, check_and_start, gate), strict=True
        ):
            if isinstance(outcome, Exception):
                failed.append({"report": report.describe(), "error": str(outcome) or type(outcome).__name__})
            elif isinstance(outcome, AlreadyHandled):
                by = {"by": outcome.incident_id, "run_id": outcome.run_id, "why": str(outcome)}
                skipped.append({**by, "report": report.describe()})
            else:
                log.info("report %s -> %s", outcome[1], outcome[0])
                started.append({"workflow_id": outcome[0], "report": outcome[1]})
        answers: list[str] = []
        for request_ in parsed.give_backs:
            if give_back is None:
                return _error(501, "this webhook does not take give-back alerts")
            answers.append(await give_back(request_))
        answer = {
            "started_or_joined": started,
            "already_handled": skipped,
            "give_back": answers,
            "rejected": [r.model_dump() for r in parsed.rejected],
            "resolved_ignored": parsed.resolved,
        }
        if failed:
            return web.json_response({**answer, "error": "could not start remediation", "failed": failed}, status=503)
        return web.json_response(answer)

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post("/alertmanager", alertmanager)
    app.router.add_get("/healthz", healthz)
    return app


def temporal_starter(client: Client, settings: Settings) -> Starter:
    """The duplicate check and the start together (start_unless_handled): one Temporal call for a
    node with no closed incident, as a storm's are."""
    probe = _in_service_probe(settings)

    async def start(report: HealthReport) -> str | AlreadyHandled:
        started = await start_unless_handled(client, settings, report, node_in_service=probe)
        return started if isinstance(started, AlreadyHandled) else started.id

    return start


def temporal_give_back(client: Client, settings: Settings) -> GiveBacker:
    async def give_back(request: GiveBack) -> str:
        return await give_back_borrowed(client, settings, request.cluster, request.node, "alertmanager", request.reason)

    return give_back


def _in_service_probe(settings: Settings) -> NodeProbe | None:
    """Where the webhook can reach Slurm, Slurm says whether a node is back in service (else the
    incidents' records stand)."""
    try:
        return slurm_probe(build_slurm(settings.slurm))
    except ValueError as err:  # SettingsError: no slurmrestd address or token
        log.info("the duplicate check will not ask Slurm whether a node is back in service: %s", err)
        return None


async def serve(settings: Settings, host: str, port: int, client: Client) -> web.AppRunner:
    app = make_app(
        settings,
        temporal_starter(client, settings),
        give_back=temporal_give_back(client, settings),
    )
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    log.info("webhook listening on http://%s:%d/alertmanager", host, port)
    return runner
