"""Application faults condemn no hardware, on the real Temporal dev server and Slurm sandbox
(issue 34, items 1-2): XID 31, then 43, then 13 on one node within a minute, under a repeat rule
of three incidents and a breaker that trips past two. Each restarts the application; none drains
the node, none is a repeat offender, the breaker stays closed, and `gpuheal fleet` says what it
counts. A hardware fault on the node afterwards is the first the coordinator counts."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import Client

from gpuheal.core.fleet.policy import BreakerPolicy, RepeatPolicy
from gpuheal.core.models.base import ActionClass, NodeState
from gpuheal.core.models.result import RemediationResult
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import start_or_join
from gpuheal.workers.main import make_worker
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import gpuheal, report
from tests.integration.test_fleet import fleet_status, with_fleet

pytestmark = pytest.mark.integration


async def test_application_faults_on_one_node_restart_and_condemn_nothing(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    settings = with_fleet(
        settings, repeat=RepeatPolicy(incidents=3), breaker=BreakerPolicy(max_incidents=2, window_s=600)
    )
    results: list[RemediationResult] = []
    async with make_worker(client, settings):
        for xid in (31, 43, 13):
            handle = await start_or_join(client, settings, report(settings, "gpu02", xid, gpu=1))
            results.append(await asyncio.wait_for(handle.result(), 120))
        status = await fleet_status(client, settings)
        shown = await gpuheal(slurm, settings, "fleet")
        # A hardware fault now: the first the coordinator counts (no repeat verdict from the three).
        reset = await start_or_join(client, settings, report(settings, "gpu02", 48, gpu=1))
        after: RemediationResult = await asyncio.wait_for(reset.result(), 120)
    for r in results:
        assert r.outcome == "resolved" and r.action == ActionClass.RESTART_APP, (r.action, r.reason)
        assert r.node_state == NodeState.IN_SERVICE and r.drain is None and r.replacement_node is None
        assert "repeat offender" not in r.reason
    assert not slurm.nodes()["gpu02"].drained
    assert not status.breaker.tripped, status.breaker.why
    assert shown.returncode == 0 and "application faults (XID 13, 31, 43 alone)" in shown.stdout, shown.stdout
    assert after.action == ActionClass.RESET_GPU and "repeat offender" not in after.reason, after.reason
