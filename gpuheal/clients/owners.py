"""Telling a job's owner: a generic webhook with per-user routing, or Slack's payload.

Where a notice goes: the route for the job's Slurm user (GPUHEAL_OWNER_ROUTES, a JSON object
`{"alice": "https://...", "*": "https://..."}` inline or in a file), else the default route
(`"*"`, or GPUHEAL_OWNER_NOTIFY_URL). The payload is gpuheal's JSON (`format=generic`: the
notice's fields, for a bridge that mails or pages the recipients) or Slack's incoming-webhook
body (`format=slack`: `{"text": ...}`). Every POST carries an Idempotency-Key naming the notice
(job recovery, job, stage): a receiver drops a repeat, and gpuheal sends each notice from one
activity, once.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Literal, Protocol

import aiohttp

from gpuheal.core.jobs import OwnerNotice

log = logging.getLogger("gpuheal.owners")
OwnerFormat = Literal["generic", "slack"]


class OwnerNotifier(Protocol):
    async def send(self, notice: OwnerNotice) -> str:
        """Deliver the notice; returns where it went (for the incident's record)."""
        ...


def load_routes(value: str | None) -> dict[str, str]:
    """GPUHEAL_OWNER_ROUTES: inline JSON, or the path of a JSON file."""
    if not value:
        return {}
    text = Path(value).read_text() if not value.lstrip().startswith("{") else value
    routes = json.loads(text)
    if not isinstance(routes, dict) or not all(isinstance(v, str) for v in routes.values()):
        raise ValueError("GPUHEAL_OWNER_ROUTES must map Slurm user names (or '*') to webhook URLs")
    return {str(k): v for k, v in routes.items()}


class LogOwnerNotifier:
    """Every notice as a structured log line, when no route is configured (and always beside one)."""

    async def send(self, notice: OwnerNotice) -> str:
        log.info(json.dumps(notice.model_dump(mode="json"), sort_keys=True))
        return "log"


class WebhookOwnerNotifier:
    def __init__(self, routes: dict[str, str], fmt: OwnerFormat = "generic", timeout_s: float = 10.0) -> None:
        self._routes = routes
        self._format = fmt
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    def route(self, user: str) -> str | None:
        return self._routes.get(user) or self._routes.get("*")

    def body(self, notice: OwnerNotice) -> dict[str, object]:
        if self._format == "slack":
            return {"text": notice.message, "username": "gpuheal"}
        return notice.model_dump(mode="json")

    async def send(self, notice: OwnerNotice) -> str:
        await LogOwnerNotifier().send(notice)
        url = self.route(notice.user)
        if url is None:
            return "log (no route for this user)"
        headers = {"Idempotency-Key": notice.key}
        async with aiohttp.ClientSession(timeout=self._timeout) as session:
            async with session.post(url, json=self.body(notice), headers=headers) as resp:
                if resp.status >= 300:
                    raise RuntimeError(f"owner webhook for {notice.user!r} answered HTTP {resp.status}")
        return f"webhook ({'user route' if notice.user in self._routes else 'default route'})"
