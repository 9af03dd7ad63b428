"""Where gpuheal connects to Temporal: the SDK's own configuration (temporalio.envconfig), with
gpuheal's GPUHEAL_* variables over it, and the API key never shown."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.service import TLSConfig

from gpuheal.clients import temporal
from gpuheal.core.errors import SettingsError
from gpuheal.core.settings import Settings

SDK_VARIABLES = ("TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TEMPORAL_API_KEY", "TEMPORAL_PROFILE", "TEMPORAL_TLS")


@pytest.fixture
def no_file(tmp_path: Path) -> dict[str, str]:
    """An environment whose SDK configuration file does not exist: nothing but what a test sets."""
    return {"TEMPORAL_CONFIG_FILE": str(tmp_path / "absent.toml")}


def config_for(env: dict[str, str]) -> Any:
    return temporal.connect_config(Settings.from_env(env).temporal, env)


def test_nothing_set_is_the_local_dev_server(no_file: dict[str, str]) -> None:
    config = config_for(no_file)
    assert (config["target_host"], config["namespace"]) == ("127.0.0.1:7233", "default")
    assert "tls" not in config and "api_key" not in config


def test_temporal_address_alone_is_honoured(no_file: dict[str, str]) -> None:
    config = config_for({**no_file, "TEMPORAL_ADDRESS": "temporal.example:7233", "TEMPORAL_NAMESPACE": "prod"})
    assert (config["target_host"], config["namespace"]) == ("temporal.example:7233", "prod")


def test_a_gpuheal_address_takes_the_whole_connection_away_from_the_sdk_profile(no_file: dict[str, str]) -> None:
    """A profile meant for another server must not send its namespace, TLS or key to this one."""
    sdk = {**no_file, "TEMPORAL_ADDRESS": "temporal.example:7233", "TEMPORAL_NAMESPACE": "prod"}
    config = config_for({**sdk, "GPUHEAL_TEMPORAL_ADDRESS": "frontend.temporal:7233"})
    assert (config["target_host"], config["namespace"]) == ("frontend.temporal:7233", "default")
    assert "api_key" not in config and "tls" not in config
    assert config_for({**sdk, "GPUHEAL_TEMPORAL_ADDRESS": "f:7233", "GPUHEAL_NAMESPACE": "gpu"})["namespace"] == "gpu"
    # Without it, gpuheal's namespace still overrides the profile's, field by field.
    assert config_for({**sdk, "GPUHEAL_NAMESPACE": "gpu"})["namespace"] == "gpu"


@pytest.mark.parametrize(
    "sdk_security",
    [
        {"TEMPORAL_API_KEY": "cloud-key"},
        {"TEMPORAL_TLS_CLIENT_CERT_PATH": "/etc/tls/tls.crt", "TEMPORAL_TLS_CLIENT_KEY_PATH": "/etc/tls/tls.key"},
        {"TEMPORAL_TLS": "true"},
    ],
)
def test_sdk_security_left_unread_beside_a_gpuheal_address_is_refused(
    no_file: dict[str, str], sdk_security: dict[str, str], tmp_path: Path
) -> None:
    """It would otherwise connect in plain text with no word (the chart always sets the address)."""
    env = {**no_file, **sdk_security, "GPUHEAL_TEMPORAL_ADDRESS": "frontend.temporal:7233"}
    with pytest.raises(SettingsError, match=rf"{sorted(sdk_security)[0]}.*not read beside GPUHEAL_TEMPORAL_ADDRESS"):
        config_for(env)
    key = {"GPUHEAL_TEMPORAL_API_KEY": "k"}  # gpuheal's own security: the SDK's is not needed
    assert config_for({**env, **key})["tls"] is True


async def test_plain_text_to_a_remote_temporal_is_said_loudly(
    no_file: dict[str, str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def connected(**config: Any) -> None:
        return None

    monkeypatch.setattr(Client, "connect", connected)
    for address, loud in (("frontend.temporal:7233", True), ("127.0.0.1:7233", False), ("localhost:7233", False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="gpuheal.temporal"):
            await temporal.connect(Settings.from_env({**no_file, "GPUHEAL_TEMPORAL_ADDRESS": address}).temporal)
        assert ("in plain text" in caplog.text) == loud, address


def test_a_gpuheal_api_key_never_goes_in_plain_text(no_file: dict[str, str]) -> None:
    env = {**no_file, "TEMPORAL_TLS": "false", "GPUHEAL_TEMPORAL_API_KEY": "k"}
    assert config_for(env)["tls"] is True
    assert config_for({**env, "GPUHEAL_TEMPORAL_ADDRESS": "f:7233"})["tls"] is True


def test_an_unreadable_tls_file_is_a_settings_error_naming_it(no_file: dict[str, str], tmp_path: Path) -> None:
    missing = str(tmp_path / "ca.pem")
    with pytest.raises(SettingsError, match=r"GPUHEAL_TEMPORAL_TLS_CA=.*ca.pem.*cannot read it"):
        config_for({**no_file, "GPUHEAL_TEMPORAL_TLS_CA": missing})


def test_the_sdk_profile_file_is_read_and_overridden(tmp_path: Path) -> None:
    file = tmp_path / "temporal.toml"
    file.write_text('[profile.default]\naddress = "file.example:7233"\n\n[profile.staging]\nnamespace = "staging"\n')
    env = {"TEMPORAL_CONFIG_FILE": str(file)}
    assert config_for(env)["target_host"] == "file.example:7233"
    assert config_for({**env, "TEMPORAL_PROFILE": "staging"})["namespace"] == "staging"
    assert config_for({**env, "GPUHEAL_TEMPORAL_ADDRESS": "mine:7233"})["target_host"] == "mine:7233"


def test_gpuheal_tls_files_are_read(no_file: dict[str, str], tmp_path: Path) -> None:
    for name in ("ca", "cert", "key"):
        (tmp_path / name).write_bytes(f"PEM {name}".encode())
    names = {"CA": "ca", "CERT": "cert", "KEY": "key"}
    tls = config_for({**no_file, **{f"GPUHEAL_TEMPORAL_TLS_{k}": str(tmp_path / v) for k, v in names.items()}})["tls"]
    assert isinstance(tls, TLSConfig)
    assert (tls.server_root_ca_cert, tls.client_cert, tls.client_private_key) == (b"PEM ca", b"PEM cert", b"PEM key")


def test_an_unknown_profile_is_a_settings_error(no_file: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="TEMPORAL_PROFILE"):
        config_for({**no_file, "TEMPORAL_PROFILE": "nope"})


async def test_the_api_key_is_used_never_shown(
    no_file: dict[str, str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in SDK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", no_file["TEMPORAL_CONFIG_FILE"])
    seen: dict[str, Any] = {}

    async def fake_connect(target_host: str, **kwargs: Any) -> str:
        seen.update(kwargs, target_host=target_host)
        return "client"

    monkeypatch.setattr(Client, "connect", fake_connect)
    settings = Settings.from_env({"GPUHEAL_TEMPORAL_API_KEY": "s3cret-key", "GPUHEAL_TEMPORAL_ADDRESS": "cloud:7233"})
    caplog.set_level(logging.DEBUG)
    assert await temporal.connect(settings.temporal) == "client"  # type: ignore[comparison-overlap]
    assert seen["api_key"] == "s3cret-key" and seen["tls"] is True and seen["target_host"] == "cloud:7233"
    assert seen["data_converter"] is temporal.DATA_CONVERTER
    described = temporal.describe(temporal.connect_config(settings.temporal))
    assert "API key" in described and "cloud:7233" in caplog.text
    for shown in (repr(settings), str(settings), repr(settings.temporal), described, caplog.text):
        assert "s3cret-key" not in shown


def test_resolve_names_the_address_and_namespace_it_connects_to(no_file: dict[str, str]) -> None:
    env = {**no_file, "TEMPORAL_NAMESPACE": "prod"}
    s = Settings.from_env(env).model_copy(update={"ui_url": "http://ui"})
    resolved = s.model_copy(update={"temporal": temporal.resolve(s.temporal, env)})
    assert resolved.temporal.address == "127.0.0.1:7233"
    assert resolved.incident_url("gpuheal-c-gpu01") == "http://ui/namespaces/prod/workflows/gpuheal-c-gpu01"
