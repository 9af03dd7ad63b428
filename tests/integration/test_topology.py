"""Topology from Slurm itself, on a cluster without Kubernetes: `topology.conf` (topology/tree)
names the leaf switches, and a leaf losing half its nodes is one domain incident, on every Slurm
release the sandbox runs."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import Client
from temporalio.service import RPCError

from gpuheal.clients.slurm import wrapper
from gpuheal.clients.slurm.cli import SlurmCli
from gpuheal.core import ids
from gpuheal.core.fleet.models import FleetStatus
from gpuheal.core.fleet.policy import EscalationPolicy
from gpuheal.core.messages import FLEET_STATUS
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import start_or_join
from gpuheal.workers.main import make_worker
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import SLURM_IDS, SLURM_MATRIX, gpuheal, report, until

pytestmark = pytest.mark.integration
TOPOLOGY = "SwitchName=leaf1 Nodes=gpu[01-04];SwitchName=leaf2 Nodes=gpu[05-07];SwitchName=spine Switches=leaf[1-2]"
CLI_ONLY = [(b, v) for b, v in SLURM_MATRIX if b == "cli"]


@pytest.fixture
def leaves(slurm: Sandbox) -> Sandbox:
    """gpu01-04 under leaf1 (active), gpu05-07 under leaf2 (spares)."""
    slurm.extra_env.update({"GPUHEAL_SLURM_ACTIVE": "4", "GPUHEAL_SLURM_TOPOLOGY": TOPOLOGY})
    try:
        slurm.start_slurm(clean=True)
    finally:
        for key in ("GPUHEAL_SLURM_ACTIVE", "GPUHEAL_SLURM_TOPOLOGY"):
            slurm.extra_env.pop(key)
    return slurm


@pytest.mark.parametrize("slurm", CLI_ONLY, ids=[i for i in SLURM_IDS if i.startswith("cli")], indirect=True)
async def test_slurm_names_each_nodes_leaf_switch(leaves: Sandbox) -> None:
    s = Settings.from_env(leaves.env()).slurm
    cli = SlurmCli(s.conf, wrapper(s))
    topology = await cli.topology()
    assert {n: d["switch"] for n, d in topology.items()} == {
        **{f"gpu0{i}": "leaf1" for i in range(1, 5)},
        **{f"gpu0{i}": "leaf2" for i in range(5, 8)},
    }


async def test_half_a_leaf_switch_is_one_domain_incident_without_kubernetes(
    leaves: Sandbox, settings: Settings, client: Client
) -> None:
    policy = settings.fleet.model_copy(
        update={"escalation": EscalationPolicy(domain_share=0.5, window_s=300, min_nodes=2)}
    )
    settings = settings.model_copy(update={"fleet": policy})
    async with make_worker(client, settings):
        a = await start_or_join(client, settings, report(settings, "gpu01", 79))
        b = await start_or_join(client, settings, report(settings, "gpu02", 79))

        async def escalated() -> FleetStatus | None:
            try:
                s = await FLEET_STATUS.ask(client.get_workflow_handle(ids.coordinator_id(settings.cluster or "")))
            except RPCError:  # no coordinator yet
                return None
            return s if s.domain_incidents and len(s.held) == 2 else None

        fleet = await until(escalated, "a domain incident holding both", timeout=90)
        (domain,) = fleet.domain_incidents
        assert domain.domain == "switch=leaf1" and set(domain.nodes) == {"gpu01", "gpu02"}
        decided = await gpuheal(
            leaves, settings, "domain", "dismiss", "switch=leaf1", "--operator", "dana", "--reason", "the leaf"
        )
        assert decided.returncode == 0, decided.stderr
        results = await asyncio.wait_for(asyncio.gather(a.result(), b.result()), 180)
    assert [r.outcome for r in results] == ["escalated", "escalated"]
    assert all(r.replacement_node is None for r in results)  # one leaf incident, not two replacements
