"""`gpuheal agent`: run the node health agent until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import signal
import threading

from prometheus_client import CollectorRegistry, start_http_server

from gpuheal.core.models.base import NodeName
from gpuheal.core.settings import Settings
from gpuheal.triggers.agent import Agent, AgentMetrics, WebhookReporter
from gpuheal.triggers.nvml import Nvml

log = logging.getLogger("gpuheal.agent")


def build_reporter(settings: Settings, url: str | None) -> WebhookReporter | None:
    if not url:
        return None
    if settings.webhook_token is None:
        raise ValueError("--report-to needs GPUHEAL_WEBHOOK_TOKEN (the webhook's bearer token)")
    return WebhookReporter(url, settings.webhook_token.get_secret_value(), settings.cluster)


def run_agent(settings: Settings, node: NodeName, port: int, kmsg: str, poll_s: float, report_to: str | None) -> int:
    from pydantic import TypeAdapter

    TypeAdapter(NodeName).validate_python(node)
    registry = CollectorRegistry()
    agent = Agent(
        node,
        AgentMetrics(registry),
        nvml=Nvml(),
        kmsg_path=None if kmsg == "none" else kmsg,
        reporter=build_reporter(settings, report_to),
        poll_s=poll_s,
    )
    start_http_server(port, addr="127.0.0.1", registry=registry)
    problems = agent.start()
    log.info(
        "agent metrics on http://127.0.0.1:%d/metrics%s",
        port,
        "" if not problems else f" ({len(problems)} source(s) unavailable, see above)",
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    agent.stop()
    return 0
