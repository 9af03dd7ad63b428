"""Two gpuheal clusters on one Temporal cluster: the 22.05 sandbox and the 26.05 sandbox, each
with its own worker, task queue, coordinator and policy, in one shared namespace (docs/production.md
says why). A storm that trips one cluster's breaker never holds, drains or
counts against the other; `gpuheal` commands name the cluster they act on and say it back."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.client import Client

from gpuheal.core.fleet.models import FleetStatus
from gpuheal.core.models.base import Stage
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import start_or_join
from gpuheal.workflows.remediation import GpuRemediationWorkflow
from infra.sandbox import HOST_SLURM, NEWEST_SLURM
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import report, slurmctld_log, until, worker_env
from tests.integration.production.conftest import cluster_settings
from tests.integration.test_fleet import fleet_status

pytestmark = pytest.mark.integration

GPUHEAL = str(Path(sys.executable).parent / "gpuheal")


def gpuheal(sb: Sandbox, *args: str) -> subprocess.CompletedProcess[str]:
    """Our CLI with no cluster in its environment: each command names the one it means."""
    env = {**sb.env(), "GPUHEAL_CLUSTER": ""}
    return subprocess.run([GPUHEAL, *args], env=env, capture_output=True, text=True, timeout=60)


async def test_a_storm_on_one_cluster_never_touches_the_other(prod: Sandbox, prod_client: Client) -> None:
    started: list[subprocess.Popen[bytes]] = []
    clusters: dict[str, Settings] = {}
    for index, (version, name) in enumerate(((HOST_SLURM, "east"), (NEWEST_SLURM, "west"))):
        prod.use_slurm(version)
        prod.start_slurm(clean=True)
        clusters[version] = cluster_settings(prod, name)
        breaker = {"GPUHEAL_BREAKER_MAX": "2"} if name == "east" else {}
        with worker_env(prod, clusters[version], **breaker):
            started.append(prod.start_worker(index))
    east, west = clusters[HOST_SLURM], clusters[NEWEST_SLURM]
    try:
        storm = [await start_or_join(prod_client, east, report(east, n, 79)) for n in ("gpu01", "gpu02", "gpu03")]

        async def tripped() -> FleetStatus | None:
            try:
                s = await fleet_status(prod_client, east)
            except Exception:
                return None
            return s if s.breaker.tripped and s.held else None

        await until(tripped, "east's breaker tripped by its storm", timeout=120)
        # West, meanwhile: its incident goes through, granted by its own coordinator.
        incident = await start_or_join(prod_client, west, report(west, "gpu01", 79))
        result = await asyncio.wait_for(incident.result(), 180)
        assert result.outcome == "resolved", result.reason
        assert not any(s.stage == Stage.HELD for s in result.stages)
        west_fleet = await fleet_status(prod_client, west)
        assert not west_fleet.breaker.tripped and west_fleet.held == ()
        east_fleet = await fleet_status(prod_client, east)
        assert {h.incident_id for h in east_fleet.held} <= {h.id for h in storm}
        # Slurm's own logs: west drained its one node; east's storm drained nothing of west's.
        prod.use_slurm(NEWEST_SLURM)
        west_log = slurmctld_log(prod)
        assert west_log.count("state set to DRAIN") == 1 and "node gpu01 state set to DRAIN" in west_log

        # The CLI: no cluster in the environment, so each command names one, and says it back.
        unnamed = await asyncio.to_thread(gpuheal, prod, "fleet")
        assert unnamed.returncode != 0 and "GPUHEAL_CLUSTER is not set" in unnamed.stderr
        shown = {
            c.cluster: await asyncio.to_thread(gpuheal, prod, "fleet", "--cluster", c.cluster or "")
            for c in (east, west)
        }
        assert f"cluster {east.cluster}: " in shown[east.cluster].stdout and "TRIPPED" in shown[east.cluster].stdout
        assert f"cluster {west.cluster}: " in shown[west.cluster].stdout
        assert "breaker     closed" in shown[west.cluster].stdout
        resumed = await asyncio.to_thread(
            gpuheal, prod, "resume", "--cluster", east.cluster or "", "--operator", "alice", "--reason", "storm over"
        )
        assert resumed.returncode == 0 and resumed.stdout.startswith(f"cluster {east.cluster}: "), resumed
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in storm)), 240)
        assert [r.outcome for r in results] == ["resolved"] * 3
        for h in storm:  # each held on the way (the breaker), none touched by west
            assert (await h.query(GpuRemediationWorkflow.status)).stage == Stage.DONE
    finally:
        for w in started:
            Sandbox.stop_process(w)
