"""mTLS on the Temporal cluster: the server serves only clients with a certificate from its CA
(workers, gpuheal's CLI and Temporal's), and the Helm chart hands a worker its certificates from
a Secret."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuheal.clients.temporal import connect
from gpuheal.core.settings import Settings
from infra.sandbox import INFRA, REPO
from infra.sandbox.stack import Sandbox
from tests.integration.test_helm import helm_bin

pytestmark = pytest.mark.integration

CERTS = INFRA / "temporal" / "cluster" / "certs.sh"
BIN = Path(sys.executable).parent
TLS_VARS = ("GPUHEAL_TEMPORAL_TLS_CA", "GPUHEAL_TEMPORAL_TLS_CERT", "GPUHEAL_TEMPORAL_TLS_KEY")


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


async def can_connect(env: dict[str, str]) -> bool:
    try:
        client = await asyncio.wait_for(connect(Settings.from_env(env).temporal), 30)
        await client.count_workflows("")
    except RuntimeError:  # the SDK's "Failed client connect": refused in the handshake
        return False
    return True


async def test_the_cluster_serves_only_clients_with_a_certificate_from_its_ca(prod: Sandbox, tmp_path: Path) -> None:
    env = prod.env()
    assert await can_connect(env)
    plaintext = {k: v for k, v in env.items() if k not in TLS_VARS and not k.startswith("TEMPORAL_TLS")}
    assert not await can_connect(plaintext)
    assert not await can_connect({**plaintext, "GPUHEAL_TEMPORAL_TLS_CA": env["GPUHEAL_TEMPORAL_TLS_CA"]})
    # A certificate from another CA (made here, as an attacker could), presented to the server.
    assert (await asyncio.to_thread(run, ["bash", str(CERTS), str(tmp_path), "gpuheal"], env)).returncode == 0
    stranger = {**env, "GPUHEAL_TEMPORAL_TLS_CERT": str(tmp_path / "gpuheal.pem")}
    assert not await can_connect({**stranger, "GPUHEAL_TEMPORAL_TLS_KEY": str(tmp_path / "gpuheal.key")})

    # Temporal's CLI, as an operator runs it with the TEMPORAL_TLS_* variables, and without them.
    listed = await asyncio.to_thread(run, [str(BIN / "temporal"), "workflow", "list", "--limit", "1"], env)
    assert listed.returncode == 0, listed.stderr
    no_cert = {k: v for k, v in env.items() if not k.startswith("TEMPORAL_TLS_CLIENT")}
    refused = await asyncio.to_thread(run, [str(BIN / "temporal"), "workflow", "list"], no_cert)
    assert refused.returncode != 0 and "client certificate" in refused.stderr, refused.stderr

    # gpuheal's CLI: spoken to over mTLS, or a plain "cannot reach" that names the address.
    fleet = await asyncio.to_thread(run, [str(BIN / "gpuheal"), "fleet"], env)
    assert "no coordinator for cluster" in fleet.stdout, fleet.stderr
    fleet = await asyncio.to_thread(run, [str(BIN / "gpuheal"), "fleet"], plaintext)
    assert fleet.returncode != 0 and f"cannot reach Temporal at {prod.temporal_address}" in fleet.stderr
    # The SDK's TLS variables beside GPUHEAL_TEMPORAL_ADDRESS are not read: refused, not plain text.
    sdk_only = {**plaintext, **{k: v for k, v in env.items() if k.startswith("TEMPORAL_TLS")}}
    fleet = await asyncio.to_thread(run, [str(BIN / "gpuheal"), "fleet"], sdk_only)
    assert fleet.returncode != 0 and "not read beside GPUHEAL_TEMPORAL_ADDRESS" in fleet.stderr, fleet.stderr


async def test_the_chart_takes_the_certificates_from_a_secret(prod: Sandbox, tmp_path: Path) -> None:
    """What the chart renders with temporal.tls.secretName, played out as the kubelet would: the
    Secret's keys become files under the worker's mount, and the worker's ConfigMap points
    gpuheal at them. A worker configured so connects to the mTLS cluster."""
    argv = [
        helm_bin(), "template", "gpuheal", str(REPO / "infra/helm/gpuheal"), "--kube-version", "1.36.3",
        "--set", "temporal.tls.secretName=temporal-tls", "--set", f"temporal.address={prod.temporal_address}",
        "--set", "temporal.tls.webhookSecretName=temporal-tls-webhook", "--set", "slurm.mungeKeySecret=munge",
    ]  # fmt: skip
    rendered = await asyncio.to_thread(run, argv, dict(os.environ))
    assert rendered.returncode == 0, rendered.stderr
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(rendered.stdout) if d}
    config = docs[("ConfigMap", "gpuheal")]["data"]
    pod = docs[("Deployment", "gpuheal-worker")]["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "secret" in v and v["secret"]["secretName"] == "temporal-tls"]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    assert not any(
        k.startswith("GPUHEAL_TEMPORAL_TLS") for e in pod["containers"][0].get("env") or [] for k in [e["name"]]
    )

    # The Secret as `kubectl create secret generic temporal-tls --from-file=...` makes it from the
    # cluster's certificates, projected into the pod's mount (here: under tmp_path).
    ca, cert, key = prod.temporal.tls_files() or ()
    secret = {"ca.crt": ca, "tls.crt": cert, "tls.key": key}
    mounted = tmp_path / mount["mountPath"].lstrip("/")
    mounted.mkdir(parents=True)
    for name, source in secret.items():
        (mounted / name).write_bytes(source.read_bytes())
    env = {k: str(v) for k, v in config.items() if k.startswith("GPUHEAL_TEMPORAL_") or k == "GPUHEAL_NAMESPACE"}
    for var in TLS_VARS:
        assert env[var].startswith(mount["mountPath"] + "/"), env[var]
        env[var] = str(tmp_path / env[var].lstrip("/"))
    assert await can_connect(env)
