"""A repaired node takes jobs again only after its GPUs pass a burn-in job that real Slurm runs on
it, in a maintenance reservation, while nothing else can start there."""

from __future__ import annotations

import asyncio

from temporalio.client import Client

from gpuheal.core.models import NodeState
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import start_or_join
from gpuheal.workers.main import make_worker
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import across_slurm, nodes_in_service, report


def validating(settings: Settings, slurm: Sandbox) -> Settings:
    remediation = settings.remediation.model_copy(update={"validate_job": str(slurm.validate_job)})
    return settings.model_copy(update={"remediation": remediation})


def burn_ins(slurm: Sandbox) -> list[str]:
    out = slurm.slurm("squeue", "-h", "-t", "all", "-o", "%j %T %N")
    return [line for line in out.splitlines() if line.startswith("gpuheal-validate-")]


async def test_a_repaired_node_passes_its_burn_in_and_returns(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    settings = validating(settings, slurm)
    slurm.inject_gpu_fault("gpu01")  # a reset mends it
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report(settings, "gpu01", 48))
        result = await asyncio.wait_for(handle.result(), 120)
    assert result.outcome == "resolved" and result.node_state == NodeState.RETURNED
    assert "gpu01" in nodes_in_service(slurm)
    (job,) = burn_ins(slurm)  # once
    assert job.endswith("COMPLETED gpu01")
    assert "No reservations" in slurm.slurm("scontrol", "show", "reservation")


@across_slurm
async def test_a_repaired_node_whose_gpu_still_fails_is_not_returned(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    """Ready after the reset, so the provider's health check passes; the burn-in does not."""
    settings = validating(settings, slurm)
    slurm.inject_lasting_fault("gpu01")
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report(settings, "gpu01", 48))
        result = await asyncio.wait_for(handle.result(), 120)
    assert result.outcome == "failed_validation" and result.node_state == NodeState.FAILED_VALIDATION
    assert "GPUs failed validation" in result.node_detail
    node = slurm.slurm("scontrol", "show", "node", "gpu01")
    assert "State=IDLE+DRAIN" in node  # takes no job: drained and out, for the vendor
    assert "GPU validation failed in gpuheal-" in node and "burn-in job" in node and "ended FAILED" in node
    (job,) = burn_ins(slurm)
    assert job.endswith("FAILED gpu01")
    assert "No reservations" in slurm.slurm("scontrol", "show", "reservation")


async def test_a_burn_in_slurm_refuses_leaves_the_node_drained_not_in_service(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    """sbatch refuses the site's script (here: it is missing) on every try: the node is drained
    again, never left resumed inside its reservation, and the incident ends failed_validation."""
    remediation = settings.remediation.model_copy(update={"validate_job": "/nonexistent/burn-in.sh"})
    settings = settings.model_copy(update={"remediation": remediation})
    slurm.inject_gpu_fault("gpu01")
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report(settings, "gpu01", 48))
        result = await asyncio.wait_for(handle.result(), 180)
    assert result.outcome == "failed_validation" and "the burn-in could not run" in result.node_detail
    assert "State=IDLE+DRAIN" in slurm.slurm("scontrol", "show", "node", "gpu01")
    reservations = slurm.slurm("scontrol", "show", "reservation")
    assert "Duration=UNLIMITED" not in reservations and "gpuheal-validate-gpu01" in reservations  # it ends by itself
