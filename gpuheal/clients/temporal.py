"""The one place that connects to Temporal: the worker, the triggers, the CLI, the demo, the
benchmarks and the tests all call :func:`connect`, so every client carries the pydantic data
converter (the models cross the wire as JSON) and the same TLS / API-key settings.

Whoever can reach Temporal can approve or abort an incident, so production clusters use mTLS or
an API key (GPUHEAL_TEMPORAL_TLS_*, GPUHEAL_TEMPORAL_API_KEY) and Temporal's authorizer.
"""

from __future__ import annotations

from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime
from temporalio.service import TLSConfig

from gpuheal.core.settings import Settings

DATA_CONVERTER = pydantic_data_converter


async def connect(settings: Settings, runtime: Runtime | None = None) -> Client:
    tls: TLSConfig | bool = False
    if settings.temporal_tls_cert or settings.temporal_tls_ca:
        tls = TLSConfig(
            server_root_ca_cert=_read(settings.temporal_tls_ca),
            client_cert=_read(settings.temporal_tls_cert),
            client_private_key=_read(settings.temporal_tls_key),
        )
    api_key = settings.temporal_api_key.get_secret_value() if settings.temporal_api_key else None
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.namespace,
        data_converter=DATA_CONVERTER,
        tls=tls if not api_key else (tls or True),
        api_key=api_key,
        runtime=runtime,
    )


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None
