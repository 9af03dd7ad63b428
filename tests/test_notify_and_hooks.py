"""The webhook notifier, the exec provider hook and the subprocess helper, against a real HTTP
server and real scripts."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from temporalio.testing import ActivityEnvironment

from gpuheal.activities.remediation import RemediationActivities
from gpuheal.clients import proc
from gpuheal.clients.notify import WebhookNotifier
from gpuheal.clients.owners import addresses, route
from gpuheal.core.jobs import OwnerNotice
from gpuheal.core.models.base import ActionClass
from gpuheal.core.models.replacement import ReplaceRequest
from gpuheal.core.models.result import Notification
from gpuheal.providers.base import NoSpareCapacity
from gpuheal.providers.exec_hook import ExecHookProvider

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
    p = ExecHookProvider(str(hook), timeout_s=30)
    replaced = await p.replace("gpu01", "gpuheal-c-gpu01/first-run")
    assert replaced.new_node == "gpu42"
    repaired = await p.repair("gpu01", ActionClass.REBOOT_NODE)
    assert repaired.repaired and repaired.detail == "power-cycled gpu01"
    assert await p.decommission("gpu01", "replaced") == "RMA filed"
    health = await p.check_health("gpu01")
    assert not health.healthy and health.detail == "GPU 3 missing"
    calls = (hook.parent / "calls").read_text().splitlines()
    assert calls[0] == "replace gpu01 gpuheal-c-gpu01 first-run" and calls[1] == "repair gpu01 reboot_node"
    with pytest.raises(ValueError, match="invalid node name"):
        await p.replace("gpu01; reboot", "x")


async def test_a_reset_run_asks_the_provider_under_the_incidents_first_run(hook: Path) -> None:
    """A Temporal reset runs the incident on in a new run: the provider is asked under the
    incident's first run (which the request carries), so it answers with the spare it gave that
    run; a request from a release that sent no run falls back to the activity's own."""
    acts = RemediationActivities(cast(Any, None), ExecHookProvider(str(hook), 30), cast(Any, None), lambda _: None)
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, workflow_run_id="reset-run")
    ref = {"cluster": "c", "node": "gpu01", "incident_id": "gpuheal-c-gpu01"}
    await env.run(acts.replace_node, ReplaceRequest(**ref, run_id="first-run"))
    await env.run(acts.replace_node, ReplaceRequest(**ref))
    calls = (hook.parent / "calls").read_text().splitlines()
    assert calls == ["replace gpu01 gpuheal-c-gpu01 first-run", "replace gpu01 gpuheal-c-gpu01 reset-run"]


async def test_exec_hook_failure_is_an_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/sh\necho 'cloud API said no' >&2\nexit 1\n")
    bad.chmod(0o755)
    with pytest.raises(RuntimeError, match="cloud API said no"):
        await ExecHookProvider(str(bad), timeout_s=30).replace("gpu01", "i")


async def test_exec_hook_says_no_capacity_with_exit_75(tmp_path: Path) -> None:
    full = tmp_path / "full.sh"
    full.write_text('#!/bin/sh\necho \'{"no_capacity": "pool h100 has no spare"}\'\nexit 75\n')
    full.chmod(0o755)
    with pytest.raises(NoSpareCapacity, match="pool h100 has no spare"):
        await ExecHookProvider(str(full), timeout_s=30).replace("gpu01", "i")


async def test_a_command_past_its_timeout_is_killed_with_its_children(tmp_path: Path) -> None:
    """A hung hook and what it started are gone when the timeout fires (no orphan keeps running)."""
    pids = tmp_path / "pids"
    script = tmp_path / "hang.sh"
    script.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pids}\necho $$ >> {pids}\nwait\n")
    script.chmod(0o755)
    started = time.monotonic()
    with pytest.raises(proc.CommandTimedOut, match="timed out after 1 s"):
        await proc.run([str(script)], timeout_s=1)
    assert time.monotonic() - started < 5
    await asyncio.sleep(0.2)
    survivors = [pid for pid in map(int, pids.read_text().split()) if running(pid)]
    assert survivors == []  # neither the script nor its child survived


def running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan stays a zombie until its new parent reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def owner_notice(**kw: Any) -> OwnerNotice:
    base: dict[str, Any] = {
        "key": "r/run:7:job_hit",
        "event": "job_hit",
        "cluster": "c1",
        "job_id": 7,
        "job_name": "train",
        "user": "alice",
        "account": "ml",
        "recipients": ("alice",),
        "nodes": ("gpu01",),
        "message": "hit",
    }
    return OwnerNotice.model_validate(base | kw)


@pytest.mark.parametrize(
    ("routes", "default", "chosen"),
    [
        ({"user:alice": "U", "account:ml": "A", "*": "D"}, None, ("U", "user route")),
        ({"alice": "U", "account:ml": "A"}, None, ("U", "user route")),  # the bare name of earlier releases
        ({"user:bob": "B", "account:ml": "A", "*": "D"}, None, ("A", "account route")),
        ({"account:other": "O", "*": "D"}, "N", ("D", "default route")),
        ({"account:other": "O"}, "N", ("N", "default route")),
        ({}, None, None),
    ],
)
def test_an_owner_notice_goes_to_the_user_then_the_team_then_the_default(
    routes: dict[str, str], default: str | None, chosen: tuple[str, str] | None
) -> None:
    assert route(routes, default, owner_notice()) == chosen


def test_an_owner_without_an_account_matches_no_account_route() -> None:
    assert route({"account:": "X"}, None, owner_notice(account="")) is None


@pytest.mark.parametrize(
    ("fields", "domain", "mailed"),
    [
        ({"mail_user": "alice@example.com"}, None, ()),  # no domain allowed: nobody (fail closed)
        ({"mail_user": "alice@example.com"}, "example.com", ("alice@example.com",)),
        ({"mail_user": ""}, "example.org", ("alice@example.org",)),  # Slurm's default: the user's name
        ({"mail_user": "bob"}, "example.org", ("bob@example.org",)),
        ({"mail_user": "alice"}, None, ()),  # a bare name and no domain: nobody to mail
        ({"mail_user": "a@x.io", "recipients": ("alice", "team@x.io", "a@x.io")}, "x.io", ("a@x.io", "team@x.io")),
        ({"mail_user": "a@x.io", "recipients": ("https://evil.example/hook",)}, "x.io", ("a@x.io",)),
        ({"mail_user": "a@x.io\nBcc: all@x.io"}, "x.io", ()),  # no header smuggled in
        # With a mail domain, only its addresses (and its subdomains'): the relay mails no one outside for a job.
        (
            {"mail_user": "a@x.io", "recipients": ("spam@elsewhere.com", "b@lab.x.io", "c@evilx.io")},
            "x.io",
            ("a@x.io", "b@lab.x.io"),
        ),
    ],
)
def test_owner_mail_goes_to_the_mail_user_and_named_addresses(
    fields: dict[str, Any], domain: str | None, mailed: tuple[str, ...]
) -> None:
    assert addresses(owner_notice(**fields), domain) == mailed


def test_owner_mail_keeps_to_the_allowed_domains_when_listed() -> None:
    notice = owner_notice(mail_user="a@x.io", recipients=("b@partner.org", "c@other.com"))
    assert addresses(notice, "x.io", ("x.io", "Partner.org")) == ("a@x.io", "b@partner.org")
    assert addresses(notice, None, ("partner.org",)) == ("b@partner.org",)
    assert addresses(notice, None, ("*.partner.org", "@other.com.")) == ("b@partner.org", "c@other.com")
    # The mail domain stays allowed beside a list (its bare user names are mailed there).
    assert addresses(owner_notice(mail_user="alice"), "x.io", ("partner.org",)) == ("alice@x.io",)
    assert addresses(notice, "x.io", ("*",)) == ("a@x.io", "b@partner.org", "c@other.com")  # any, said so


def test_owner_mail_refuses_addresses_a_relay_would_route_elsewhere() -> None:
    notice = owner_notice(mail_user="victim%evil.com@x.io", recipients=("evil.com!victim@x.io", "ok@x.io"))
    assert addresses(notice, "x.io") == ("ok@x.io",)
