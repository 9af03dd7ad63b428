"""A postmortem and the Temporal UI, seen in a real browser (Debian's chromium-headless-shell).

An incident waits for approval (the UI is screenshotted there), alice approves it from our CLI,
it closes (screenshotted again), and `gpuheal postmortem` writes its record: the HTML is opened in
the browser, which must render the timeline and the decision."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from temporalio.client import Client

from gpuheal.core import ids
from gpuheal.core.models.base import ActionClass
from gpuheal.core.models.incident import ApprovalPolicy
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import start_or_join
from gpuheal.workers.main import make_worker
from gpuheal.workflows.remediation import GpuRemediationWorkflow
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import gpuheal, report, until

pytestmark = pytest.mark.integration


def browser() -> str:
    found = shutil.which("chromium-headless-shell") or shutil.which("chromium")
    if found is None:
        pytest.fail("chromium-headless-shell is missing: make setup installs Debian's package")
    return found


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    flags = ["--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,1000"]
    return subprocess.run([browser(), *flags, *args], capture_output=True, text=True, timeout=90)


async def devtools_endpoint(proc: asyncio.subprocess.Process, log: Path, within_s: float = 90) -> str:
    """host:port of the browser's DevTools, read from the line it writes to stderr once it listens
    (a loaded machine can take many seconds to start a browser)."""
    for _ in range(int(within_s * 10)):
        for line in log.read_text(errors="replace").splitlines():
            if "DevTools listening on ws://" in line:
                return line.split("ws://", 1)[1].split("/", 1)[0]
        if proc.returncode is not None:
            raise AssertionError(f"the browser exited ({proc.returncode}) before it listened: {log.read_text()}")
        await asyncio.sleep(0.1)
    raise AssertionError(f"the browser did not listen for DevTools within {within_s} s: {log.read_text()}")


async def screenshot(url: str, png: Path, settle_s: float = 6.0) -> None:
    """The page as a person sees it once its scripts have run: the UI is a single-page app that
    keeps polling a running workflow, so the browser is driven over the DevTools protocol and
    shot after `settle_s` of real time (a virtual-time budget never ends on such a page)."""
    # Port 0: the browser picks a free port and says which on stderr ("DevTools listening on
    # ws://..."), so no fixed port can collide and a slow start on a loaded machine is waited for.
    log = png.with_suffix(".browser.log")
    with log.open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            browser(), "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,1000",
            "--remote-debugging-port=0", f"--user-data-dir={png.with_suffix('.profile')}", "about:blank",
            stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
        )  # fmt: skip
    try:
        endpoint = await devtools_endpoint(proc, log)
        async with aiohttp.ClientSession() as http:
            pages: list[dict[str, Any]] = []
            for _ in range(300):
                async with http.get(f"http://{endpoint}/json/list") as resp:
                    pages = [t for t in await resp.json() if t["type"] == "page"]
                if pages:
                    break
                await asyncio.sleep(0.1)
            assert pages, f"the browser at {endpoint} opened no page in 30 s"
            async with http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                calls = iter(range(1, 1000))

                async def call(method: str, **params: Any) -> dict[str, Any]:
                    ident = next(calls)
                    await ws.send_json({"id": ident, "method": method, "params": params})
                    while True:
                        msg = await ws.receive_json(timeout=30)
                        if msg.get("id") == ident:
                            result: dict[str, Any] = msg.get("result", {})
                            return result

                await call("Page.navigate", url=url)
                await asyncio.sleep(settle_s)
                shot = await call("Page.captureScreenshot", format="png")
        png.write_bytes(base64.b64decode(shot["data"]))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the zygote and renderers with it
        await proc.wait()
    assert png.stat().st_size > 20_000, f"{png} looks empty"


async def test_the_ui_and_the_postmortem_in_a_browser(
    slurm: Sandbox, settings: Settings, client: Client, tmp_path: Path
) -> None:
    fleet = settings.fleet.model_copy(update={"approval": ApprovalPolicy(required_for=(ActionClass.RESET_GPU,))})
    settings = settings.model_copy(update={"fleet": fleet})
    url = settings.incident_url(ids.incident_id(settings.cluster or "", "gpu02"))
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report(settings, "gpu02", 48))

        async def waiting() -> bool:
            return (await handle.query(GpuRemediationWorkflow.status)).awaiting_approval

        await until(waiting, "the approval wait")
        await screenshot(url, tmp_path / "ui-awaiting-approval.png")
        approved = await gpuheal(slurm, settings, "approve", "gpu02", "--operator", "alice", "--reason", "RMA 4711")
        assert approved.returncode == 0, approved.stderr
        result = await asyncio.wait_for(handle.result(), 90)
    assert result.outcome == "resolved"
    await screenshot(url, tmp_path / "ui-closed.png")

    out = tmp_path / "postmortem"
    written = await gpuheal(slurm, settings, "postmortem", "gpu02", "--out", str(out))
    assert written.returncode == 0, written.stderr
    md = (out / f"{handle.id}.md").read_text()
    assert "approve by alice: RMA 4711" in md and "update approve: alice: RMA 4711" in md
    assert "look_up_slurm_node" in md and "drain_slurm_node" in md and "reset" in md
    page = out / f"{handle.id}.html"
    dom = await asyncio.to_thread(chromium, "--dump-dom", page.as_uri())
    assert f"Postmortem: {handle.id}" in dom.stdout and 'class="stage"' in dom.stdout, dom.stderr[-2000:]
    assert "alice" in dom.stdout and settings.incident_url(handle.id) in dom.stdout
    await screenshot(page.as_uri(), tmp_path / "postmortem.png", settle_s=1)

    open_one = await gpuheal(slurm, settings, "postmortem", "gpu09")
    assert open_one.returncode == 4 and "no incident gpu09" in open_one.stderr
