"""Fixtures for the integration tests: the real Temporal dev server and the real Slurm sandbox.

They start the components themselves (on ports of their own, beside a running demo) and fail,
never skip, when one is missing."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from temporalio.client import Client

from clients.temporal import connect
from gpuheal.models import RemediationSettings
from gpuheal.settings import Settings
from infra.sandbox import HOST_SLURM
from infra.sandbox.stack import Sandbox
from tests.conftest import require_binary
from triggers.webhook import serve
from workers.main import make_worker

# The Slurm releases and backends the remediation loop is proven against; test ids carry them
# (`[cli-22.05]`, `[rest-26.05]`, ...). 22.05's slurmrestd cannot update nodes: no rest-22.05.
SLURM_MATRIX = [("cli", "22.05"), ("cli", "24.11"), ("cli", "26.05"), ("rest", "24.11"), ("rest", "26.05")]
SLURM_IDS = [f"{backend}-{version}" for backend, version in SLURM_MATRIX]
across_slurm = pytest.mark.parametrize("slurm", SLURM_MATRIX, ids=SLURM_IDS, indirect=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in str(item.path):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    require_binary("temporal")
    for tool in ("slurmctld", "slurmd", "munged", "sbatch"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            pytest.fail(f"{tool} is missing: run `make setup` (installs Debian's Slurm and munge)")
    sb = Sandbox.named("tests", tmp_path_factory.mktemp("run"))
    sb.start_temporal()
    yield sb
    for backend, version in {("cli", v) for _, v in SLURM_MATRIX}:
        sb.use_slurm(version, backend)
        sb.stop_slurm()
    sb.stop_temporal()


@pytest.fixture
def slurm(stack: Sandbox, request: pytest.FixtureRequest) -> Sandbox:
    """A fresh Slurm cluster for each test: gpu01-03 idle, gpu04-06 spare. The host's 22.05 over
    the CLI, or what `across_slurm` parametrizes."""
    backend, version = getattr(request, "param", ("cli", HOST_SLURM))
    stack.use_slurm(version, backend)
    stack.start_slurm(clean=True)
    return stack


@pytest.fixture(scope="session")
async def client(stack: Sandbox) -> Client:
    return await connect(Settings.from_env(stack.env()))


@pytest.fixture
def settings(slurm: Sandbox) -> Settings:
    """Each test gets its own cluster name (so its own workflow ids) and task queue."""
    base = Settings.from_env(slurm.env())
    return base.model_copy(
        update={
            "cluster": f"t{uuid.uuid4().hex[:8]}",
            "task_queue": f"gpuheal-test-{uuid.uuid4().hex[:8]}",
            "remediation": RemediationSettings(checkpoint_grace_s=1, verify_timeout_s=120),
        }
    )


@pytest.fixture
async def worker(client: Client, settings: Settings) -> AsyncIterator[None]:
    async with make_worker(client, settings):
        yield


@pytest.fixture
async def webhook(client: Client, settings: Settings, slurm: Sandbox) -> AsyncIterator[Sandbox]:
    runner: web.AppRunner = await serve(settings, "127.0.0.1", slurm.webhook_port, client)
    yield slurm
    await runner.cleanup()


def slurmctld_log(sb: Sandbox) -> str:
    return (sb.slurm_dir / "log" / "slurmctld.log").read_text()


def nodes_in_service(sb: Sandbox) -> set[str]:
    return set(sb.slurm("sinfo", "-h", "-N", "-o", "%N").split())


async def max_activity_attempt(handle: Any) -> int:
    """The highest attempt of any activity in a workflow's history: >= 2 means a retry happened."""
    history = await handle.fetch_history()
    return max(
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.HasField("activity_task_started_event_attributes")
    )


async def activity_attempts(handle: Any, activity_type: str) -> int:
    """The highest attempt of one activity type in a workflow's history."""
    history = await handle.fetch_history()
    scheduled = {
        e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    }
    return max(
        (
            e.activity_task_started_event_attributes.attempt
            for e in history.events
            if e.HasField("activity_task_started_event_attributes")
            and scheduled.get(e.activity_task_started_event_attributes.scheduled_event_id) == activity_type
        ),
        default=0,
    )
