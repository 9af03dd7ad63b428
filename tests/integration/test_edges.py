"""The loop's edges on real components: Slurm's commands through a real `ssh` (OpenSSH's sshd,
started here on 127.0.0.1), alert labels that must not reach a query, and the manifests' RBAC."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpuheal.clients.slurm.cli import SlurmCli
from gpuheal.core.policy import drain_reason
from infra.sandbox.stack import Sandbox

pytestmark = pytest.mark.integration

SSHD = "/usr/sbin/sshd"
STARTS = "2026-11-30T01:00:00Z"


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[list[str]]:
    """A real sshd on a free port that lets this user in with a key made here; yields the ssh
    wrapper a site would set (`GPUHEAL_SLURM_CLI_WRAPPER="ssh login01"`, with the test's key)."""
    if not Path(SSHD).exists():
        pytest.fail("sshd is missing: run `make setup` (installs Debian's openssh-server)")
    key = tmp_path / "id_ed25519"
    host_key = tmp_path / "host_ed25519"
    for path in (key, host_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    shutil.copy(key.with_suffix(".pub"), tmp_path / "authorized_keys")
    Path("/run/sshd").mkdir(exist_ok=True)  # its privilege-separation directory
    port = _free_port()
    config = tmp_path / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nPidFile {tmp_path}/sshd.pid\n"
        f"AuthorizedKeysFile {tmp_path}/authorized_keys\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\n"
    )
    daemon = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=subprocess.DEVNULL)
    wrapper = [
        "ssh", "-p", str(port), "-i", str(key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
        "-o", f"UserKnownHostsFile={tmp_path}/known_hosts", "-o", "LogLevel=ERROR", "127.0.0.1",
    ]  # fmt: skip
    deadline = time.monotonic() + 20
    while subprocess.run([*wrapper, "true"], capture_output=True).returncode != 0:
        if time.monotonic() > deadline or daemon.poll() is not None:
            daemon.kill()
            pytest.fail("the test's sshd did not let the key in within 20 s")
        time.sleep(0.2)
    yield wrapper
    daemon.terminate()
    daemon.wait(10)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_drain_reason_with_spaces_and_parentheses_arrives_whole_through_ssh(
    slurm: Sandbox, sshd: list[str]
) -> None:
    # ssh does not carry the environment: the wrapper names SLURM_CONF on the remote side, as a
    # site's `ssh login01 env SLURM_CONF=...` would.
    remote = SlurmCli(wrapper=[*sshd, "env", f"SLURM_CONF={slurm.slurm_conf}"])
    local = SlurmCli(str(slurm.slurm_conf))
    reason = drain_reason("gpu-t1-gpu01", "XID 79 (GPU fell off the bus); it's $HOME `x` & gone")
    await remote.update_node("gpu01", "drain", reason)
    node = (await local.nodes())["gpu01"]
    assert node.drained and node.reason == reason
    await remote.update_node("gpu01", "resume")
    assert not (await local.nodes())["gpu01"].drained


@pytest.mark.parametrize(
    ("labels", "field"),
    [
        ({"node": 'inf02" OR WorkflowType = "x'}, "node"),  # would widen the borrowed-node query
        ({"node": "inf02", "cluster": "Prod OR 1=1"}, "cluster"),
    ],
)
async def test_a_give_back_alert_with_a_bad_name_is_refused_before_any_query(
    webhook: Sandbox, labels: dict[str, str], field: str
) -> None:
    status, answer = await give_back_alert(webhook, {**labels, "gpuheal_action": "give_back"})
    assert status == 400, answer
    assert answer["error"] == "no alert could be used" and answer["rejected"][0]["reason"].startswith(f"{field}: ")


async def test_a_give_back_alert_for_a_node_nobody_borrowed_says_so(webhook: Sandbox) -> None:
    status, answer = await give_back_alert(webhook, {"node": "inf02", "gpuheal_action": "give_back"})
    assert status == 200 and answer["give_back"] == ["no running incident has borrowed inf02"]


async def give_back_alert(webhook: Sandbox, labels: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """One firing alert with these labels, to the real webhook, as Alertmanager posts it."""
    alert = {"status": "firing", "labels": labels, "startsAt": STARTS}
    async with aiohttp.ClientSession() as http:
        async with http.post(
            webhook.webhook_url,
            json={"version": "4", "status": "firing", "alerts": [alert]},
            headers={"Authorization": f"Bearer {webhook.webhook_token}"},
        ) as resp:
            return resp.status, await resp.json()
