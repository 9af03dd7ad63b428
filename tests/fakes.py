"""Stand-in activities for the time-skipping workflow tests.

These test the workflow's own logic (stages, approval, timeouts) in isolation, the way the
Temporal samples do; the real activities run against the real Slurm sandbox in tests/integration.
Each stand-in declares the interface reference it implements (activities.interface), so the
names and types come from the one declaration the workflow uses. They record every call so a
test can assert what the workflow asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from activities import interface as act
from activities.interface import implements
from gpuheal.models import (
    CheckpointRequest,
    CheckpointResult,
    DrainRequest,
    DrainResult,
    HealthCheckResult,
    JobList,
    JobProgress,
    JobSnapshot,
    NodeInfo,
    NodeRef,
    Notification,
    RemediationResult,
    RepairRequest,
    RepairResult,
    ReplacementResult,
    RequeueRequest,
    RequeueResult,
    ResumedJob,
    VerifyRequest,
    VerifyResult,
)


class FakeCluster:
    def __init__(self, healthy_after_repair: bool = True, can_repair: bool = True) -> None:
        self.calls: list[str] = []
        self.notes: list[Notification] = []
        self.healthy_after_repair = healthy_after_repair
        self.can_repair = can_repair
        self.job = JobSnapshot(
            job_id=7,
            name="train",
            state="RUNNING",
            nodes="gpu01",
            requeueable=True,
            restart_count=0,
            progress=JobProgress(step=42, checkpoint_step=40, checkpoint_at=0.0, restart=0),
        )

    def activities(self) -> list[Callable[..., Any]]:
        c = self

        @implements(act.LOOK_UP_SLURM_NODE)
        async def look_up(ref: NodeRef) -> NodeInfo:
            c.calls.append("look_up")
            return NodeInfo(name=ref.node, state="allocated")

        @implements(act.NOTIFY_OPERATORS)
        async def notify(note: Notification) -> None:
            c.calls.append(f"notify:{note.event}")
            c.notes.append(note)

        @implements(act.LIST_JOBS_ON_NODE)
        async def list_jobs(ref: NodeRef) -> JobList:
            c.calls.append("list_jobs")
            return JobList(jobs=(c.job,))

        @implements(act.REQUEST_CHECKPOINT)
        async def checkpoint(req: CheckpointRequest) -> CheckpointResult:
            c.calls.append("checkpoint")
            return CheckpointResult(signalled=req.job_ids)

        @implements(act.DRAIN_SLURM_NODE)
        async def drain(req: DrainRequest) -> DrainResult:
            c.calls.append("drain")
            return DrainResult(node=req.node.node, drained_by_us=True, already_drained=False)

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

        @implements(act.REPAIR_NODE)
        async def repair(req: RepairRequest) -> RepairResult:
            c.calls.append(f"repair:{req.action.value}")
            return RepairResult(action=req.action, repaired=c.can_repair, detail="fake repair")

        @implements(act.REPLACE_NODE)
        async def replace(ref: NodeRef) -> ReplacementResult:
            c.calls.append("replace")
            return ReplacementResult(failed_node=ref.node, new_node="gpu09")

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

        @implements(act.WAIT_FOR_TRAINING_PROGRESS)
        async def verify(req: VerifyRequest) -> VerifyResult:
            c.calls.append("verify")
            return VerifyResult(
                resumed=tuple(
                    ResumedJob(
                        job_id=j.job_id,
                        node="gpu02",
                        step=41,
                        checkpoint_step=40,
                        restart_count=1,
                        observed_at=datetime.now(UTC),
                    )
                    for j in req.jobs
                )
            )

        @implements(act.RECORD_INCIDENT_METRICS)
        async def record(result: RemediationResult) -> None:
            c.calls.append("metrics")

        return [
            look_up,
            notify,
            list_jobs,
            checkpoint,
            drain,
            requeue,
            repair,
            replace,
            health,
            resume,
            decommission,
            verify,
            record,
        ]
