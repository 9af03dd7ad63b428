"""Each of an operator's levers once, through `gpuheal` on the real coordinator (Temporal dev
server, Slurm sandbox): the rate and a node's cooldown hold incidents, `gpuheal fleet` shows
them (from the coordinator's memo), `override` lets one go, `policy apply` frees the rest, and
`mode` changes what the next incident does. Pause, resume and the domain decisions are in
tests/integration/test_fleet.py, the policy file's restarts in tests/integration/test_policy.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from gpuheal.core.fleet.policy import BudgetPolicy
from gpuheal.core.models.base import Stage
from gpuheal.core.models.result import RemediationResult
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import start_or_join
from gpuheal.workers.main import make_worker
from gpuheal.workflows.remediation import GpuRemediationWorkflow
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import gpuheal, report, until

pytestmark = pytest.mark.integration


async def held(handle: Any, why: str) -> bool:
    s = await handle.query(GpuRemediationWorkflow.status)
    return bool(s.stage == Stage.HELD and why in (s.held or ""))


async def ended(handle: Any) -> RemediationResult:
    result: RemediationResult = await asyncio.wait_for(handle.result(), 120)
    return result


async def test_rate_cooldown_override_policy_and_mode_each_once_on_the_real_coordinator(
    slurm: Sandbox, settings: Settings, client: Client, tmp_path: Path
) -> None:
    budget = BudgetPolicy(cluster="100", rate=1, rate_window_s=3600, node_cooldown_s=3600)
    settings = settings.model_copy(update={"fleet": settings.fleet.model_copy(update={"budget": budget})})
    async with make_worker(client, settings):
        first = await start_or_join(client, settings, report(settings, "gpu03", 48))
        assert (await ended(first)).outcome == "resolved"

        # The rate: one remediation an hour, so gpu01's waits, and the operator sees why.
        rated = await start_or_join(client, settings, report(settings, "gpu01", 48))
        await until(lambda: held(rated, "rate: 1 remediations"), "gpu01 held by the rate")

        # `gpuheal fleet` reads the coordinator's memo, written at most once a second: the hold
        # shows there within that, not at the instant the incident's own status says it.
        async def fleet_shows_the_hold() -> str | None:
            shown = await gpuheal(slurm, settings, "fleet")
            assert shown.returncode == 0, shown.stderr
            return shown.stdout if "held   1    gpu01" in shown.stdout else None

        shown = await until(fleet_shows_the_hold, "gpuheal fleet showing gpu01 held", timeout=30)
        assert "rate: 1 remediations" in shown, shown

        # An override lets it go now, past the rate (and counts once).
        let = await gpuheal(slurm, settings, "override", "gpu01", "--operator", "olga", "--reason", "owner asked")
        assert let.returncode == 0, let.stderr
        assert (await ended(rated)).outcome == "resolved"

        # gpu03 fails again within its hour: its cooldown holds it.
        again = await start_or_join(client, settings, report(settings, "gpu03", 48))
        await until(lambda: held(again, "cooling down"), "gpu03 held by its cooldown")

        # A policy change through the file (no cooldown, a roomy rate) frees it at once.
        change = tmp_path / "roomy.yaml"
        change.write_text("budget:\n  rate: 100\n  node_cooldown_s: 0\n")
        applied = await gpuheal(
            slurm, settings, "policy", "apply", str(change), "--operator", "olga", "--reason", "end of the test's hold"
        )
        assert applied.returncode == 0, applied.stderr
        assert (await ended(again)).outcome == "resolved"

        # The mode: observe, and the next incident touches nothing.
        moded = await gpuheal(slurm, settings, "mode", "observe", "--operator", "olga", "--reason", "trial")
        assert moded.returncode == 0 and "mode auto -> observe" in moded.stdout, moded.stdout + moded.stderr
        observed = await start_or_join(client, settings, report(settings, "gpu02", 48))
        assert (await ended(observed)).outcome == "observed"
        assert "gpu02" in {n for n, i in slurm.nodes().items() if not i.drained}
