"""A rollback on the Temporal cluster with incidents open (issue 33): the coordinator's state
format changed (packed from PACKED on), and a build that cannot read it never gets the
coordinator. v1 is the real release before the change (its code, from git), v2 and v3 this one:
v1 → v2 (the coordinator moves up, reading v1's whole state), v2 → v3 (it moves again, its state
packed by v2 and read by v3), v3 → v1 refused by `gpuheal rollout` with the reason, and the
coordinator goes on deciding: the held incident (pinned to v1) ends, a new one is admitted."""

from __future__ import annotations

import asyncio
import io
import subprocess
import tarfile
from pathlib import Path

import pytest
from temporalio.client import Client

from gpuheal.core import ids
from gpuheal.core.fleet import packing
from gpuheal.triggers.start import start_or_join
from gpuheal.workers.main import declare_build, make_worker
from infra.sandbox import HOST_SLURM, REPO
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import gpuheal, held_behind_paused_breaker, report, worker_env
from tests.integration.production.conftest import cluster_settings
from tests.integration.production.test_upgrade import build_of, make_current
from tests.integration.test_fleet import fleet_status

pytestmark = pytest.mark.integration

BEFORE = "59a991c"  # the last release that carries the coordinator's state whole (format 1 only)


@pytest.fixture
def release_before(tmp_path: Path) -> Path:
    """The release before, its package as git has it (a clean clone of main has its history)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", BEFORE, "gpuheal"], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tmp_path / "before", filter="data")
    return tmp_path / "before"


async def test_a_rollback_to_a_build_that_cannot_read_the_state_is_refused_and_nothing_wedges(
    prod: Sandbox, prod_client: Client, release_before: Path
) -> None:
    prod.use_slurm(HOST_SLURM)
    prod.start_slurm(clean=True)
    settings = cluster_settings(prod, "rbk")
    with worker_env(prod, settings, GPUHEAL_BUILD_ID="v1", PYTHONPATH=str(release_before)):
        v1 = prod.start_worker(0)
    try:
        await make_current(prod, settings, "v1")
        held = await held_behind_paused_breaker(prod, settings, prod_client, "gpu01")
        coordinator = prod_client.get_workflow_handle(ids.coordinator_id(settings.cluster or ""))
        assert await build_of(coordinator) == "v1"
        before = await fleet_status(prod_client, settings)
        assert before.breaker.tripped and [h.incident_id for h in before.held] == [held.id]
        v2, v3 = (settings.model_copy(update={"build_id": b}) for b in ("v2", "v3"))
        async with make_worker(prod_client, v2):
            await declare_build(prod_client, v2)  # as a worker process does once it polls (run_worker)
            await make_current(prod, settings, "v2")
            assert await build_of(coordinator) == "v2"  # v1's whole state read by v2
            async with make_worker(prod_client, v3):
                await declare_build(prod_client, v3)
                await make_current(prod, settings, "v3")
                assert await build_of(coordinator) == "v3"  # v2's packed state read by v3
                moved = await fleet_status(prod_client, settings)
                assert moved.breaker == before.breaker and moved.held == before.held

                back = await gpuheal(prod, settings, "rollout", "v1", "--operator", "alice", "--reason", "roll back")
                assert back.returncode == 1
                assert (
                    f"build v1 not made current: the coordinator carries its state in format {packing.WRITES}"
                    in back.stderr
                )
                assert "build v1 reads 1 only (it declares none" in back.stderr
                shown = await gpuheal(prod, settings, "versions")
                current = [line for line in shown.stdout.splitlines() if " current " in f" {line} "]
                assert len(current) == 1 and current[0].split()[0] == "v3", shown.stdout
                assert await build_of(coordinator) == "v3"

                resumed = await gpuheal(prod, settings, "resume", "--operator", "alice", "--reason", "rollback refused")
                assert resumed.returncode == 0, resumed.stderr
                assert (await asyncio.wait_for(held.result(), 180)).outcome == "resolved"
                assert await build_of(held) == "v1"  # pinned where it started, served by v1's worker
                fresh = await start_or_join(prod_client, settings, report(settings, "gpu02", 79))
                assert (await asyncio.wait_for(fresh.result(), 180)).outcome == "resolved"
                assert await build_of(fresh) == "v3"
    finally:
        Sandbox.stop_process(v1)
