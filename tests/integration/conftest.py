"""Fixtures for the integration tests: the real Temporal dev server and the real Slurm sandbox.

They start the components themselves (on ports of their own, beside a running demo) and fail,
never skip, when one is missing."""

from __future__ import annotations

import asyncio
import inspect
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from temporalio.client import Client

from gpuheal.clients.temporal import connect
from gpuheal.core.fleet.policy import BreakerPolicy, BudgetPolicy, FleetPolicy, RepeatPolicy
from gpuheal.core.models.base import Stage
from gpuheal.core.models.incident import KubernetesPolicy, RemediationSettings
from gpuheal.core.models.report import HealthReport
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import start_or_join
from gpuheal.triggers.webhook import serve
from gpuheal.workers.main import make_worker
from gpuheal.workflows.remediation import GpuRemediationWorkflow
from infra.sandbox import HOST_SLURM
from infra.sandbox.kube import KubeSandbox
from infra.sandbox.stack import PORTS, Sandbox
from tests.conftest import require_binary

# The Slurm releases and backends the remediation loop is proven against; test ids carry them
# (`[cli-22.05]`, `[rest-26.05]`, ...). 22.05's slurmrestd cannot update nodes: no rest-22.05.
SLURM_MATRIX = [("cli", "22.05"), ("cli", "24.11"), ("cli", "26.05"), ("rest", "24.11"), ("rest", "26.05")]
SLURM_IDS = [f"{backend}-{version}" for backend, version in SLURM_MATRIX]
across_slurm = pytest.mark.parametrize("slurm", SLURM_MATRIX, ids=SLURM_IDS, indirect=True)


# What needs infra/'s builds (`built`): the Kubernetes sandbox (kube-apiserver, etcd, kwok, and
# Helm for the chart's tests), the Temporal cluster (the production topology), the newer Slurm
# releases' roots. `make test` runs the others while it builds (infra/test.sh).
NEEDS_BUILDS = frozenset({"kube", "prod"})
BUILT_MODULES = frozenset({"test_helm.py", "test_slurm_roots.py"})


def needs_builds(item: pytest.Item) -> bool:
    if NEEDS_BUILDS & set(getattr(item, "fixturenames", ())) or item.path.name in BUILT_MODULES:
        return True
    callspec = getattr(item, "callspec", None)
    release = callspec.params.get("slurm") if callspec is not None else None
    return release is not None and release[1] != HOST_SLURM


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in str(item.path):
            item.add_marker(pytest.mark.integration)
            if needs_builds(item):
                item.add_marker(pytest.mark.built)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    require_binary("temporal")
    for tool in ("slurmctld", "slurmd", "munged", "sbatch"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            pytest.fail(f"{tool} is missing: run `make setup` (installs Debian's Slurm and munge)")
    # GPUHEAL_TEST_PORTS: another use's ports (`bench`), to run some tests beside a whole run.
    sb = Sandbox.named(os.environ.get("GPUHEAL_TEST_PORTS", "tests"), tmp_path_factory.mktemp("run"))
    sb.start_temporal()
    yield sb
    for backend, version in {("cli", v) for _, v in SLURM_MATRIX}:
        sb.use_slurm(version, backend)
        sb.stop_slurm()
    sb.stop_temporal()


@pytest.fixture(scope="session")
def kube(stack: Sandbox) -> Iterator[KubeSandbox]:
    """The Kubernetes sandbox (etcd, kube-apiserver, kwok), once per session."""
    ks = KubeSandbox(stack.root / "k8s", port=PORTS[os.environ.get("GPUHEAL_TEST_PORTS", "tests")].kube)
    ks.start()  # builds the binaries first when the cache is empty
    yield ks
    ks.stop()


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
    return await connect(Settings.from_env(stack.env()).temporal)


ROOMY = FleetPolicy(
    budget=BudgetPolicy(cluster="100", rate=1000, node_cooldown_s=0),
    breaker=BreakerPolicy(max_incidents=1000),
    repeat=RepeatPolicy(incidents=1000),
    duplicate_window_s=0,
)


@pytest.fixture
def settings(slurm: Sandbox) -> Settings:
    """Each test gets its own cluster name (so its own workflow ids and coordinator) and task
    queue, and a roomy cluster policy: no budget, breaker or duplicate window gets in the way of
    a test that is not about them (tests/integration/test_fleet.py is)."""
    base = Settings.from_env(slurm.env())
    return base.model_copy(
        update={
            "cluster": f"t{uuid.uuid4().hex[:8]}",
            "task_queue": f"gpuheal-test-{uuid.uuid4().hex[:8]}",
            "remediation": RemediationSettings(checkpoint_grace_s=1, verify_timeout_s=120),
            "fleet": ROOMY,
        }
    )


@contextmanager
def worker_env(sb: Sandbox, settings: Settings, **extra: str) -> Iterator[None]:
    """What a worker started as its own process (`sb.start_worker()`) runs with: the test's
    cluster and task queue, a short checkpoint grace and a roomy cluster policy (as ROOMY), then
    `extra` (GPUHEAL_* settings); taken off the sandbox afterwards."""
    env = {
        "GPUHEAL_CLUSTER": settings.cluster or "",
        "GPUHEAL_TASK_QUEUE": settings.task_queue,
        "GPUHEAL_CHECKPOINT_GRACE_S": "1",
        "GPUHEAL_BUDGET": "100",
        "GPUHEAL_NODE_COOLDOWN_S": "0",
        "GPUHEAL_DUPLICATE_WINDOW_S": "0",
        **extra,
    }
    sb.extra_env.update(env)
    try:
        yield
    finally:
        for key in env:
            sb.extra_env.pop(key, None)


@pytest.fixture
async def worker(client: Client, settings: Settings) -> AsyncIterator[None]:
    async with make_worker(client, settings):
        yield


@pytest.fixture
async def webhook(client: Client, settings: Settings, slurm: Sandbox) -> AsyncIterator[Sandbox]:
    runner: web.AppRunner = await serve(settings, "127.0.0.1", slurm.webhook_port, client)
    yield slurm
    await runner.cleanup()


GPUHEAL = str(Path(sys.executable).parent / "gpuheal")


async def gpuheal(sb: Sandbox, settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Our CLI as an operator types it (in a thread: this loop may be running a worker)."""
    full = {**sb.env(), "GPUHEAL_CLUSTER": settings.cluster or "", "GPUHEAL_TASK_QUEUE": settings.task_queue, **env}
    return await asyncio.to_thread(
        subprocess.run, [GPUHEAL, *args], env=full, capture_output=True, text=True, timeout=60
    )


async def held_behind_paused_breaker(sb: Sandbox, settings: Settings, client: Client, node: str) -> Any:
    """An incident for `node` waiting in the held stage: a first one (gpu03) starts the cluster's
    coordinator and resolves, then an operator pauses the breaker. A worker must be running."""
    first = await start_or_join(client, settings, report(settings, "gpu03", 48))
    assert (await asyncio.wait_for(first.result(), 120)).outcome == "resolved"
    paused = await gpuheal(sb, settings, "pause", "--operator", "alice", "--reason", "hold the next one")
    assert paused.returncode == 0, paused.stderr
    handle = await start_or_join(client, settings, report(settings, node, 48))

    async def held() -> bool:
        return (await handle.query(GpuRemediationWorkflow.status)).stage == Stage.HELD

    await until(held, "the incident held by the paused breaker")
    return handle


def report(settings: Settings, node: str, xid: int = 79, gpu: int | None = 0, **kw: Any) -> HealthReport:
    """A failure report as a trigger would send it, for the test's cluster."""
    return HealthReport(
        node=node, cluster=settings.cluster, xid=xid, gpu=gpu, source="test", observed_at=datetime.now(UTC), **kw
    )


async def until(check: Any, what: str, timeout: float = 60) -> Any:
    """Poll `check` (a coroutine function, or a plain one run in a thread) until it returns
    something true; fail naming `what` after `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        found = await check() if inspect.iscoroutinefunction(check) else await asyncio.to_thread(check)
        if inspect.isawaitable(found):  # a lambda around a coroutine
            found = await found
        if found:
            return found
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


async def stage_ended(handle: Any, stage: Stage, timeout: float = 60) -> None:
    """Until the incident's `stage` has ended: a stage beside others (the early steps) is not
    always the last one started, so the incident's Stage does not say it."""

    async def ended() -> bool:
        status = await handle.query(GpuRemediationWorkflow.status)
        return any(r.stage == stage and r.ended_at is not None for r in status.stages)

    await until(ended, f"the incident's {stage.value} ended", timeout)


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


@pytest.fixture
def k8s_settings(settings: Settings, kube: KubeSandbox, slurm: Sandbox) -> Settings:
    """The test's settings with the Kubernetes half on: the worker's ServiceAccount, the sandbox
    provider as the platform."""
    kube.reset_nodes(["gpu01", "gpu02", "gpu03"])
    return settings.model_copy(
        update={
            "kubeconfig": str(kube.worker_kubeconfig),  # the worker runs with its ServiceAccount's RBAC
            # the node group (platform) may create Nodes
            "provider": settings.provider.model_copy(update={"sandbox_kubeconfig": str(kube.admin_kubeconfig)}),
            "remediation": RemediationSettings(
                checkpoint_grace_s=1,
                verify_timeout_s=120,
                kubernetes=KubernetesPolicy(drain_deadline_s=120),
            ),
        }
    )


Inbox = list[tuple[str, dict[str, Any]]]  # (Idempotency-Key, body) per POST


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[str, Inbox]]:
    """A chat (or operators') webhook: (URL, [(Idempotency-Key, body)])."""
    received: Inbox = []

    async def handler(request: web.Request) -> web.Response:
        received.append((request.headers.get("Idempotency-Key", ""), await request.json()))
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", handler)
    async with TestServer(app) as server:
        yield str(server.make_url("/hook")), received
