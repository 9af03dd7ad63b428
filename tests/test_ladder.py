"""The application-fault ladder (issue 34, item 1): restart, then a burn-in, then a replacement.
The decision's invariants by Hypothesis (gpuheal.core.app_faults.burn_in_due), and the incident's
part on Temporal's time-skipping server with stand-in activities (tests/fakes.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from random import Random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from temporalio.testing import WorkflowEnvironment

from gpuheal.core.app_faults import AppFault, burn_in_due
from gpuheal.core.fleet.policy import FleetPolicy
from gpuheal.core.models.base import ActionClass
from gpuheal.core.models.incident import ApprovalPolicy
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


@given(histories, st.lists(st.integers(1, 6), max_size=2), st.randoms())
def test_a_burn_in_exactly_when_as_many_lone_jobs_were_hit_since_the_last_passed_one(
    h: list[tuple[list[int], str | None]], now: list[int], rnd: Random
) -> None:
    """Since the GPU's last passed burn-in (in time, whatever order Temporal lists them in), the
    different jobs of the incidents that had one job on the node, this one's among them: as many
    as the policy says, a burn-in naming them; fewer, a restart."""
    earlier = _earlier(h)
    rnd.shuffle(earlier)
    got = burn_in_due(earlier, now, NEEDED)
    passed = [i for i, (_, b) in enumerate(h) if b == "passed"]
    since = [jobs for jobs, _ in (h[passed[-1] + 1 :] if passed else h)] + [now]
    lone = {jobs[0] for jobs in since if len(set(jobs)) == 1}
    assert got == (tuple(sorted(lone)) if len(lone) >= NEEDED else None)


@given(st.integers(1, 9), st.integers(1, 8))
def test_one_job_crashing_again_and_again_never_condemns_the_gpu(job: int, times: int) -> None:
    assert burn_in_due([fault(n, (job,)) for n in range(times)], [job], NEEDED) is None


def test_a_shared_node_never_climbs_the_ladder() -> None:
    """Job 1 crashing on its GPU beside ever new neighbours is still one job."""
    assert burn_in_due([fault(0, (1, 2)), fault(1, (1, 3))], [1, 4], NEEDED) is None


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


async def test_a_burn_in_the_coordinator_cannot_grant_now_restarts_the_job_in_place(env: WorkflowEnvironment) -> None:
    """A crashed job never waits for a diagnosis: held, the incident leaves the line at once,
    restarts the job where it ran, and the operators are told the GPU wants diagnostics."""
    fake = ladder()
    fake.grant = False
    result = await remediate(env, fake)
    assert result.outcome == "resolved" and result.burn_in is None and result.drain is None
    assert "notify:burn_in_wanted" in fake.calls and "notify:held" not in fake.calls
    note = next(n for n in fake.notes if n.event == "burn_in_wanted")
    assert "no capacity for it now" in note.message and "restarts in place" in note.message
    assert fake.calls.index("request_capacity") < fake.calls.index("release_capacity") < fake.calls.index("requeue:7")


async def test_where_a_person_approves_replacements_the_ladder_only_tells(env: WorkflowEnvironment) -> None:
    fake = ladder()
    fake.policy = FleetPolicy(approval=ApprovalPolicy(required_for=(ActionClass.REPLACE_NODE,)))
    result = await remediate(env, fake)
    assert result.burn_in is None and "drain" not in fake.calls and "notify:burn_in_wanted" in fake.calls


@pytest.mark.parametrize("cause", ["never_started", "could_not_run"])
async def test_a_burn_in_that_gave_no_verdict_condemns_nothing(env: WorkflowEnvironment, cause: str) -> None:
    """Behind another job until its bound, or refused by Slurm: kept drained for a person; not
    replaced, not admitted again as hardware, no RMA."""
    fake = ladder()
    if cause == "never_started":
        fake.waiting_gpus = {"gpu01"}
    else:
        fake.validation_fails = True
    result = await remediate(env, fake)
    assert result.outcome == "unvalidated" and result.replacement_node is None, result.reason
    assert "replace" not in fake.calls and "resume" not in fake.calls and "gather_rma" not in fake.calls
    assert fake.admitted == [True]  # admitted once, as the application fault it is


async def test_a_failed_burn_in_is_counted_as_hardware_before_the_node_is_replaced(env: WorkflowEnvironment) -> None:
    fake = ladder(passes=False)
    await remediate(env, fake)
    assert fake.admitted == [True, False], fake.calls  # admitted again, as hardware this time
    readmitted = len(fake.calls) - 1 - fake.calls[::-1].index("admit")
    assert readmitted < fake.calls.index("confirm_capacity") < fake.calls.index("replace")
