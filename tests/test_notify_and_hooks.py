"""The webhook notifier and the exec provider hook, against a real HTTP server and a real script."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from activities.kube_providers import ExecHookProvider
from activities.notify import WebhookNotifier
from gpuheal.models import ActionClass, Notification

NOTE = Notification(
    incident_id="gpuheal-c-gpu01",
    event="remediating",
    severity="critical",
    message="XID 79 on c/gpu01",
    node="gpu01",
    cluster="c",
)


async def test_webhook_notifier_posts_with_an_idempotency_key() -> None:
    received: list[tuple[dict[str, Any], str]] = []

    async def handler(request: web.Request) -> web.Response:
        received.append((await request.json(), request.headers["Idempotency-Key"]))
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", handler)
    async with TestServer(app) as server:
        await WebhookNotifier(str(server.make_url("/hook"))).send(NOTE)
        with pytest.raises(RuntimeError, match="HTTP 404"):
            await WebhookNotifier(str(server.make_url("/missing"))).send(NOTE)
    ((body, key),) = received
    assert key == "gpuheal-c-gpu01:remediating"
    assert body["text"] == "[critical] XID 79 on c/gpu01" and body["node"] == "gpu01"


@pytest.fixture
def hook(tmp_path: Path) -> Path:
    log = tmp_path / "calls"
    script = tmp_path / "hook.sh"
    script.write_text(f"""#!/bin/sh
echo "$@" >> {log}
case "$1" in
  replace) echo '{{"new_node": "gpu42"}}' ;;
  repair) echo '{{"message": "power-cycled '"$2"'"}}' ;;
  decommission) echo '{{"message": "RMA filed"}}' ;;
  health) echo '{{"healthy": false, "detail": "GPU 3 missing"}}' ;;
  *) exit 3 ;;
esac
""")
    script.chmod(0o755)
    return script


async def test_exec_hook_provider(hook: Path) -> None:
    p = ExecHookProvider(str(hook))
    assert (await p.replace("gpu01", "gpuheal-c-gpu01")).new_node == "gpu42"
    assert await p.repair("gpu01", ActionClass.REBOOT_NODE) == "power-cycled gpu01"
    assert await p.decommission("gpu01", "replaced") == "RMA filed"
    health = await p.check_health("gpu01")
    assert not health.healthy and health.detail == "GPU 3 missing"
    calls = (hook.parent / "calls").read_text().splitlines()
    assert calls[0] == "replace gpu01 gpuheal-c-gpu01" and calls[1] == "repair gpu01 reboot_node"
    with pytest.raises(ValueError, match="invalid node name"):
        await p.replace("gpu01; reboot", "x")


async def test_exec_hook_failure_is_an_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/sh\necho 'cloud API said no' >&2\nexit 1\n")
    bad.chmod(0o755)
    with pytest.raises(RuntimeError, match="cloud API said no"):
        await ExecHookProvider(str(bad)).replace("gpu01", "i")
