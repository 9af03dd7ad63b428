"""A requeued job's verification (JobActivities.wait_for_job_resume) over what Slurm shows, poll
by poll: its deadline counts from when it runs again, not from the requeue (a wait in Slurm for a
replacement and its burn-in is not the job's slowness), and a job that runs again on a node it
was requeued away from is "not resumed", said so, never an error that fails its recovery."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest
from temporalio.testing import ActivityEnvironment

from gpuheal.activities import jobs as jobs_module
from gpuheal.activities.jobs import JobActivities
from gpuheal.clients.owners import OwnerDelivery
from gpuheal.clients.slurm import JobUpdate, SlurmBackend
from gpuheal.core.jobs import VerifyJobRequest, VerifyOutcome
from gpuheal.core.models.incident import JobRecoverySettings
from gpuheal.core.models.slurm import JobProgress, JobSnapshot, RequeueResult
from gpuheal.core.settings import OwnerSettings

POLL_S = 0.02


def job(state: str, nodes: str = "", restart: int = 0, step: int | None = None, reason: str = "") -> JobSnapshot:
    progress = JobProgress(step=step, checkpoint_step=40, restart=restart) if step is not None else None
    return JobSnapshot(
        job_id=3,
        name="train",
        state=state,
        state_reason=reason,
        nodes=nodes,
        requeueable=True,
        restart_count=restart,
        progress=progress,
    )


class Showing:
    """Slurm's answers, one per poll; the last one repeats."""

    def __init__(self, *answers: JobSnapshot) -> None:
        self._answers: Iterator[JobSnapshot] = iter(answers)
        self._last = answers[-1]
        self.polls = 0
        self.at: list[float] = []  # each poll's moment (monotonic)

    async def job(self, job_id: int) -> JobSnapshot:
        self.polls += 1
        self.at.append(time.monotonic())
        self._last = next(self._answers, self._last)
        return self._last

    async def update_job(self, job_id: int, update: JobUpdate) -> None:
        self.updated = (self._last.state, update)


async def run(slurm: Showing, **kw: Any) -> VerifyOutcome:
    """One attempt of the activity; `beat`: what an earlier attempt heartbeated."""
    acts = JobActivities(
        slurm=cast(SlurmBackend, slurm), owners=OwnerDelivery(OwnerSettings()), recovery=JobRecoverySettings()
    )
    req = VerifyJobRequest(
        requeue=RequeueResult(job_id=3, requeued=True, restart_count_before=0, step_at_failure=42, checkpoint_step=40),
        avoid_nodes=kw.get("avoid", ()),
        deadline_at=time.time() + kw["within_s"],
        run_for_s=kw.get("run_for_s"),
        poll_interval_s=kw.get("poll_s", POLL_S),
    )
    env = ActivityEnvironment()
    if "beat" in kw:
        env.info = dataclasses.replace(env.info, heartbeat_details=[kw["beat"]])
    return await env.run(acts.wait_for_job_resume, req)


PENDING = job("PENDING", reason="Resources")


async def test_a_job_waiting_for_its_replacement_has_its_whole_deadline_once_it_runs() -> None:
    """Pending (a replacement, its burn-in) for longer than its 0.5 s to train past its
    checkpoint, then running and past it: resumed, not silent at 0.5 s after the requeue."""
    pending = [PENDING] * 40  # 40 polls of a pending job (0.02 s apart): past 0.5 s
    slurm = Showing(*pending, job("RUNNING", "gpu09", 1), job("RUNNING", "gpu09", 1, step=41))
    started = time.monotonic()
    got = await run(slurm, run_for_s=0.5, within_s=30)
    assert got.outcome == "resumed" and got.resumed is not None and got.resumed.node == "gpu09", got
    assert time.monotonic() - started > 0.5  # it did wait past the deadline a requeue-based clock had


async def test_a_requeued_job_is_seen_running_and_past_its_checkpoint_within_a_poll() -> None:
    """The MTTR's last part: pending for the scheduler's next pass, it is asked at least every
    poll interval (0.5 s), not every 10 s; running again, every 0.1 s until it is past its checkpoint.
    (A pending job's slow pace once applied from its first poll: a job running 0.8 s after its
    requeue was seen 10 s later.)"""
    running = [job("RUNNING", "gpu09", 1)] * 8  # its restart: 8 polls before its first step
    slurm = Showing(*[PENDING] * 3, *running, job("RUNNING", "gpu09", 1, step=41))
    started = time.monotonic()
    got = await run(slurm, within_s=60, poll_s=0.5)
    took = time.monotonic() - started
    assert got.outcome == "resumed", got
    pending_gaps = [b - a for a, b in itertools.pairwise(slurm.at[:4])]
    running_gaps = [b - a for a, b in itertools.pairwise(slurm.at[3:])]
    assert all(g < 0.6 for g in pending_gaps), pending_gaps  # fast at first, up to the interval
    assert max(running_gaps) < 0.2, running_gaps  # 0.05 growing to 0.1 (+ the loop's own time)
    assert took < 3, took


async def test_a_job_stuck_completing_is_not_asked_at_the_restart_pace() -> None:
    """Only a job that just ran again is asked every 0.1 s: one stuck COMPLETING (a hung
    node's epilog; in a storm, thousands) is asked at the request's interval once past the
    first few questions."""
    slurm = Showing(*[job("COMPLETING", "gpu01", 0)] * 12, job("RUNNING", "gpu09", 1, step=41))
    got = await run(slurm, within_s=60, poll_s=0.5)
    assert got.outcome == "resumed", got
    gaps = [b - a for a, b in itertools.pairwise(slurm.at[:12])]
    assert min(gaps[6:]) >= 0.4, gaps


async def test_a_job_pending_past_the_schedulers_pass_is_asked_less(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pending longer than PENDING_FAST_S (a replacement, a reservation): asked at most every
    PENDING_POLLS polls' worth of interval (0.4 s here), no longer every interval."""
    monkeypatch.setattr(jobs_module, "PENDING_FAST_S", 0.2)
    slurm = Showing(*[PENDING] * 20, job("RUNNING", "gpu09", 1, step=41))
    got = await run(slurm, within_s=60)
    assert got.outcome == "resumed", got
    gaps = [b - a for a, b in itertools.pairwise(slurm.at)]
    fast, slow = [g for g in gaps if g < 0.1], [g for g in gaps if g >= 0.35]
    assert fast and slow and len(fast) + len(slow) == len(gaps), gaps


async def test_a_job_that_runs_and_stays_silent_is_called_so_its_deadline_after_it_started() -> None:
    slurm = Showing(*[PENDING] * 3, job("RUNNING", "gpu09", 1))  # running, never past its checkpoint
    started = time.monotonic()
    got = await run(slurm, run_for_s=0.5, within_s=30)
    took = time.monotonic() - started
    assert got.outcome == "silent" and "no progress past its checkpoint" in got.reason, got
    assert 0.5 <= took < 10  # from its start, far before the outer bound


async def test_a_job_that_never_runs_is_silent_at_the_outer_bound() -> None:
    started = time.monotonic()
    got = await run(Showing(PENDING), run_for_s=0.2, within_s=1.0)
    assert got.outcome == "silent" and "PENDING (Resources)" in got.reason, got
    assert time.monotonic() - started >= 1.0  # not at run_for_s: it never ran


async def test_without_run_for_s_a_recovery_of_an_earlier_release_keeps_its_requeue_deadline() -> None:
    got = await run(Showing(PENDING), run_for_s=None, within_s=0.3)
    assert got.outcome == "silent"


async def test_a_job_back_on_a_node_it_was_requeued_away_from_is_not_resumed_and_no_error() -> None:
    slurm = Showing(PENDING, job("RUNNING", "gpu02", 1, step=43))
    got = await run(slurm, run_for_s=5, within_s=30, avoid=("gpu02",))
    assert got.outcome == "on_failed_node" and got.resumed is None
    assert "gpu02" in got.reason and "requeued away from" in got.reason


async def test_a_job_restarted_where_it_ran_resumes_when_nothing_was_to_be_avoided() -> None:
    """An application restart (XID 13) never takes the node out: back on it is resumed."""
    got = await run(Showing(job("RUNNING", "gpu02", 1, step=43)), run_for_s=5, within_s=30)
    assert got.outcome == "resumed" and got.resumed is not None and got.resumed.node == "gpu02"


async def test_a_retry_keeps_the_deadline_from_when_the_job_first_ran_again() -> None:
    """A worker restart retries the wait: the job's start, heartbeated, still counts."""
    started = time.monotonic()
    beat = {"job": 3, "state": "RUNNING", "running_since": time.time() - 60}
    got = await run(Showing(job("RUNNING", "gpu09", 1)), run_for_s=30, within_s=300, beat=beat)
    assert got.outcome == "silent" and time.monotonic() - started < 5  # 60 s in: past its 30 s already


async def test_a_requeued_job_is_asked_after_closely_until_it_pends_then_updated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between the requeue and PENDING (REQUEUED, COMPLETING: well under a second) the job is
    asked every 0.25 s at most, then made eligible: the recovery's seconds are here. (The
    verification's 10 s pending pace once shadowed this one and let the pause grow to 10 s.)"""
    pauses: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    slurm = Showing(*[job("REQUEUED")] * 12, PENDING)
    acts = JobActivities(
        slurm=cast(SlurmBackend, slurm), owners=OwnerDelivery(OwnerSettings()), recovery=JobRecoverySettings()
    )
    update = JobUpdate(start_now=True, excluded_nodes=("gpu01",))
    await ActivityEnvironment().run(acts._when_pending, 3, update)
    assert slurm.updated == ("PENDING", update)
    assert len(pauses) == 12 and max(pauses) <= 0.25, pauses

    pauses.clear()  # stuck COMPLETING (a hung node's epilog): after 3 s asked less, up to every 2 s
    stuck = Showing(job("COMPLETING"))
    acts = JobActivities(
        slurm=cast(SlurmBackend, stuck), owners=OwnerDelivery(OwnerSettings()), recovery=JobRecoverySettings()
    )
    with pytest.raises(RuntimeError, match="did not become PENDING"):
        await ActivityEnvironment().run(acts._when_pending, 3, update)
    fast = [p for i, p in enumerate(pauses) if sum(pauses[:i]) < 3]
    assert max(fast) <= 0.25 and max(pauses) == 2.0 and stuck.polls < 40, (stuck.polls, pauses)
