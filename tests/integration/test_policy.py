"""Policy as configuration on the real stack: the cluster's policy in a file, applied with
`gpuheal policy apply` as a recorded, versioned change that the next incident runs under, and a
worker (its own process, as deployed) restarted with the same configuration or a changed one."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.service import RPCError

from gpuheal.core import ids
from gpuheal.core.messages import FLEET_POLICY
from gpuheal.core.models.result import RemediationResult
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import start_or_join
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import gpuheal, report, until, worker_env

pytestmark = pytest.mark.integration

# The test's roomy policy (conftest's worker_env sets it as variables; here it is the file's).
ROOMY = 'budget:\n  cluster: "100"\n  node_cooldown_s: 0\nduplicate_window_s: 0\n'
NO_VARIABLES = {"GPUHEAL_BUDGET": "", "GPUHEAL_NODE_COOLDOWN_S": "", "GPUHEAL_DUPLICATE_WINDOW_S": ""}


async def incident(client: Client, settings: Settings, node: str) -> RemediationResult:
    handle = await start_or_join(client, settings, report(settings, node, 79))
    return await asyncio.wait_for(handle.result(), 120)


async def version(client: Client, settings: Settings) -> tuple[int, str]:
    v = await FLEET_POLICY.ask(client.get_workflow_handle(ids.coordinator_id(settings.cluster or "")))
    return v.version, v.changed_by


async def test_a_policy_file_applied_reaches_the_next_incident_and_a_restart_keeps_it(
    slurm: Sandbox, settings: Settings, client: Client, tmp_path: Path
) -> None:
    configured = tmp_path / "configured.yaml"
    configured.write_text(ROOMY)
    with worker_env(slurm, settings, GPUHEAL_POLICY_FILE=str(configured), **NO_VARIABLES):
        worker = slurm.start_worker()
        try:
            first = await incident(client, settings, "gpu01")
            assert first.outcome == "resolved" and first.policy_version == 1

            change = tmp_path / "observe.yaml"
            change.write_text("mode: observe\n")
            diff = await gpuheal(slurm, settings, "policy", "diff", str(change))
            assert diff.returncode == 1 and "mode: 'auto' -> 'observe'" in diff.stdout
            bad = tmp_path / "bad.yaml"
            bad.write_text('budget:\n  cluster: "5.5"\n')
            refused = await gpuheal(
                slurm, settings, "policy", "apply", str(bad), "--operator", "alice", "--reason", "x"
            )
            assert refused.returncode == 2 and "budget.cluster" in refused.stderr and "'5.5'" in refused.stderr
            applied = await gpuheal(
                slurm, settings, "policy", "apply", str(change), "--operator", "alice", "--reason", "trial week"
            )
            assert applied.returncode == 0, applied.stderr
            assert "policy version 2" in applied.stdout and await version(client, settings) == (2, "alice")
            second = await incident(client, settings, "gpu02")
            assert second.outcome == "observed" and second.policy_version == 2

            # Restarted with the same configuration: alice's recorded change stands.
            Sandbox.stop_process(worker)
            worker = slurm.start_worker()
            await asyncio.sleep(3)
            third = await incident(client, settings, "gpu03")
            assert third.outcome == "observed" and await version(client, settings) == (2, "alice")

            # Restarted with a changed configuration (a Helm upgrade): it applies, recorded as such.
            configured.write_text(ROOMY + 'containment_limit: "1"\n')
            Sandbox.stop_process(worker)
            worker = slurm.start_worker()

            async def applied_by_the_configuration() -> bool:
                try:  # right after the restart a query may wait out the dead worker's sticky queue
                    v, by = await version(client, settings)
                except RPCError:
                    return False
                return v == 3 and by.startswith("configuration (worker ")

            await until(applied_by_the_configuration, "the changed configuration applied as version 3")
            shown = await gpuheal(slurm, settings, "policy", "show")
            assert shown.returncode == 0 and "policy version 3" in shown.stdout
            assert "containment_limit: '1'" in shown.stdout and "mode: auto" in shown.stdout
            fourth = await incident(client, settings, "gpu02")  # (gpu01 was replaced by the first)
            assert fourth.outcome == "resolved" and fourth.policy_version == 3
        finally:
            Sandbox.stop_process(worker)
    # No worker now: the coordinator answers no query (as in a storm), yet the levers read what it
    # published in its memo, at once.
    shown = await gpuheal(slurm, settings, "policy", "show")
    assert shown.returncode == 0 and "policy version 3" in shown.stdout, shown.stderr
    diff = await gpuheal(slurm, settings, "policy", "diff", str(change))
    assert diff.returncode == 1 and "mode: 'auto' -> 'observe'" in diff.stdout
    args = ("domain", "release", "rack=r9", "--operator", "dana", "--reason", "x")
    none = await gpuheal(slurm, settings, *args)
    assert none.returncode == 1 and "no open domain incident for 'rack=r9' (open: none)" in none.stderr
