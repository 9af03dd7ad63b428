"""Notifiers: how people hear about an incident.

Every event is a structured log line (logger ``gpuheal.events``, one JSON object). A webhook
notifier can also POST it (Slack-compatible receivers, PagerDuty Events bridges, ...). The POST
carries an ``Idempotency-Key`` so a receiver can drop the duplicate a retried activity may send.
"""

from __future__ import annotations

import json
import logging
from typing import Protocol

import aiohttp

from gpuheal.core.models.result import Notification

events_log = logging.getLogger("gpuheal.events")


class Notifier(Protocol):
    async def send(self, note: Notification) -> None: ...


class LogNotifier:
    async def send(self, note: Notification) -> None:
        events_log.info(json.dumps(note.model_dump(mode="json"), sort_keys=True))


class WebhookNotifier:
    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self._url = url
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def send(self, note: Notification) -> None:
        body = note.model_dump(mode="json") | {"text": f"[{note.severity}] {note.message}"}
        headers = {"Idempotency-Key": note.key or f"{note.incident_id}:{note.event}"}
        async with aiohttp.ClientSession(timeout=self._timeout) as session:
            async with session.post(self._url, json=body, headers=headers) as resp:
                if resp.status >= 300:
                    raise RuntimeError(f"notification webhook answered HTTP {resp.status}")


class FanOut:
    def __init__(self, *notifiers: Notifier) -> None:
        self._notifiers = notifiers

    async def send(self, note: Notification) -> None:
        for n in self._notifiers:
            await n.send(note)
