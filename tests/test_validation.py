"""A repaired node takes jobs only after its GPUs pass validation; a failed validation, or a failed
health check with no spare, is a named outcome, never `resolved` (time-skipping server, fakes)."""

from __future__ import annotations

import pytest
from temporalio.testing import WorkflowEnvironment

from gpuheal.core.models.base import NodeState
from gpuheal.core.models.slurm import ValidationResult
from gpuheal.triggers.start import start_or_join
from gpuheal.workflows.incident.node import MAX_REJECTED
from tests.fakes import FakeCluster
from tests.test_workflow import report, settings, worker

BURN_IN = "/opt/site/burn-in.sh"


async def test_a_repaired_node_is_burned_in_before_it_is_resumed(env: WorkflowEnvironment) -> None:
    fake, s = FakeCluster(), settings()
    fake.settings = fake.settings.model_copy(update={"validate_job": BURN_IN})
    async with worker(env, s, fake):
        result = await (await start_or_join(env.client, s, report(48))).result()
    assert fake.calls.index("health") < fake.calls.index("validate:gpu01") < fake.calls.index("resume")
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
    # No burn-in configured: the provider's health check only.
    assert not any(c.startswith("validate") for c in fake.calls)
    if spares:
        assert result.outcome == "resolved" and result.node_state == NodeState.REPLACED
    else:
        assert result.outcome == "no_capacity" and result.node_state == NodeState.AWAITING_REPLACEMENT


async def test_a_new_node_that_fails_its_burn_in_is_rejected_and_another_taken(env: WorkflowEnvironment) -> None:
    """Replaced (XID 79): each new node is held and burned in first; a bad one is never asked
    for again (the next request names it), and the one that passes is the replacement."""
    fake, s = FakeCluster(), settings()
    fake.settings = fake.settings.model_copy(update={"validate_job": BURN_IN, "capacity_retry_s": 1})
    fake.bad_gpus = {"gpu09"}
    async with worker(env, s, fake):
        result = await (await start_or_join(env.client, s, report(79))).result()
    assert result.outcome == "resolved" and result.replacement_node == "gpu10"
    assert "after gpu09 failed GPU validation" in result.node_detail
    first, second = fake.replace_requests
    assert first.rejected == () and second.rejected == ("gpu09",)
    assert first.hold_for_validation_s == second.hold_for_validation_s == fake.settings.validate_timeout_s
    assert fake.calls.index("validate:gpu10") < fake.calls.index("decommission")


async def test_new_nodes_that_all_fail_end_no_capacity_after_the_bound(env: WorkflowEnvironment) -> None:
    fake, s = FakeCluster(), settings()
    fake.settings = fake.settings.model_copy(update={"validate_job": BURN_IN, "capacity_retry_s": 1})
    fake.bad_gpus = {f"gpu{n:02d}" for n in range(9, 20)}
    async with worker(env, s, fake):
        result = await (await start_or_join(env.client, s, report(79))).result()
    assert result.outcome == "no_capacity" and "gpu09, gpu10, gpu11 failed GPU validation" in result.reason
    assert len(fake.replace_requests) == MAX_REJECTED and "decommission" not in fake.calls
