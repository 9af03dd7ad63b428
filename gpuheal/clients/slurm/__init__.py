"""Slurm, through one interface (base.SlurmBackend) and two backends: the commands (cli.py) and
slurmrestd (rest.py). `build_slurm` picks the one the settings name (GPUHEAL_SLURM_BACKEND)."""

from __future__ import annotations

import shlex

from gpuheal.clients.slurm.base import (
    JobUpdate,
    NodeOutOfService,
    RequeueUnavailable,
    SlurmBackend,
    SlurmError,
    UnknownNode,
    UnknownSchema,
)
from gpuheal.core.errors import SettingsError
from gpuheal.core.settings import SlurmSettings

__all__ = [
    "JobUpdate",
    "NodeOutOfService",
    "RequeueUnavailable",
    "SlurmBackend",
    "SlurmError",
    "UnknownNode",
    "UnknownSchema",
    "build_slurm",
    "wrapper",
]


def wrapper(s: SlurmSettings) -> list[str] | None:
    """GPUHEAL_SLURM_CLI_WRAPPER as argv (it prefixes each of Slurm's commands)."""
    return shlex.split(s.cli_wrapper) if s.cli_wrapper else None


def build_slurm(s: SlurmSettings) -> SlurmBackend:
    if s.backend == "cli":
        from gpuheal.clients.slurm.cli import SlurmCli

        return SlurmCli(s.conf, wrapper(s))
    if not s.rest_url or not s.rest_user:
        raise SettingsError(
            "GPUHEAL_SLURM_BACKEND=rest needs GPUHEAL_SLURM_REST_URL (slurmrestd's address) and "
            "GPUHEAL_SLURM_REST_USER (the Slurm user the token was issued to)"
        )
    if s.rest_token is None and s.rest_token_file is None:
        raise SettingsError(
            "GPUHEAL_SLURM_BACKEND=rest needs GPUHEAL_SLURM_REST_TOKEN_FILE or GPUHEAL_SLURM_REST_TOKEN"
        )
    from gpuheal.clients.slurm.rest import SlurmRest

    return SlurmRest(s.rest_url, s.rest_user, s.rest_token, s.rest_token_file, s.rest_api)
