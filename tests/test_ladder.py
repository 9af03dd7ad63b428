"""The application-fault ladder (issue 34, item 1): restart, then a burn-in, then a replacement.
The decision's invariants by Hypothesis (gpuheal.core.app_faults.burn_in_due), and the incident's
part on Temporal's time-skipping server with stand-in activities (tests/fakes.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from temporalio.testing import WorkflowEnvironment

from gpuheal.core.app_faults import AppFault, burn_in_due
from gpuheal.core.models.base import ActionClass
from gpuheal.core.models.result import RemediationResult
from tests.conftest import start_time_skipping
from tests.fakes import FakeCluster
from tests.test_workflow import report, settings, start_or_join, worker

T0 = datetime(2026, 12, 1, tzinfo=UTC)
NEEDED = 3


def fault(n: int, jobs: tuple[int, ...], burn_in: str | None = None) -> AppFault:
    return AppFault(
        incident_id="i",
        run_id=f"r{n}",
        closed_at=T0 + timedelta(minutes=n),
        jobs=jobs,
        burn_in=burn_in,  # type: ignore[arg-type]
    )


histories = st.lists(
    st.tuples(st.lists(st.integers(1, 6), max_size=2), st.sampled_from([None, None, None, "passed", "failed"])),
    max_size=6,
)


def _earlier(h: list[tuple[list[int], str | None]]) -> list[AppFault]:
    return [fault(n, tuple(jobs), b) for n, (jobs, b) in enumerate(h)]


@given(histories, st.lists(st.integers(1, 6), max_size=2))
def test_no_burn_in_without_as_many_different_jobs_since_the_last_passed_one(
    h: list[tuple[list[int], str | None]], now: list[int]
) -> None:
    earlier = _earlier(h)
    got = burn_in_due(earlier, now, NEEDED)
    passed = [i for i, (_, b) in enumerate(h) if b == "passed"]
    since = h[passed[-1] + 1 :] if passed else h
    jobs = {j for js, _ in since for j in js} | set(now)
    if got is not None:
        assert len(set(got)) >= NEEDED and set(got) <= jobs  # as many different jobs, all this GPU's since
    if len(jobs) < NEEDED:
        assert got is None


@given(st.integers(1, 9), st.integers(1, 8))
def test_one_job_crashing_again_and_again_never_condemns_the_gpu(job: int, times: int) -> None:
    assert burn_in_due([fault(n, (job,)) for n in range(times)], [job], NEEDED) is None


def test_the_third_different_job_is_one_too_many_and_a_passed_burn_in_clears_the_count() -> None:
    assert burn_in_due([fault(0, (1,)), fault(1, (2,))], [3], NEEDED) == (1, 2, 3)
    assert burn_in_due([fault(0, (1,)), fault(1, (2,), "passed")], [3], NEEDED) is None
    assert burn_in_due([fault(0, (1,)), fault(1, (2,))], [], NEEDED) is None  # no job: nothing to count


@pytest.fixture
async def env() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_time_skipping()
    yield env
    await env.shutdown()


def ladder(passes: bool = True, burn_in: str | None = "burn-in.sh") -> FakeCluster:
    """Job 7 on the node; two earlier application faults of its GPU hit jobs 5 and 6."""
    fake = FakeCluster()
    fake.settings = fake.settings.model_copy(update={"validate_job": burn_in})
    fake.app_faults = [fault(0, (5,)), fault(1, (6,))]
    if not passes:
        fake.bad_gpus = {"gpu01"}  # its burn-in fails (a spare's passes)
    return fake


async def remediate(env: WorkflowEnvironment, fake: FakeCluster, xid: int = 13) -> RemediationResult:
    s = settings()
    async with worker(env, s, fake):
        result: RemediationResult = await (await start_or_join(env.client, s, report(xid))).result()
    return result


async def test_the_third_job_hit_on_one_gpu_drains_it_for_a_burn_in_and_it_goes_back(env: WorkflowEnvironment) -> None:
    fake = ladder()
    result = await remediate(env, fake)
    assert result.outcome == "resolved" and result.burn_in == "passed", result.reason
    assert result.action == ActionClass.RESTART_APP and result.replacement_node is None
    assert "3 different jobs" in result.reason and "(5, 6, 7)" in result.reason
    calls = fake.calls
    assert calls.index("request_capacity") < calls.index("drain") < calls.index("requeue:7")
    assert calls.index("requeue:7") < calls.index("validate:gpu01") < calls.index("resume")
    assert "replace" not in calls and "health" not in calls
    (ask,) = fake.app_fault_asks
    assert ask.node == "gpu01" and ask.gpu == 0


async def test_a_failed_burn_in_replaces_the_node(env: WorkflowEnvironment) -> None:
    fake = ladder(passes=False)
    result = await remediate(env, fake)
    assert result.outcome == "resolved" and result.burn_in == "failed", result.reason
    assert result.action == ActionClass.REPLACE_NODE and result.replacement_node is not None
    assert "failed the burn-in" in result.node_detail and "resume" not in fake.calls


async def test_fewer_different_jobs_restart_in_place(env: WorkflowEnvironment) -> None:
    fake = ladder()
    fake.app_faults = [fault(0, (7,)), fault(1, (7,))]  # the same job, crashing again
    result = await remediate(env, fake)
    assert result.burn_in is None and "drain" not in fake.calls and "validate:gpu01" not in fake.calls


async def test_without_a_validation_job_the_operators_are_told_and_the_job_restarts(env: WorkflowEnvironment) -> None:
    fake = ladder(burn_in=None)
    result = await remediate(env, fake)
    assert result.burn_in is None and "drain" not in fake.calls
    assert "notify:burn_in_wanted" in fake.calls


async def test_a_hardware_fault_never_asks_for_the_ladder(env: WorkflowEnvironment) -> None:
    fake = ladder()
    await remediate(env, fake, xid=94)  # a restart, but the board's memory: the repeat rule's
    assert "find_application_faults" not in fake.calls
