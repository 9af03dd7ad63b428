"""People actually told: a job's owner by e-mail through a real SMTP server (aiosmtpd, started
here) and the team's chat channel by its Slurm account; the operators' webhook keyed per incident
run, so a receiver that dedupes never drops a node's next incident."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from email import message_from_bytes
from email.message import Message
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from temporalio.client import Client

from gpuheal.core.settings import OwnerSettings, Settings
from gpuheal.triggers.start import start_or_join
from gpuheal.workers.main import make_worker
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import Inbox, report

pytestmark = pytest.mark.integration


class Mailbox:
    """aiosmtpd's handler: every message it accepts, with its envelope recipients."""

    def __init__(self) -> None:
        self.mail: list[tuple[list[str], Message]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.mail.append((list(envelope.rcpt_tos), message_from_bytes(envelope.content)))
        return "250 OK"


@pytest.fixture
def smtp() -> Iterator[tuple[int, Mailbox]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    box = Mailbox()
    server = Controller(box, hostname="127.0.0.1", port=port)
    server.start()
    yield port, box
    server.stop()


async def test_the_owner_is_mailed_and_the_team_channel_told_once_per_event(
    slurm: Sandbox, settings: Settings, client: Client, smtp: tuple[int, Mailbox], receiver: tuple[str, Inbox]
) -> None:
    port, box = smtp
    url, chat = receiver
    owners = OwnerSettings(
        routes=json.dumps({"account:ml-research": url, "user:bob": "http://127.0.0.1:9/never"}),
        smtp_host="127.0.0.1",
        smtp_port=port,
        mail_from="gpuheal@cluster.example",
        mail_allowed="example.com",  # (none by default: a job names any address it likes)
    )
    settings = settings.model_copy(update={"owners": owners})
    job = slurm.submit_training(
        "mailed",
        step_s=1.0,
        sbatch_args=("--mail-user=alice@example.com", "--mail-type=FAIL,REQUEUE", "--account=ml-research"),
    )
    node = await asyncio.to_thread(slurm.wait_for_step, job, 2)
    slurm.inject_gpu_fault(node)
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report(settings, node))
        result = await asyncio.wait_for(handle.result(), 150)
    assert result.jobs[0].resumed is not None

    subjects = [m["Subject"] for _, m in box.mail]
    assert subjects == [f"[gpuheal] job {job} (mailed): job hit", f"[gpuheal] job {job} (mailed): job running again"]
    assert all(to == ["alice@example.com"] for to, _ in box.mail)
    assert len({m["Message-ID"] for _, m in box.mail}) == 2
    hit = box.mail[0][1].get_payload()
    assert isinstance(hit, str)
    assert f"Nodes: {node}" in hit and "Steps at risk: " in hit and "requeued to run again without" in hit
    assert "account ml-research" in hit

    assert [body["event"] for _, body in chat] == ["job_hit", "job_running_again"]  # the team's channel
    assert all(body["account"] == "ml-research" and body["job_id"] == job for _, body in chat)
    assert [key for key, _ in chat] == [m["X-Gpuheal-Key"] for _, m in box.mail]  # one notice, two channels


async def test_a_nodes_next_incident_is_news_to_a_receiver_that_dedupes(
    slurm: Sandbox, settings: Settings, client: Client, receiver: tuple[str, Inbox]
) -> None:
    url, notes = receiver
    settings = settings.model_copy(update={"notify_url": url})
    runs: list[str] = []
    async with make_worker(client, settings):
        for _ in range(2):  # XID 48: reset the GPU, the node comes back; then it fails again
            slurm.inject_gpu_fault("gpu01")
            handle = await start_or_join(client, settings, report(settings, "gpu01", 48))
            result = await asyncio.wait_for(handle.result(), 120)
            assert result.outcome == "resolved"
            runs.append(str(handle.result_run_id))
    keys = [key for key, _ in notes]
    first = {k for k in keys if f"/{runs[0]}:" in k}
    second = {k for k in keys if f"/{runs[1]}:" in k}
    assert first and second and len(first) + len(second) == len(keys) == len(set(keys))
    events = [body["event"] for _, body in notes]
    assert events[: len(events) // 2] == events[len(events) // 2 :]  # the same story, told twice
