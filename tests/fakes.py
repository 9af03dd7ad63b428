"""Stand-in activities for the time-skipping workflow tests.

These test the workflows' own logic (stages, approval, timeouts, job recoveries) in isolation,
the way the Temporal samples do; the real activities run against the real Slurm sandbox in
tests/integration. Each stand-in declares the interface reference it implements
(activities.interface), so names and types come from the one declaration the workflows use.
Handing a job to its recovery is the real activity (it only talks to Temporal). They record
every call so a test can assert what the workflows asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from gpuheal.activities import interface as act
from gpuheal.activities.interface import implements
from gpuheal.activities.jobs import JobActivities
from gpuheal.clients.owners import OwnerDelivery
from gpuheal.core import policy as gpuheal_policy
from gpuheal.core.app_faults import AppFault, AppFaults, AppFaultsRequest
from gpuheal.core.errors import NODE_NOT_IN_SERVICE, UNKNOWN_NODE
from gpuheal.core.fleet.models import (
    Admission,
    AdmitAnswer,
    AdmitAsk,
    CapacityDecision,
    CapacityRequest,
    Placement,
    ReleaseRequest,
)
from gpuheal.core.fleet.policy import FleetPolicy, VersionedPolicy
from gpuheal.core.jobs import HoldRequest, JobHistory, JobHistoryRequest, OwnerNotice, VerifyJobRequest, VerifyOutcome
from gpuheal.core.models.incident import JobRecoverySettings, RemediationSettings
from gpuheal.core.models.kubernetes import BorrowedNode, NodeEmptyWait
from gpuheal.core.models.replacement import (
    EarlierReplacement,
    HealthCheckResult,
    RepairRequest,
    RepairResult,
    ReplacementLookup,
    ReplacementResult,
    ReplaceRequest,
)
from gpuheal.core.models.result import Notification, RemediationResult, ResumedJob
from gpuheal.core.models.slurm import (
    CheckpointOutcome,
    CheckpointRequest,
    CheckpointResult,
    CheckpointSent,
    CheckpointWait,
    DrainRequest,
    DrainResult,
    JobList,
    JobProgress,
    JobSnapshot,
    NodeInfo,
    NodeRef,
    RequeueRequest,
    RequeueResult,
    ValidateRequest,
    ValidationResult,
)
from gpuheal.core.rma import RmaEvidence, RmaRequest
from gpuheal.core.settings import OwnerSettings


async def _heartbeating(gate: asyncio.Event) -> None:
    """Wait for the test to open `gate`, as a waiting activity does: heartbeating."""
    while not gate.is_set():
        activity.heartbeat()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(gate.wait(), 1.0)


class FakeCluster:
    """`settings` are the worker's, `policy` the cluster's, as the coordinator's admission would
    hand them to the incident; `grant` is what every capacity request is answered."""

    def __init__(
        self,
        healthy_after_repair: bool = True,
        can_repair: bool = True,
        spares: int = 1,
        settings: RemediationSettings | None = None,
        policy: FleetPolicy | None = None,
        grant: bool = True,
        gone: frozenset[str] = frozenset(),
        replaced: EarlierReplacement | None = None,
    ) -> None:
        self.calls: list[str] = []
        self.admitted: list[bool] = []  # each admission: told an application fault?
        self.releases: list[ReleaseRequest] = []  # what each release told the coordinator
        self.settings = settings or RemediationSettings(checkpoint_grace_s=30)
        self.policy = policy or FleetPolicy()
        self.grant = grant
        self.contain: str | None = None  # why the coordinator refuses a held incident's containment
        self.contains_with_request = False  # a coordinator from CONTAIN_WITH_REQUEST: held, it answers both
        # A coordinator with admit_and_request_many: asked, it decides the request with the admission.
        self.decides_with_admission = False
        self.admit_fails = False  # the admission is not answered (its attempts spent)
        self.requests: list[CapacityRequest] = []
        self.gone = gone  # nodes Slurm has not (in service)
        self.joining: frozenset[str] = frozenset()  # nodes Slurm has, not yet in service (FUTURE)
        self.drain_reasons: dict[str, str] = {}  # nodes Slurm shows drained (from the start), with the reason
        self.drain_reasons_sent: list[str] = []  # each drain asked for, with its reason
        self.replaced = replaced  # what the incident history says: gpuheal replaced this node
        self.notes: list[Notification] = []
        self.notices_down = False
        self.draining = asyncio.Event()
        self.drain_gate: asyncio.Event | None = None
        self.drain_fails = False  # Slurm refuses the drain (non-retryable)
        self.checkpoint_gate: asyncio.Event | None = None
        self.verify_gate: asyncio.Event | None = None  # holds job recoveries in their verify
        self.app_faults: list[AppFault] = []  # the GPU's earlier application faults, as Temporal has them
        self.app_fault_asks: list[AppFaultsRequest] = []
        self.verify_requests: list[tuple[float, VerifyJobRequest]] = []  # (when asked, what)
        self.close_gate: asyncio.Event | None = None  # holds an incident in its close (its notice)
        self.history_down = False  # visibility cannot give a board's history (the RMA evidence)
        self.owner_notices: list[OwnerNotice] = []
        self.healthy_after_repair = healthy_after_repair
        self.can_repair = can_repair
        self.spares = spares
        self.validation = ValidationResult(passed=True, detail="burn-in job 90 ended COMPLETED (exit 0:0)", job_id=90)
        self.bad_gpus: set[str] = set()  # nodes whose burn-in fails whatever `validation` says
        self.waiting_gpus: set[str] = set()  # nodes whose burn-in never starts (no verdict)
        self.validation_fails = False  # the validation activity fails (Slurm refuses the burn-in)
        self.admit_asks: list[AdmitAsk] = []
        self.replace_requests: list[ReplaceRequest] = []
        self.job = JobSnapshot(
            job_id=7,
            name="train",
            state="RUNNING",
            nodes="gpu01",
            requeueable=True,
            restart_count=0,
            user="alice",
            progress=JobProgress(step=42, checkpoint_step=40, checkpoint_at=0.0, restart=0, signal="USR1"),
        )

    def activities(self) -> list[Callable[..., Any]]:
        return self.node_activities() + self.job_activities() + self.fleet_activities()

    def fleet_activities(self) -> list[Callable[..., Any]]:
        c = self

        @implements(act.ADMIT_INCIDENT)
        async def admit(ask: AdmitAsk) -> AdmitAnswer:
            c.calls.append("admit")
            c.admitted.append(ask.application_fault)
            c.admit_asks.append(ask)
            if c.admit_fails:
                raise ApplicationError("the coordinator did not answer", non_retryable=True)
            policy = VersionedPolicy(version=1, policy=c.policy, changed_by="test", reason="test", at=datetime.now(UTC))
            decision = None
            # (as the real activity: not from a worker with the Kubernetes half; no repeat offenders here)
            asks = ask.ask_capacity and c.settings.kubernetes is None
            if c.decides_with_admission and asks and c.policy.mode != "observe":
                if gpuheal_policy.takes_capacity(ask.action):
                    drains = ask.contain_if_held and c.policy.containment_while_held == "drain"
                    decision = decide(ask.model_copy(update={"contain_if_held": drains}))
            return AdmitAnswer(
                admission=Admission(policy=policy),
                settings=c.settings,
                placement=Placement(node=ask.node, cluster_size=10),
                decision=decision,
            )

        def decide(req: CapacityRequest | AdmitAsk) -> CapacityDecision:
            answer = CapacityDecision(granted=c.grant, reason="test grant" if c.grant else "test: held", position=1)
            if (c.contains_with_request or c.decides_with_admission) and req.contain_if_held and not c.grant:
                why = c.contain or "contained while held (nothing new lands on it)"
                answer = answer.model_copy(update={"contained": c.contain is None, "containment": why})
            return answer

        @implements(act.REQUEST_CAPACITY)
        async def request(req: CapacityRequest) -> CapacityDecision:
            c.calls.append("request_capacity")
            c.requests.append(req)
            answer = CapacityDecision(granted=c.grant, reason="test grant" if c.grant else "test: held", position=1)
            if c.contains_with_request and req.contain_if_held and not c.grant:
                why = c.contain or "contained while held (nothing new lands on it)"
                answer = answer.model_copy(update={"contained": c.contain is None, "containment": why})
            return answer

        @implements(act.CONFIRM_CAPACITY)
        async def confirm(req: CapacityRequest) -> CapacityDecision:
            c.calls.append("confirm_capacity")
            return CapacityDecision(granted=True, reason="still granted", already=True)

        @implements(act.RELEASE_CAPACITY)
        async def release(req: ReleaseRequest) -> str:
            c.calls.append("release_capacity")
            c.releases.append(req)
            return "released"

        @implements(act.CONTAIN_WHILE_HELD)
        async def contain(req: CapacityRequest) -> CapacityDecision:
            c.calls.append("contain_while_held")
            if c.contain is None:
                return CapacityDecision(granted=True, reason="contained while held (nothing new lands on it)")
            return CapacityDecision(granted=False, reason=c.contain)

        return [admit, request, confirm, release, contain]

    def node_activities(self) -> list[Callable[..., Any]]:
        c = self

        @implements(act.LOOK_UP_SLURM_NODE)
        async def look_up(ref: NodeRef) -> NodeInfo:
            c.calls.append("look_up")
            if ref.node in c.gone:
                raise ApplicationError(f"node {ref.node!r} is not in service", type=UNKNOWN_NODE, non_retryable=True)
            if ref.node in c.joining:  # in slurm.conf, State=FUTURE: a spare, or a replacement joining
                why = f"node {ref.node!r} is not in service (State=FUTURE)"
                raise ApplicationError(why, type=NODE_NOT_IN_SERVICE, non_retryable=True)
            if (reason := c.drain_reasons.get(ref.node)) is not None:
                return NodeInfo(name=ref.node, state="drained", flags=("DRAIN",), reason=reason)
            return NodeInfo(name=ref.node, state="allocated")

        @implements(act.FIND_EARLIER_REPLACEMENT)
        async def find_earlier(ref: NodeRef) -> ReplacementLookup:
            c.calls.append("find_earlier_replacement")
            return ReplacementLookup(earlier=c.replaced if c.replaced and c.replaced.node == ref.node else None)

        @implements(act.NOTIFY_OPERATORS)
        async def notify(note: Notification) -> None:
            c.calls.append(f"notify:{note.event}")
            if c.close_gate is not None and note.event.startswith("closed_"):
                await c.close_gate.wait()
            if c.notices_down:  # the operators' receiver refuses every delivery
                raise ApplicationError("connection refused")
            c.notes.append(note)

        @implements(act.LIST_JOBS_ON_NODE)
        async def list_jobs(ref: NodeRef) -> JobList:
            c.calls.append("list_jobs")
            return JobList(jobs=(c.job,))

        @implements(act.DRAIN_SLURM_NODE)
        async def drain(req: DrainRequest) -> DrainResult:
            c.calls.append("drain")
            c.drain_reasons_sent.append(req.reason)
            c.draining.set()
            if c.drain_gate is not None:  # a test holds the drain open (something happens meanwhile)
                await c.drain_gate.wait()
            if c.drain_fails:
                raise ApplicationError(f"slurmctld refused to drain {req.node.node}", non_retryable=True)
            return DrainResult(node=req.node.node, drained_by_us=True, already_drained=False)

        @implements(act.REPAIR_NODE)
        async def repair(req: RepairRequest) -> RepairResult:
            c.calls.append(f"repair:{req.action.value}")
            return RepairResult(action=req.action, repaired=c.can_repair, detail="fake repair")

        @implements(act.REPLACE_NODE)
        async def replace(ref: ReplaceRequest) -> ReplacementResult:
            c.calls.append("replace")
            c.replace_requests.append(ref)
            if c.spares <= 0:
                return ReplacementResult(failed_node=ref.node, new_node=None, no_capacity="no spare node left")
            return ReplacementResult(failed_node=ref.node, new_node=f"gpu{9 + len(ref.rejected):02d}")

        @implements(act.VALIDATE_NODE_GPUS)
        async def validate(req: ValidateRequest) -> ValidationResult:
            c.calls.append(f"validate:{req.node.node}")
            if req.node.node in c.bad_gpus:
                return ValidationResult(passed=False, detail="burn-in job 91 ended FAILED (exit 1:0)", job_id=91)
            if req.node.node in c.waiting_gpus:
                detail = "burn-in job 92 never started within 1800 s"
                return ValidationResult(passed=False, detail=detail, job_id=92, no_verdict=True)
            if c.validation_fails:
                refused = "sbatch: error: Batch job submission failed: Invalid account"
                raise ApplicationError(refused, non_retryable=True)
            return c.validation

        @implements(act.GATHER_RMA_EVIDENCE)
        async def gather_rma(req: RmaRequest) -> RmaEvidence:
            c.calls.append("gather_rma")
            if c.history_down:
                raise RuntimeError("visibility store unavailable")
            return RmaEvidence(**dict(req), history=())

        @implements(act.FIND_APPLICATION_FAULTS)
        async def app_faults(req: AppFaultsRequest) -> AppFaults:
            c.calls.append("find_application_faults")
            c.app_fault_asks.append(req)
            return AppFaults(faults=tuple(c.app_faults))

        @implements(act.FILE_RMA)
        async def file_rma(evidence: RmaEvidence) -> str:
            c.calls.append("file_rma")
            return "RMA-1"

        @implements(act.CHECK_NODE_HEALTH)
        async def health(ref: NodeRef) -> HealthCheckResult:
            c.calls.append("health")
            return HealthCheckResult(node=ref.node, healthy=c.healthy_after_repair, detail="fake")

        @implements(act.RESUME_SLURM_NODE)
        async def resume(ref: NodeRef) -> str:
            c.calls.append("resume")
            return "resumed"

        @implements(act.DECOMMISSION_NODE)
        async def decommission(ref: NodeRef) -> str:
            c.calls.append("decommission")
            return "gone"

        @implements(act.RECORD_INCIDENT_METRICS)
        async def record(result: RemediationResult) -> None:
            c.calls.append("metrics")

        @implements(act.ADOPT_BORROWED_NODE)
        async def adopt(node: BorrowedNode) -> str:
            c.calls.append(f"adopt:{node.node}")
            return "joined"

        @implements(act.RELEASE_BORROWED_NODE)
        async def release(node: BorrowedNode) -> str:
            c.calls.append(f"release:{node.node}")
            return "released"

        return [
            look_up,
            find_earlier,
            notify,
            list_jobs,
            drain,
            repair,
            replace,
            health,
            validate,
            gather_rma,
            file_rma,
            app_faults,
            resume,
            decommission,
            record,
            adopt,
            release,
        ]

    def job_activities(self) -> list[Callable[..., Any]]:
        c = self

        @implements(act.REQUEST_CHECKPOINT)
        async def checkpoint(req: CheckpointRequest) -> CheckpointSent:
            c.calls.append("checkpoint")
            return CheckpointSent(asks=tuple(a.model_copy(update={"signalled_at": 1.0}) for a in req.asks))

        @implements(act.WAIT_FOR_CHECKPOINTS)
        async def confirm(req: CheckpointWait) -> CheckpointResult:
            c.calls.append("confirm")
            if c.checkpoint_gate is not None:  # the test holds the incident in its protect stage
                await c.checkpoint_gate.wait()
            return CheckpointResult(
                outcomes=tuple(
                    CheckpointOutcome(
                        job_id=a.job_id, signal=a.signal, confirmed=True, step=42, after_s=0.4, detail="ok"
                    )
                    for a in req.asks
                )
            )

        @implements(act.FIND_JOBS)
        async def find(jobs: JobList) -> JobList:
            c.calls.append("find_jobs")
            return jobs

        @implements(act.WAIT_FOR_NODE_EMPTY)
        async def empty(req: NodeEmptyWait) -> JobList:
            c.calls.append(f"empty:{req.node}")
            return JobList()

        @implements(act.REQUEUE_SLURM_JOB)
        async def requeue(req: RequeueRequest) -> RequeueResult:
            c.calls.append(f"requeue:{req.job.job_id}")
            return RequeueResult(
                job_id=req.job.job_id,
                requeued=True,
                step_at_failure=42,
                checkpoint_step=40,
                checkpoint_at=0.0,
            )

        @implements(act.HOLD_SLURM_JOB)
        async def hold(req: HoldRequest) -> str:
            c.calls.append(f"hold:{req.job_id}")
            return "held"

        @implements(act.WAIT_FOR_JOB_RESUME)
        async def verify(req: VerifyJobRequest) -> VerifyOutcome:
            c.calls.append("verify")
            c.verify_requests.append((time.time(), req))
            if c.verify_gate is not None:
                await _heartbeating(c.verify_gate)
            back = ResumedJob(
                job_id=req.requeue.job_id,
                node="gpu02",
                step=41,
                checkpoint_step=40,
                restart_count=1,
                observed_at=datetime.now(UTC),
            )
            return VerifyOutcome(job_id=req.requeue.job_id, outcome="resumed", state="RUNNING", resumed=back)

        @implements(act.NOTIFY_JOB_OWNER)
        async def tell_owner(notice: OwnerNotice) -> str:
            c.calls.append(f"owner:{notice.event}")
            c.owner_notices.append(notice)
            return "fake"

        @implements(act.JOB_RECOVERY_HISTORY)
        async def history(req: JobHistoryRequest) -> JobHistory:
            c.calls.append("history")
            return JobHistory()

        real = JobActivities(slurm=None, owners=OwnerDelivery(OwnerSettings()), recovery=JobRecoverySettings())  # type: ignore[arg-type]
        return [checkpoint, confirm, find, empty, requeue, hold, verify, tell_owner, history, real.start_job_recovery]
