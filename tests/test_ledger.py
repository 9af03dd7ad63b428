"""The incident's job ledger (workflows/incident/ledger.py): every job that was on the failed
node is accounted for, once, in the order it was found, whatever happened to it meanwhile."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuheal.core.jobs import JobRecoveryResult
from gpuheal.core.models.result import JobFate
from gpuheal.core.models.slurm import JobSnapshot
from gpuheal.workflows.incident.ledger import JobLedger, not_requeued

INCIDENT = "gpuheal-c-gpu01"
# What Slurm says of a job at the requeue: still on the node, ended on its own, gone from Slurm.
FATES = st.sampled_from(["live", "COMPLETED", "FAILED", "NODE_FAIL", "CANCELLED", "purged"])


def job(job_id: int, state: str = "RUNNING", requeueable: bool = True) -> JobSnapshot:
    return JobSnapshot(
        job_id=job_id, name=f"j{job_id}", state=state, nodes="gpu01", requeueable=requeueable, restart_count=0
    )


def answer(recovery_id: str, j: JobSnapshot) -> JobRecoveryResult:
    return JobRecoveryResult(
        recovery_id=recovery_id,
        job_id=j.job_id,
        job_name=j.name,
        user="",
        fate=JobFate.REQUEUED,
        detail="requeued",
        incidents=(INCIDENT,),
        failed_nodes=("gpu01",),
    )


@given(
    jobs=st.lists(st.tuples(FATES, st.booleans(), st.booleans()), max_size=8),
    late=st.integers(min_value=0, max_value=2),
)
def test_every_job_on_the_node_is_accounted_for_once_in_order(jobs: list[tuple[str, bool, bool]], late: int) -> None:
    ledger = JobLedger()
    found = [job(i + 1, requeueable=requeueable) for i, (_, requeueable, _) in enumerate(jobs)]
    ledger.found(found)
    live = [j for j, (fate, _, _) in zip(found, jobs, strict=True) if fate == "live"]
    ended = [j for j in found if j not in live]
    now = [
        job(j.job_id, state=fate) for j, (fate, _, _) in zip(found, jobs, strict=True) if fate not in ("live", "purged")
    ]
    # Jobs that started on the node after the first look are handed over too.
    newcomers = [job(100 + i) for i in range(late)]
    to_recover = ledger.sort_out([*live, *newcomers], ended, now)
    for n, j in enumerate(to_recover):
        ledger.found_late(j)
        ledger.handed_over(f"r{n}", j.job_id, None)
    for n, j in enumerate(to_recover):  # some recoveries answer, others not yet
        if jobs and jobs[n % len(jobs)][2]:
            ledger.answered(answer(f"r{n}", j))

    accounts = ledger.accounts(INCIDENT)
    assert [a.job_id for a in accounts] == [j.job_id for j in [*found, *newcomers]]
    for a in accounts:
        handed = a.job_id in {j.job_id for j in to_recover}
        assert handed != (a.job_id in ledger.settled)  # a recovery, or settled: never both, never neither
        if handed:
            assert a.fate in (JobFate.REQUEUED, JobFate.UNKNOWN) and a.recovery_id is not None
    # A job gone from the node is recovered only when a requeue redoes how it ended.
    for j, (fate, requeueable, _) in zip(found, jobs, strict=True):
        if fate != "live":
            assert (j in to_recover) == (requeueable and fate in ("FAILED", "NODE_FAIL"))
    assert {u.job_id for u in not_requeued(accounts)} == {a.job_id for a in accounts if a.fate != JobFate.REQUEUED}


def test_a_job_before_any_requeue_is_untouched_and_a_second_answer_does_not_replace_the_first() -> None:
    ledger = JobLedger()
    a, b = job(1), job(2)
    ledger.found([a, b])
    ledger.handed_over("r1", 1, None)
    first = answer("r1", a)
    ledger.answered(first)
    ledger.answered(first.model_copy(update={"detail": "again"}))
    accounts = ledger.accounts(INCIDENT)
    assert accounts[0].fate == JobFate.REQUEUED and accounts[1].fate == JobFate.UNTOUCHED
    assert ledger.recovered["r1"].detail == "requeued" and ledger.all_answered()
