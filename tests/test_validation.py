"""A repaired node takes jobs only after its GPUs pass validation; a failed validation, or a failed
health check with no spare, is a named outcome, never `resolved` (time-skipping server, fakes)."""

from __future__ import annotations

import pytest
from temporalio.testing import WorkflowEnvironment

from gpuheal.core.models import NodeState, ValidationResult
from gpuheal.triggers.start import start_or_join
from tests.fakes import FakeCluster
from tests.test_workflow import report, settings, worker

BURN_IN = "/opt/site/burn-in.sh"


async def test_a_repaired_node_is_burned_in_before_it_is_resumed(env: WorkflowEnvironment) -> None:
    fake, s = FakeCluster(), settings()
    fake.settings = fake.settings.model_copy(update={"validate_job": BURN_IN})
    async with worker(env, s, fake):
        result = await (await start_or_join(env.client, s, report(48))).result()
    assert fake.calls.index("health") < fake.calls.index("validate") < fake.calls.index("resume")
    assert result.outcome == "resolved" and result.node_state == NodeState.RETURNED


async def test_a_failed_validation_leaves_the_node_out_and_is_not_resolved(env: WorkflowEnvironment) -> None:
    fake, s = FakeCluster(), settings()
    fake.settings = fake.settings.model_copy(update={"validate_job": BURN_IN})
    fake.validation = ValidationResult(passed=False, detail="burn-in job 90 ended FAILED (exit 1:0)", job_id=90)
    async with worker(env, s, fake):
        result = await (await start_or_join(env.client, s, report(48))).result()
    assert result.outcome == "failed_validation" and result.node_state == NodeState.FAILED_VALIDATION
    assert "burn-in job 90 ended FAILED" in result.node_detail and "resume" not in fake.calls
    assert "notify:closed_failed_validation" in fake.calls
    (release,) = fake.releases
    assert release.left_drained  # still drained by its incident: it stays counted against the budget


@pytest.mark.parametrize("spares", [0, 1])
async def test_a_failed_health_check_with_no_spare_is_no_capacity(env: WorkflowEnvironment, spares: int) -> None:
    fake, s = FakeCluster(healthy_after_repair=False, spares=spares), settings()
    async with worker(env, s, fake):
        result = await (await start_or_join(env.client, s, report(48))).result()
    assert "validate" not in fake.calls  # no burn-in configured: the provider's health check only
    if spares:
        assert result.outcome == "resolved" and result.node_state == NodeState.REPLACED
    else:
        assert result.outcome == "no_capacity" and result.node_state == NodeState.AWAITING_REPLACEMENT
