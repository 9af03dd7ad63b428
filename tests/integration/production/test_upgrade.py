"""An upgrade with incidents open (Temporal Worker Versioning): an incident held on build v1,
the workers rolled to build v2 whose incident workflow changed incompatibly. The held incident
ends on v1 (pinned: the build it started on), the coordinator moves to v2 with its state, new
incidents run on v2, and `gpuheal versions` says which builds still have incidents open."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import Client, WorkflowHandle

from gpuheal.core import ids
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import start_or_join
from gpuheal.workers.main import WORKFLOWS, declare_build, make_worker
from gpuheal.workflows.remediation import GpuRemediationWorkflow
from infra.sandbox import HOST_SLURM
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import gpuheal, held_behind_paused_breaker, report, until, worker_env
from tests.integration.production.build_v2 import IncidentV2
from tests.integration.production.conftest import cluster_settings
from tests.integration.test_fleet import fleet_status

pytestmark = pytest.mark.integration


V2_WORKFLOWS = [IncidentV2 if w is GpuRemediationWorkflow else w for w in WORKFLOWS]


async def make_current(sb: Sandbox, settings: Settings, build: str) -> None:
    """`gpuheal rollout`, as an operator runs it once the build's workers are up (refused until
    one of them has polled)."""

    async def rolled() -> bool:
        done = await gpuheal(sb, settings, "rollout", build, "--operator", "alice", "--reason", f"roll out {build}")
        return done.returncode == 0

    await until(rolled, f"build {build} made current", timeout=60)


async def build_of(handle: WorkflowHandle[object, object]) -> str:
    return (await handle.describe()).raw_description.workflow_execution_info.versioning_info.deployment_version.build_id


async def test_an_upgrade_while_an_incident_is_held(prod: Sandbox, prod_client: Client) -> None:
    prod.use_slurm(HOST_SLURM)
    prod.start_slurm(clean=True)
    settings = cluster_settings(prod, "upg")
    with worker_env(prod, settings, GPUHEAL_BUILD_ID="v1"):
        v1 = prod.start_worker(0)
    try:
        await make_current(prod, settings, "v1")
        held = await held_behind_paused_breaker(prod, settings, prod_client, "gpu01")
        coordinator = prod_client.get_workflow_handle(ids.coordinator_id(settings.cluster or ""))
        before = await fleet_status(prod_client, settings)
        assert before.breaker.tripped and [h.incident_id for h in before.held] == [held.id]

        v2 = settings.model_copy(update={"build_id": "v2"})
        async with make_worker(prod_client, v2, workflows=V2_WORKFLOWS):
            await declare_build(prod_client, v2)  # as a worker process does once it polls (run_worker)
            await make_current(prod, settings, "v2")
            shown = await gpuheal(prod, settings, "versions")
            lines = {line.split()[0]: line for line in shown.stdout.splitlines()[1:]}
            assert "1 open incidents" in lines["v1"] and "draining" in lines["v1"], shown.stdout
            assert "current" in lines["v2"] and "0 open incidents" in lines["v2"], shown.stdout
            assert "coordinator on build v2" in shown.stdout  # woken by the rollout, moved at once

            resumed = await gpuheal(prod, settings, "resume", "--operator", "alice", "--reason", "upgrade done")
            assert resumed.returncode == 0, resumed.stderr
            result = await asyncio.wait_for(held.result(), 180)
            assert result.outcome == "resolved", result.reason
            assert await build_of(held) == "v1"  # ended where it started, v2's change never replayed on it

            # The coordinator moved up (its next task after the rollout), its state with it.
            assert await build_of(coordinator) == "v2"
            after = await fleet_status(prod_client, settings)
            assert (after.mode, after.policy_version) == (before.mode, before.policy_version)
            assert after.remediations_in_window >= before.remediations_in_window >= 1  # v1's count, carried
            assert not after.breaker.tripped and after.held == ()

            fresh = await start_or_join(prod_client, settings, report(settings, "gpu02", 79))
            assert (await asyncio.wait_for(fresh.result(), 180)).outcome == "resolved"
            assert await build_of(fresh) == "v2"
            shown = await gpuheal(prod, settings, "versions")
            assert f"deployment {ids.deployment_name(settings.cluster or '')}" in shown.stdout
            lines = {line.split()[0]: line for line in shown.stdout.splitlines()[1:]}
            assert "0 open incidents" in lines["v1"], shown.stdout
    finally:
        Sandbox.stop_process(v1)
