"""Stand-in activities for the time-skipping workflow tests.

These test the workflow's own logic (stages, approval, timeouts) in isolation, the way the
Temporal samples do; the real activities run against the real Slurm sandbox in tests/integration.
They record every call so a test can assert what the workflow asked for.
"""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio import activity

from gpuheal.models import (
    CheckpointRequest,
    DrainResult,
    HealthCheckResult,
    JobProgress,
    JobSnapshot,
    NodeInfo,
    NodeRef,
    Notification,
    RemediationResult,
    RepairRequest,
    ReplacementResult,
    RequeueRequest,
    RequeueResult,
    ResumedJob,
    VerifyRequest,
)


class FakeCluster:
    def __init__(self, healthy_after_repair: bool = True) -> None:
        self.calls: list[str] = []
        self.notes: list[Notification] = []
        self.healthy_after_repair = healthy_after_repair
        self.job = JobSnapshot(
            job_id=7,
            name="train",
            state="RUNNING",
            nodes="gpu01",
            requeueable=True,
            restart_count=0,
            progress=JobProgress(step=42, checkpoint_step=40, checkpoint_at=0.0, restart=0),
        )

    def activities(self) -> list[object]:
        c = self

        @activity.defn(name="look_up_slurm_node")
        async def look_up(ref: NodeRef) -> NodeInfo:
            c.calls.append("look_up")
            return NodeInfo(name=ref.node, state="allocated")

        @activity.defn(name="notify_operators")
        async def notify(note: Notification) -> None:
            c.calls.append(f"notify:{note.event}")
            c.notes.append(note)

        @activity.defn(name="list_jobs_on_node")
        async def list_jobs(ref: NodeRef) -> list[JobSnapshot]:
            c.calls.append("list_jobs")
            return [c.job]

        @activity.defn(name="request_checkpoint")
        async def checkpoint(req: CheckpointRequest) -> list[int]:
            c.calls.append("checkpoint")
            return list(req.job_ids)

        @activity.defn(name="drain_slurm_node")
        async def drain(ref: NodeRef, reason: str) -> DrainResult:
            c.calls.append("drain")
            return DrainResult(node=ref.node, drained_by_us=True, already_drained=False)

        @activity.defn(name="requeue_slurm_job")
        async def requeue(req: RequeueRequest) -> RequeueResult:
            c.calls.append(f"requeue:{req.job.job_id}")
            return RequeueResult(
                job_id=req.job.job_id,
                requeued=True,
                step_at_failure=42,
                checkpoint_step=40,
                checkpoint_at=0.0,
            )

        @activity.defn(name="repair_node")
        async def repair(req: RepairRequest) -> str:
            c.calls.append(f"repair:{req.action.value}")
            return "repaired"

        @activity.defn(name="replace_node")
        async def replace(ref: NodeRef) -> ReplacementResult:
            c.calls.append("replace")
            return ReplacementResult(failed_node=ref.node, new_node="gpu09")

        @activity.defn(name="check_node_health")
        async def health(ref: NodeRef) -> HealthCheckResult:
            c.calls.append("health")
            return HealthCheckResult(node=ref.node, healthy=c.healthy_after_repair, detail="fake")

        @activity.defn(name="resume_slurm_node")
        async def resume(ref: NodeRef) -> str:
            c.calls.append("resume")
            return "resumed"

        @activity.defn(name="decommission_node")
        async def decommission(ref: NodeRef) -> str:
            c.calls.append("decommission")
            return "gone"

        @activity.defn(name="wait_for_training_progress")
        async def verify(req: VerifyRequest) -> list[ResumedJob]:
            c.calls.append("verify")
            return [
                ResumedJob(
                    job_id=j.job_id,
                    node="gpu02",
                    step=41,
                    checkpoint_step=40,
                    restart_count=1,
                    observed_at=datetime.now(UTC),
                )
                for j in req.jobs
            ]

        @activity.defn(name="record_incident_metrics")
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
