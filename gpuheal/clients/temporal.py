"""The one place that connects to Temporal: the worker, the triggers, the CLI, the demo, the
benchmarks and the tests all call :func:`connect`, so every client carries the pydantic data
converter (the models cross the wire as JSON) and the same TLS / API-key settings.

Where to connect follows the SDK's own conventions (temporalio.envconfig): the profile named by
TEMPORAL_PROFILE in TEMPORAL_CONFIG_FILE (or the SDK's default file), then the TEMPORAL_ADDRESS,
TEMPORAL_NAMESPACE, TEMPORAL_API_KEY and TEMPORAL_TLS_* variables over it. gpuheal's own variables
(GPUHEAL_TEMPORAL_ADDRESS, GPUHEAL_NAMESPACE, GPUHEAL_TEMPORAL_TLS_CA/_CERT/_KEY,
GPUHEAL_TEMPORAL_API_KEY: gpuheal.core.settings.TemporalSettings) take over where set (see
:func:`connect_config` for how); with neither, the local dev server (LOCAL_TEMPORAL_ADDRESS,
DEFAULT_NAMESPACE).

Whoever can reach Temporal can approve or abort an incident, so production clusters use mTLS or
an API key and Temporal's authorizer. The key is never logged: the profile and the connect config
hold it in plain text, so neither is ever shown; :func:`describe` says what is safe to say.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.envconfig import ClientConfigProfile, ClientConnectConfig
from temporalio.runtime import Runtime
from temporalio.service import TLSConfig

from gpuheal.core.errors import SettingsError
from gpuheal.core.settings import DEFAULT_NAMESPACE, LOCAL_TEMPORAL_ADDRESS, TemporalSettings

DATA_CONVERTER = pydantic_data_converter
log = logging.getLogger("gpuheal.temporal")


def connect_config(t: TemporalSettings, env: Mapping[str, str] | None = None) -> ClientConnectConfig:
    """What :func:`connect` passes to Client.connect.

    GPUHEAL_TEMPORAL_ADDRESS set: gpuheal's variables alone describe the connection (its
    namespace, TLS files and API key; the SDK's profile is not read), so a profile meant for
    another server never sends its key or TLS settings there. Unset: the SDK's profile (from
    `env`, else the process's environment), with gpuheal's namespace, TLS files and API key over
    it where set; the local dev server where neither names one. A gpuheal API key always goes
    over TLS."""
    config: ClientConnectConfig
    if t.address:
        _refuse_unused_security(t, os.environ if env is None else env)
        config = {"target_host": t.address}
    else:
        try:
            config = ClientConfigProfile.load(override_env_vars=env).to_client_connect_config()
        except Exception as err:  # a missing profile, a malformed file, an unreadable PEM file
            raise SettingsError(f"Temporal's client configuration (TEMPORAL_PROFILE, TEMPORAL_*): {err}") from err
    config["target_host"] = config.get("target_host") or LOCAL_TEMPORAL_ADDRESS
    config["namespace"] = t.namespace or config.get("namespace") or DEFAULT_NAMESPACE
    if t.tls_ca or t.tls_cert:
        profile_tls = config.get("tls")
        base = profile_tls if isinstance(profile_tls, TLSConfig) else TLSConfig()  # keeps the profile's SNI name
        config["tls"] = dataclasses.replace(
            base,
            server_root_ca_cert=_read("GPUHEAL_TEMPORAL_TLS_CA", t.tls_ca) or base.server_root_ca_cert,
            client_cert=_read("GPUHEAL_TEMPORAL_TLS_CERT", t.tls_cert) or base.client_cert,
            client_private_key=_read("GPUHEAL_TEMPORAL_TLS_KEY", t.tls_key) or base.client_private_key,
        )
    if t.api_key:
        config["api_key"] = t.api_key.get_secret_value()
        if not config.get("tls"):
            config["tls"] = True  # never a key in plain text
    return config


def _refuse_unused_security(t: TemporalSettings, env: Mapping[str, str]) -> None:
    """Beside GPUHEAL_TEMPORAL_ADDRESS the SDK's variables are not read: its TLS or key variables
    set there would leave the connection in plain text, silently. Refused, naming them."""
    if t.tls_ca or t.tls_cert or t.api_key:
        return
    unused = sorted(
        k for k, v in env.items() if v and (k == "TEMPORAL_API_KEY" or k.startswith("TEMPORAL_TLS")) and v != "false"
    )
    if unused:
        raise SettingsError(
            f"{', '.join(unused)} set, but not read beside GPUHEAL_TEMPORAL_ADDRESS (gpuheal's variables alone"
            " describe that connection, which would be plain text): set GPUHEAL_TEMPORAL_TLS_CA/_CERT/_KEY or"
            " GPUHEAL_TEMPORAL_API_KEY, or name the server with TEMPORAL_ADDRESS instead"
        )


def resolve(t: TemporalSettings, env: Mapping[str, str] | None = None) -> TemporalSettings:
    """`t` with the address and namespace it will connect to, for links and messages."""
    config = connect_config(t, env)
    return t.model_copy(update={"address": config["target_host"], "namespace": config["namespace"]})


def describe(config: ClientConnectConfig) -> str:
    """Where a connect config goes, without its secrets."""
    tls = "TLS" if config.get("tls") else "plaintext"
    key = ", API key" if config.get("api_key") else ""
    return f"{config.get('target_host')} (namespace {config.get('namespace')}, {tls}{key})"


async def connect(t: TemporalSettings, runtime: Runtime | None = None) -> Client:
    config = connect_config(t)
    log.debug("connecting to Temporal at %s", describe(config))
    if not config.get("tls") and not _loopback(config["target_host"]):
        log.warning(
            "Temporal at %s in plain text: whoever can reach it can approve or abort incidents (set"
            " GPUHEAL_TEMPORAL_TLS_CA/_CERT/_KEY or an API key, and Temporal's authorizer)",
            describe(config),
        )
    return await Client.connect(**config, data_converter=DATA_CONVERTER, runtime=runtime)


def _loopback(target: str) -> bool:
    host = target.rsplit(":", 1)[0].strip("[]")
    return host in {"localhost", "::1"} or host.startswith("127.")


def _read(variable: str, path: str | None) -> bytes | None:
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise SettingsError(f"{variable}={path!r}: cannot read it ({err.strerror})") from err
