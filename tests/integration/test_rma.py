"""Evidence for the vendor, end to end: the board named in the alert (serial, UUID, PCI bus id,
the kernel's line) through the real webhook, its history followed by serial across nodes in
Temporal's visibility, a replacement handing the bundle to the ticket hook, the postmortem
showing it, and `gpuheal history --serial`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from temporalio.client import Client

from gpuheal.core import ids
from gpuheal.core.messages import INCIDENT
from gpuheal.core.models.result import RemediationResult
from gpuheal.core.settings import Settings
from gpuheal.triggers.alertmanager import firing_payload
from gpuheal.workers.main import make_worker
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import gpuheal

pytestmark = pytest.mark.integration
SERIAL = "1652320081234"
BOARD = {"gpu_serial": SERIAL, "gpu_uuid": "GPU-1b2c3d4e-0000-1111-2222-333344445555", "pci_bus_id": "0000:3b:00"}
LINE = "NVRM: Xid (PCI:0000:3b:00): {xid}, pid=2345, name=python, GPU has fallen off the bus."


@pytest.fixture
def ticket_hook(tmp_path: Path) -> tuple[Path, Path]:
    """A site's ticket hook: records its argv and the bundle, answers a ticket id."""
    calls = tmp_path / "rma-calls"
    hook = tmp_path / "rma-hook"
    hook.write_text(f'#!/bin/sh\necho "$@" >> {calls}\ncat > {tmp_path}/bundle.json\necho \'{{"ticket": "RMA-42"}}\'\n')
    hook.chmod(0o755)
    return hook, calls


async def incident_of(sb: Sandbox, client: Client, settings: Settings, node: str, xid: int) -> RemediationResult:
    """Through the real webhook, as Alertmanager (or the node agent) sends it."""
    payload = firing_payload(
        node, xid=xid, gpu="3", cluster=settings.cluster, board=BOARD, kernel_log=LINE.format(xid=xid)
    )
    status, body = await asyncio.to_thread(sb.post_alert, payload)
    assert status == 200, body
    handle = INCIDENT.handle(client, ids.incident_id(settings.cluster or "", node))
    return await asyncio.wait_for(handle.result(), 150)


async def test_a_replaced_board_goes_to_the_vendor_with_its_history_by_serial(
    webhook: Sandbox, settings: Settings, client: Client, ticket_hook: tuple[Path, Path], tmp_path: Path
) -> None:
    hook, calls = ticket_hook
    settings = settings.model_copy(update={"rma_hook": str(hook)})
    async with make_worker(client, settings):
        first = await incident_of(webhook, client, settings, "gpu02", 48)  # reset: mended, no RMA
        assert first.outcome == "resolved" and first.rma is None
        # the board was moved to gpu01 (or gpu02 re-imaged as gpu01): its record follows the serial
        second = await incident_of(webhook, client, settings, "gpu01", 79)
    rma = second.rma
    assert second.replacement_node is not None and rma is not None
    assert rma.why == "replaced" and rma.ticket == "RMA-42"
    (board,) = rma.boards
    assert (board.serial, board.uuid, board.pci_bus_id, board.gpu) == (SERIAL, BOARD["gpu_uuid"], "0000:3b:00", 3)
    assert rma.kernel_log == (LINE.format(xid=79),)
    assert [(h.node, h.xid) for h in rma.history] == [("gpu01", 79), ("gpu02", 48)]  # newest first
    assert rma.history[1].outcome == "resolved"
    assert any(a.startswith("drain: drained") for a in rma.actions)
    assert any(a.startswith("repair_or_replace: ") and "joined in place of gpu01" in a for a in rma.actions)

    incident = ids.incident_id(settings.cluster or "", "gpu01")
    assert calls.read_text().split() == ["rma", "gpu01", incident]  # once
    bundle = json.loads((tmp_path / "bundle.json").read_text())
    assert bundle["boards"][0]["serial"] == SERIAL and bundle["run_id"] == rma.run_id

    history = await gpuheal(webhook, settings, "history", "--serial", SERIAL)
    assert history.returncode == 0, history.stderr
    rows = history.stdout.splitlines()
    assert len(rows) == 2 and "gpu01" in rows[0] and "gpu02" in rows[1]
    refused = await gpuheal(webhook, settings, "history", "--serial", 'x" OR 1=1')
    assert refused.returncode != 0 and "invalid GPU serial" in refused.stderr

    out = tmp_path / "postmortem"
    written = await gpuheal(webhook, settings, "postmortem", "gpu01", "--out", str(out))
    assert written.returncode == 0, written.stderr
    md = (out / f"{incident}.md").read_text()
    assert "## RMA evidence" in md and f"serial {SERIAL}" in md and "ticket: RMA-42" in md
    assert LINE.format(xid=79) in md and "on gpu02: XID 48" in md
