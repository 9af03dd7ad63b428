"""Decisions about jobs (gpuheal.core.job_policy): which signal, who owns it, how many requeues left."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuheal.core import job_policy, render
from gpuheal.core.jobs import PastRecovery
from gpuheal.core.models.slurm import CheckpointAsk, JobProgress, JobSnapshot

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def job(**kw: object) -> JobSnapshot:
    base: dict[str, object] = {
        "job_id": 12,
        "name": "train",
        "state": "RUNNING",
        "nodes": "gpu01",
        "requeueable": True,
        "restart_count": 0,
        "user": "alice",
    }
    return JobSnapshot.model_validate(base | kw)


@pytest.mark.parametrize(
    ("kw", "signal", "batch_only"),
    [
        ({"progress": JobProgress(step=1, checkpoint_step=0, signal="USR1")}, "USR1", True),
        ({"submit_line": "sbatch --signal=B:USR2@120 train.sh"}, "USR2", True),
        ({"submit_line": "sbatch --signal=USR1@60 train.sh"}, "USR1", False),
        ({"submit_line": "sbatch --signal=10@60 train.sh"}, "USR1", False),  # by number
        ({"submit_line": "sbatch --signal RB:SIGTERM train.sh"}, "TERM", True),
    ],
)
def test_a_job_is_asked_with_the_signal_it_named(kw: dict[str, object], signal: str, batch_only: bool) -> None:
    ask = job_policy.checkpoint_ask(job(**kw))
    assert ask is not None and (ask.signal, ask.batch_only) == (signal, batch_only)


@pytest.mark.parametrize(
    "kw",
    [{}, {"progress": JobProgress(step=1, checkpoint_step=0)}, {"submit_line": "sbatch --requeue train.sh"}],
)
def test_a_job_that_named_no_signal_is_never_signalled(kw: dict[str, object]) -> None:
    assert job_policy.checkpoint_ask(job(**kw)) is None


def test_a_progress_line_left_by_the_previous_run_asks_for_nothing() -> None:
    """Just requeued: the comment is still run 0's, the run now starting (restart 1) has not
    trapped USR1 yet, and an untrapped USR1 kills it."""
    stale = job(restart_count=1, progress=JobProgress(step=15, checkpoint_step=10, restart=0, signal="USR1"))
    assert job_policy.checkpoint_ask(stale) is None
    assert "has not said yet" in render.not_signalled(stale).detail
    fresh = job(restart_count=1, progress=JobProgress(step=16, checkpoint_step=10, restart=1, signal="USR1"))
    assert job_policy.checkpoint_ask(fresh) == CheckpointAsk(job_id=fresh.job_id, signal="USR1", batch_only=True)
    # Incidents started before the change replay as they ran: they took the old line's word.
    assert job_policy.checkpoint_ask(stale, this_run_only=False) is not None
    # A job that told Slurm itself (--signal) is asked whatever its line says.
    told = stale.model_copy(update={"submit_line": "sbatch --signal=B:USR1@60 train.sh"})
    assert job_policy.checkpoint_ask(told) is not None


def test_owners_are_the_user_the_mail_user_and_the_progress_lines_notify_each_once() -> None:
    progress = JobProgress(step=1, checkpoint_step=0, notify="ml-oncall@example.com")
    assert job_policy.owner_recipients(job(mail_user="alice@example.com", progress=progress)) == (
        "alice",
        "alice@example.com",
        "ml-oncall@example.com",
    )
    assert job_policy.owner_recipients(job(mail_user="alice")) == ("alice",)  # 24.11 defaults it to the user


def test_the_retry_budget_counts_gpuheals_requeues_and_names_the_suspects() -> None:
    past = [
        PastRecovery(recovery_id="r1", started_at=T0, requeued=True, failed_nodes=("gpu01",)),
        PastRecovery(recovery_id="r2", started_at=T0 + timedelta(hours=1), requeued=False, failed_nodes=("gpu02",)),
        PastRecovery(recovery_id="r3", started_at=T0 + timedelta(hours=2), requeued=True, failed_nodes=("gpu03",)),
    ]
    budget = job_policy.retry_budget(past, allowed=3, window_s=86400, failing_now=["gpu04"])
    assert (budget.used, budget.spent, budget.suspects) == (2, False, ("gpu01", "gpu03", "gpu04"))
    third = [*past, PastRecovery(recovery_id="r4", started_at=T0 + timedelta(hours=3), requeued=True)]
    assert job_policy.retry_budget(third, allowed=3, window_s=86400, failing_now=[]).spent


def test_nodes_excluded_for_another_open_incident_are_let_back_at_the_next_requeue_not_suspected() -> None:
    """A requeue kept the job off gpu05 (its incident was open, its drain not yet come): the next
    recovery lets the job back on gpu05 where healthy, and never names it a node it failed on."""
    past = [
        PastRecovery(recovery_id="r1", started_at=T0, requeued=True, failed_nodes=("gpu04",), avoided_nodes=("gpu05",)),
        PastRecovery(recovery_id="r2", started_at=T0, requeued=False, avoided_nodes=("gpu06",)),  # never requeued
    ]
    budget = job_policy.retry_budget(past, allowed=3, window_s=86400, failing_now=["gpu07"])
    assert budget.suspects == ("gpu04", "gpu07") and budget.avoided == ("gpu05",)
    assert job_policy.released_exclusions(budget) == ("gpu04", "gpu07", "gpu05")
    failed_there_since = [*past, PastRecovery(recovery_id="r3", started_at=T0, requeued=True, failed_nodes=("gpu05",))]
    assert job_policy.retry_budget(failed_there_since, 3, 86400, []).avoided == ()  # a suspect now


@pytest.mark.parametrize(
    ("state", "requeueable", "recoverable"),
    [("FAILED", True, True), ("NODE_FAIL", True, True), ("COMPLETED", True, False), ("FAILED", False, False)],
)
def test_a_job_that_failed_during_the_incident_is_recovered_not_forgotten(
    state: str, requeueable: bool, recoverable: bool
) -> None:
    before = job(requeueable=requeueable)
    assert job_policy.recoverable(before, before.model_copy(update={"state": state})) is recoverable


def test_gpuheal_may_have_ended_a_job_only_if_it_signalled_it() -> None:
    account = job_policy.account_ended(job(), job(state="COMPLETED"), None)
    assert account.fate.value == "ended" and not account.caused_by_gpuheal
