"""A repaired node takes jobs only after its GPUs pass validation; a failed validation, or a failed
health check with no spare, is a named outcome, never `resolved` (time-skipping server, fakes).
The validation activity itself runs against Slurm as scontrol shows the node (below)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from gpuheal.activities import validation
from gpuheal.activities.validation import ValidationActivities
from gpuheal.clients.slurm.base import NodeState as SlurmNodeState
from gpuheal.clients.slurm.base import SlurmError
from gpuheal.clients.slurm.burn_in import BurnIn
from gpuheal.clients.slurm.cli import SlurmCli
from gpuheal.clients.slurm.parsers import parse_node_line
from gpuheal.core import ids, policy
from gpuheal.core.fleet import repeats
from gpuheal.core.models.base import NodeState
from gpuheal.core.models.slurm import NodeInfo, NodeRef, ValidateRequest, ValidationResult
from gpuheal.workflows.incident.node import MAX_REJECTED
from tests.fakes import FakeCluster
from tests.test_workflow import report, settings, start_or_join, worker

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


@pytest.mark.parametrize("cause", ["never_started", "could_not_run"])
async def test_a_repaired_node_whose_burn_in_gave_no_verdict_is_kept_out_and_never_condemned(
    env: WorkflowEnvironment, cause: str
) -> None:
    """Pending behind a job until its bound, or refused by Slurm every try: it says nothing of the
    GPUs. The node stays drained and counted for a person; no RMA, not `failed_validation`."""
    fake, s = FakeCluster(), settings()
    fake.settings = fake.settings.model_copy(update={"validate_job": BURN_IN})
    if cause == "never_started":
        fake.waiting_gpus = {"gpu01"}
    else:
        fake.validation_fails = True
    async with worker(env, s, fake):
        result = await (await start_or_join(env.client, s, report(48))).result()
    assert result.outcome == "unvalidated" and result.node_state == NodeState.UNVALIDATED, result.node_detail
    assert "validate it by hand" in result.node_detail and "resume" not in fake.calls
    assert "gather_rma" not in fake.calls and result.rma is None
    assert "notify:closed_unvalidated" in fake.calls
    (release,) = fake.releases
    assert release.left_drained  # still drained by its incident: counted until a person resumes it


async def test_a_new_node_whose_burn_in_gave_no_verdict_is_kept_and_no_other_spare_spoiled(
    env: WorkflowEnvironment,
) -> None:
    fake, s = FakeCluster(), settings()
    fake.settings = fake.settings.model_copy(update={"validate_job": BURN_IN, "capacity_retry_s": 1})
    fake.waiting_gpus = {"gpu09"}
    async with worker(env, s, fake):
        result = await (await start_or_join(env.client, s, report(79))).result()
    assert result.outcome == "unvalidated" and "gpu09's burn-in gave no verdict" in result.reason
    assert len(fake.replace_requests) == 1 and "decommission" not in fake.calls
    assert result.node_state == NodeState.AWAITING_REPLACEMENT  # the failed node: kept drained
    assert [a.node for a in fake.admit_asks] == ["gpu01"]  # gpu09 is counted as nothing


async def test_each_rejected_spare_is_an_arrival_of_its_own_at_the_coordinator(env: WorkflowEnvironment) -> None:
    """A run of bad spares trips the breaker fleet-wide: each is admitted under its own key."""
    fake, s = FakeCluster(), settings()
    fake.settings = fake.settings.model_copy(update={"validate_job": BURN_IN, "capacity_retry_s": 1})
    fake.bad_gpus = {"gpu09", "gpu10"}
    async with worker(env, s, fake):
        handle = await start_or_join(env.client, s, report(79))
        result = await handle.result()
        first_run = (await handle.describe()).run_id
    assert result.outcome == "resolved" and result.replacement_node == "gpu11"
    incident, *spares = fake.admit_asks
    assert incident.node == "gpu01" and incident.run_id == first_run
    assert [(a.node, a.run_id, a.incident_id) for a in spares] == [
        (n, f"rejected-{n}-{first_run}", incident.incident_id) for n in ("gpu09", "gpu10")
    ]
    assert all("failed its burn-in" in a.what and not a.application_fault for a in spares)
    assert all(a.no_domains for a in spares) and not incident.no_domains  # (a batch is not a failing rack)


# --- the activity, against Slurm as scontrol shows the node ---------------------------------------

INCIDENT = "gpuheal-prod-gpu01"
OURS = f"{INCIDENT}: XID 48: double-bit ECC error: reset the GPU"  # the incident's drain, as Slurm shows it
# `scontrol -o show node gpu01` on 22.05 (the sandbox's, shortened): Reason last, with who and when.
SHOW_NODE = (
    "NodeName=gpu01 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=4 CPUTot=4 State={state} "
    "ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu,debug  "
    "BootTime=2026-11-30T13:37:30 SlurmdStartTime=2026-11-30T17:43:39{reason}"
)


class SlurmShowing(SlurmCli):
    """The node as `scontrol -o show node` prints it, read by the real parser; drained and
    resumed as `scontrol update` does (a resume clears the reason)."""

    def __init__(self, reason: str = "") -> None:
        super().__init__()
        self.reason = reason
        self.drains: list[str] = []

    async def node(self, name: str) -> NodeInfo:
        shown = f" Reason={self.reason} [gpuheal@2026-11-30T17:44:22]" if self.reason else ""
        info = parse_node_line(SHOW_NODE.format(state="IDLE+DRAIN" if self.reason else "IDLE", reason=shown))
        assert info is not None and info.name == name
        return info

    async def update_node(self, name: str, state: SlurmNodeState, reason: str | None = None) -> None:
        if state == "drain":
            assert reason
            self.drains.append(reason)
        self.reason = (reason or "") if state == "drain" else ""


class BurnInJob(BurnIn):
    """Burn-in job 90: it ends `ends`, or (None) runs (`waits`: stays pending) until cancelled
    and is gone `linger` polls later. The reservation's delete fails `delete_fails` times
    (slurmctld unreachable)."""

    def __init__(
        self,
        ends: tuple[str, str] | None = ("FAILED", "1:0"),
        linger: int = 0,
        delete_fails: int = 0,
        waits: bool = False,
    ):
        super().__init__(SlurmCli(), user="gpuheal")
        self.ends, self.linger, self.delete_fails, self.waits = ends, linger, delete_fails, waits
        self.reserved: set[str] = set()
        self.submits = 0
        self.cancelled = asyncio.Event()

    async def reserve(self, name: str, node: str, timeout_s: float) -> None:
        self.reserved.add(name)

    async def unreserve(self, name: str) -> None:
        if self.delete_fails:
            self.delete_fails -= 1
            raise SlurmError("scontrol delete reservationname=... failed (exit 1): Unable to contact slurm controller")
        self.reserved.discard(name)

    async def submit(self, script: str, reservation: str, node: str, job_name: str) -> int:
        self.submits += 1
        return 90

    async def state(self, job_id: int) -> tuple[str, str]:
        if self.ends is not None:
            return self.ends
        now = ("PENDING", "0:0") if self.waits else ("RUNNING", "0:0")
        if not self.cancelled.is_set():
            return now
        self.linger -= 1
        return ("CANCELLED", "0:15") if self.linger < 0 else now

    async def cancel(self, job_id: int) -> None:
        self.cancelled.set()


def validating(
    slurm: SlurmShowing, burn_in: BurnInJob, timeout_s: float = 60, env: ActivityEnvironment | None = None
) -> asyncio.Future[ValidationResult]:
    """One attempt of the activity (a retry is another call: the same run, so the same reservation)."""
    ref = NodeRef(cluster="prod", node="gpu01", incident_id=INCIDENT)
    req = ValidateRequest(node=ref, job=BURN_IN, timeout_s=timeout_s)
    attempt = (env or ActivityEnvironment()).run(ValidationActivities(slurm, burn_in).validate_node_gpus, req)
    return asyncio.ensure_future(attempt)


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(validation, "POLL_S", 0.001)


async def test_a_failed_burn_in_drains_the_node_in_its_incidents_name() -> None:
    """The coordinator keeps a closed run's node counted while Slurm shows it drained by its
    incident (find_nodes_left_drained, is_our_drain): the failed burn-in's drain must be that."""
    slurm, burn_in = SlurmShowing(OURS), BurnInJob()
    verdict = await validating(slurm, burn_in)
    assert not verdict.passed and not verdict.by_others
    shown = (await slurm.node("gpu01")).reason  # as scontrol shows it
    assert policy.is_our_drain(shown, INCIDENT) and not policy.is_our_drain(shown, "gpuheal-prod-gpu0")
    assert "GPU validation failed" in shown and "for the vendor" in shown
    assert shown.endswith("burn-in job 90 ended FAILED (exit 1:0)")
    assert slurm.drains == [shown] and not burn_in.reserved


async def test_a_retry_after_the_reservations_delete_failed_answers_the_failure_again() -> None:
    """The drain was written, then the delete failed: the retry finds the node drained by this
    incident's failed burn-in. Failed again (the incident then files the RMA), not "drained by
    someone else" (which would close it resolved, the node released uncounted)."""
    slurm, burn_in = SlurmShowing(OURS), BurnInJob(delete_fails=1)
    with pytest.raises(SlurmError):
        await validating(slurm, burn_in)
    verdict = await validating(slurm, burn_in)
    assert not verdict.passed and not verdict.by_others
    assert verdict.detail == "burn-in job 90 ended FAILED (exit 1:0)"
    assert len(slurm.drains) == 1 and burn_in.submits == 1 and not burn_in.reserved


async def test_a_retry_beside_an_attempt_still_cancelling_its_burn_in_drains_once() -> None:
    """A hung burn-in: the attempt cancels it and waits for it to go, heartbeating meanwhile (a
    silent wait times the attempt out). Should a retry start beside it anyway, both answer the
    failure and the node is drained once."""
    slurm, burn_in = SlurmShowing(OURS), BurnInJob(ends=None, linger=30)
    beats: list[str] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(str(details[0]))
    first = validating(slurm, burn_in, timeout_s=0, env=env)
    await burn_in.cancelled.wait()
    second = await validating(slurm, burn_in, timeout_s=0)
    assert any(b.startswith("cancelling burn-in job 90") for b in beats)
    for verdict in (await first, second):
        assert not verdict.passed and not verdict.by_others
    (drain,) = slurm.drains
    assert validation.failed_detail(drain, INCIDENT) and not burn_in.reserved


@pytest.mark.parametrize(
    ("burn_in", "verdict_is"),
    [
        (BurnInJob(ends=None, waits=True), "none"),  # behind another job until its bound
        (BurnInJob(ends=("CANCELLED", "0:15")), "none"),  # someone cancelled it
        (BurnInJob(ends=("PREEMPTED", "0:0")), "none"),
        (BurnInJob(ends=None), "failed"),  # it ran and hung past its bound: the GPUs' doing
        (BurnInJob(ends=("NODE_FAIL", "0:0")), "failed"),
        (BurnInJob(ends=("COMPLETED", "0:0")), "passed"),
    ],
    ids=["pending", "cancelled", "preempted", "hung", "node_fail", "completed"],
)
async def test_only_a_burn_in_that_ran_condemns_the_node(burn_in: BurnInJob, verdict_is: str) -> None:
    """No verdict keeps the node drained in the incident's name (counted) for a person to
    validate, never "for the vendor"; a job that ran and failed is the vendor's."""
    slurm = SlurmShowing(OURS)
    verdict = await validating(slurm, burn_in, timeout_s=0)
    assert (verdict.passed, verdict.no_verdict, verdict.ran_and_failed) == {
        "passed": (True, False, False),
        "none": (False, True, False),
        "failed": (False, False, True),
    }[verdict_is]
    shown = (await slurm.node("gpu01")).reason
    if verdict_is == "passed":
        assert not shown and not slurm.drains
    else:
        assert policy.is_our_drain(shown, INCIDENT) and slurm.drains == [shown]
        assert (validation.failed_detail(shown, INCIDENT) is not None) == (verdict_is == "failed")
        assert (policy.UNVALIDATED in shown) == (verdict_is == "none")
    assert not burn_in.reserved


@pytest.mark.parametrize(
    "theirs",
    [
        "Kill task failed",  # slurmctld's own
        "hw check by ops: see gpuheal-prod-gpu01",  # a person's, naming the incident
        "gpuheal-prod-gpu02: GPU validation failed, for the vendor: burn-in job 7 ended FAILED (exit 1:0)",
    ],
)
async def test_a_drain_by_someone_else_is_left_to_them(theirs: str) -> None:
    slurm, burn_in = SlurmShowing(theirs), BurnInJob()
    verdict = await validating(slurm, burn_in)
    assert not verdict.passed and verdict.by_others and verdict.detail == f"drained by someone else: {theirs!r}"
    assert slurm.drains == [] and slurm.reason == theirs and burn_in.submits == 0 and not burn_in.reserved


async def test_the_nodes_next_incident_never_resumes_a_node_that_failed_its_burn_in() -> None:
    """The failure drain is in the incident's name (it is counted), and the node's next run of
    that incident takes it for its own; without a burn-in of its own, it still never resumes
    it: the answer says why, and the workflow reads it as still out, for the vendor."""
    from gpuheal.activities.remediation import RemediationActivities
    from gpuheal.core import policy

    slurm = SlurmShowing(reason=validation.failed_reason(INCIDENT, "burn-in job 90 ended FAILED (exit 1:0)"))
    acts = RemediationActivities(slurm, provider=None, notifier=None, on_closed=None)  # type: ignore[arg-type]
    ref = NodeRef(cluster="prod", node="gpu01", incident_id=INCIDENT)
    answer = await ActivityEnvironment().run(acts.resume_slurm_node, ref)
    assert policy.KEPT_FOR_THE_VENDOR in answer and slurm.reason, "a known-bad node was resumed"
    slurm.reason = policy.drain_reason(INCIDENT, "XID 79")  # its own, ordinary drain: resumed
    assert await ActivityEnvironment().run(acts.resume_slurm_node, ref) == "gpu01 resumed" and not slurm.reason


def test_two_runs_rejecting_one_spare_are_two_arrivals_in_the_compact_books() -> None:
    """The repeat window keeps a run key's tail only: the rejected spare's key ends in its run."""
    first, second = (ids.rejected_spare_run(str(uuid.uuid4()), "gpu-a017") for _ in range(2))
    assert repeats.run_key(first) != repeats.run_key(second)


async def test_a_burn_in_that_starts_late_gets_its_whole_bound_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pending 8 s behind a job, then a 8 s diagnostic, with a 10 s bound: it ran 8 s, not past
    its bound, so it passes (counted from its submission it would read as hung and condemn a
    healthy node). Its reservation is extended as it starts. Slurm's clock: 1 s per look."""
    now = [0.0]
    monkeypatch.setattr(validation, "_now", lambda: now[0])

    class LateStart(BurnInJob):
        async def state(self, job_id: int) -> tuple[str, str]:
            now[0] += 1
            return ("PENDING", "0:0") if now[0] <= 8 else ("RUNNING", "0:0") if now[0] <= 16 else ("COMPLETED", "0:0")

        async def reserve(self, name: str, node: str, timeout_s: float) -> None:
            self.extended = now[0]  # (set before first use: an attribute of the fake)
            await super().reserve(name, node, timeout_s)

    slurm, burn_in = SlurmShowing(OURS), LateStart()
    verdict = await validating(slurm, burn_in, timeout_s=10)
    assert verdict.passed, verdict.detail
    assert 8 < burn_in.extended <= 10  # extended when it was seen running
