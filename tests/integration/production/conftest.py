"""The production topology's fixtures: the Temporal cluster (temporal-server on PostgreSQL, mTLS
required; infra/temporal/cluster) started once for these tests, on ports of its own, beside the
dev server the rest of the suite runs on. Its Slurm is a sandbox of its own too."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import Client

from gpuheal.clients.temporal import connect
from gpuheal.core.settings import Settings
from infra.sandbox import HOST_SLURM, NEWEST_SLURM
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import ROOMY

# Not under pytest's private temporary directory: PostgreSQL runs as its own user, which must
# pass through to its data directory (cluster.sh keeps everything else in it private). One fixed
# place, so that what a killed session left running there is found and stopped by the next.
ROOT = Path(tempfile.gettempdir()) / "gpuheal-production-tests"


def stop_everything(sb: Sandbox) -> None:
    for name in ("worker", "worker-1", "worker-2"):
        sb.stop_recorded(name)
    for version in (HOST_SLURM, NEWEST_SLURM):
        sb.use_slurm(version)
        sb.stop_slurm()
    sb.stop_temporal()


@pytest.fixture(scope="session")
def prod() -> Iterator[Sandbox]:
    stop_everything(Sandbox.named("production", ROOT, temporal_kind="cluster"))
    shutil.rmtree(ROOT)
    ROOT.mkdir(mode=0o711)
    ROOT.chmod(0o711)  # (mkdir's mode passes through the umask)
    sb = Sandbox.named("production", ROOT, temporal_kind="cluster")
    try:
        sb.start_temporal(fresh=True)
        yield sb
    finally:
        stop_everything(sb)
        shutil.rmtree(ROOT, ignore_errors=True)


@pytest.fixture(scope="session")
async def prod_client(prod: Sandbox) -> Client:
    return await connect(Settings.from_env(prod.env()).temporal)


def cluster_settings(sb: Sandbox, name: str = "") -> Settings:
    """A gpuheal cluster of its own on the sandbox's Slurm as it is now: its name (so its
    workflow ids and coordinator), task queue and the roomy policy of the integration tests."""
    tag = uuid.uuid4().hex[:8]
    return Settings.from_env(sb.env()).model_copy(
        update={"cluster": f"{name or 'p'}{tag}", "task_queue": f"gpuheal-{name or 'p'}{tag}", "fleet": ROOMY}
    )
