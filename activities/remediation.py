"""The remediation activities: one per external action, each safe to retry.

Each activity reads the current state before it acts (is the node drained already? was this job
requeued already?), so a retry after a worker crash does nothing twice. Bad input fails fast with
a non-retryable ApplicationError whose message names what was wrong.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import interface as act
from activities.interface import implements
from clients.notify import Notifier
from clients.slurm import JobUpdate, NodeOutOfService, RequeueUnavailable, SlurmBackend, UnknownNode
from clients.slurm.hostlist import expand
from gpuheal import policy
from gpuheal.errors import NOT_RESUMED, UNKNOWN_NODE
from gpuheal.models import (
    REQUEUE_STATES,
    CheckpointRequest,
    CheckpointResult,
    DrainRequest,
    DrainResult,
    HealthCheckResult,
    JobList,
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
from providers.base import NodeProvider

IncidentObserver = Callable[[RemediationResult], None]


class RemediationActivities:
    """Slurm, provider and notification activities. The clients are built by the worker and
    injected; `on_closed` is how a closed incident reaches the worker's metrics."""

    def __init__(
        self, slurm: SlurmBackend, provider: NodeProvider, notifier: Notifier, on_closed: IncidentObserver
    ) -> None:
        self._slurm = slurm
        self._provider = provider
        self._notifier = notifier
        self._on_closed = on_closed

    @implements(act.LOOK_UP_SLURM_NODE)
    async def look_up_slurm_node(self, ref: NodeRef) -> NodeInfo:
        """Fail fast on a node Slurm does not know, before anything is touched."""
        try:
            return await self._slurm.node(ref.node)
        except (UnknownNode, NodeOutOfService) as err:
            raise ApplicationError(f"cluster {ref.cluster!r}: {err}", type=UNKNOWN_NODE, non_retryable=True) from err

    @implements(act.NOTIFY_OPERATORS)
    async def notify_operators(self, note: Notification) -> None:
        await self._notifier.send(note)

    @implements(act.LIST_JOBS_ON_NODE)
    async def list_jobs_on_node(self, ref: NodeRef) -> JobList:
        return JobList(jobs=tuple(await self._slurm.jobs_on_node(ref.node)))

    @implements(act.REQUEST_CHECKPOINT)
    async def request_checkpoint(self, req: CheckpointRequest) -> CheckpointResult:
        """Ask batch jobs still running on the node to checkpoint now (SIGUSR1 to the batch
        script). A second signal after a retry only asks for a checkpoint the job already has."""
        signalled = []
        for job in await self._slurm.jobs_on_node(req.node):  # one squeue for all of them
            if job.job_id in req.job_ids and job.state == "RUNNING":
                await self._slurm.signal_batch(job.job_id, "USR1")
                signalled.append(job.job_id)
        return CheckpointResult(signalled=tuple(signalled))

    @implements(act.DRAIN_SLURM_NODE)
    async def drain_slurm_node(self, req: DrainRequest) -> DrainResult:
        ref = req.node
        node = await self._slurm.node(ref.node)
        if node.drained:
            ours = policy.is_our_drain(node.reason, ref.incident_id)
            return DrainResult(node=ref.node, drained_by_us=ours, already_drained=True, previous_reason=node.reason)
        await self._slurm.update_node(ref.node, "drain", req.reason)
        return DrainResult(node=ref.node, drained_by_us=True, already_drained=False)

    @implements(act.REQUEUE_SLURM_JOB)
    async def requeue_slurm_job(self, req: RequeueRequest) -> RequeueResult:
        before = req.job
        base = dict(
            job_id=before.job_id,
            restart_count_before=before.restart_count,
            node_count=before.node_count,
        )
        current = await self._slurm.job(before.job_id)
        if current is None:
            return RequeueResult(**base, requeued=False, reason="job no longer known to Slurm")
        if current.restart_count <= before.restart_count:
            why = policy.unrequeueable_reason(current.requeueable, current.state)
            pinned = req.failed_node in expand(current.required_nodes)
            if why is None and pinned and req.exclude_failed_node:
                why = f"pinned to {req.failed_node} with --nodelist: it cannot restart elsewhere"
            if why:
                return RequeueResult(**base, requeued=False, reason=why)
            try:
                await self._slurm.requeue(current.job_id, req.failed_node)
            except RequeueUnavailable as err:
                return RequeueResult(**base, requeued=False, reason=str(err))
            already = False
        else:
            already = True  # a previous attempt requeued it; only finish the job's set-up below
        # Progress at the failure: the comment unless the restarted run has overwritten it already.
        progress = current.progress
        if progress is None or progress.restart != before.restart_count:
            progress = before.progress
        # Run at once (a requeue imposes a ~2 min begin-time delay), and not on the failed node.
        excluded = None
        if req.exclude_failed_node:
            excluded = tuple(sorted(set(expand(current.excluded_nodes)) | {req.failed_node}))
        await self._when_pending(current.job_id, JobUpdate(start_now=True, excluded_nodes=excluded))
        return RequeueResult(
            **base,
            requeued=True,
            already_requeued=already,
            step_at_failure=progress.step if progress else None,
            checkpoint_step=progress.checkpoint_step if progress else None,
            checkpoint_at=progress.checkpoint_at if progress else None,
        )

    async def _when_pending(self, job_id: int, update: JobUpdate) -> None:
        """A requeued job passes through REQUEUED/COMPLETING before it is PENDING, and only a
        pending job takes these updates; wait for it (a retry of the activity lands here too)."""
        for _ in range(120):
            job = await self._slurm.job(job_id)
            if job is None or job.state not in REQUEUE_STATES:
                return  # running again already (or gone): nothing left to adjust
            if job.state == "PENDING" and "COMPLETING" not in job.state_flags:
                await self._slurm.update_job(job_id, update)
                return
            activity.heartbeat(f"job {job_id} is {job.state}")
            await asyncio.sleep(0.25)
        raise RuntimeError(f"job {job_id} did not become PENDING after its requeue")

    @implements(act.REPAIR_NODE)
    async def repair_node(self, req: RepairRequest) -> RepairResult:
        return await self._provider.repair(req.node.node, req.action)

    @implements(act.REPLACE_NODE)
    async def replace_node(self, ref: NodeRef) -> ReplacementResult:
        return await self._provider.replace(ref.node, ref.incident_id)

    @implements(act.CHECK_NODE_HEALTH)
    async def check_node_health(self, ref: NodeRef) -> HealthCheckResult:
        return await self._provider.check_health(ref.node)

    @implements(act.RESUME_SLURM_NODE)
    async def resume_slurm_node(self, ref: NodeRef) -> str:
        node = await self._slurm.node(ref.node)
        if not node.drained:
            return f"{ref.node} already in service ({node.state})"
        if not policy.is_our_drain(node.reason, ref.incident_id):
            # Someone else drained it (or re-drained it since): never undo their drain.
            return f"{ref.node} left drained: its drain is not ours ({node.reason!r})"
        await self._slurm.update_node(ref.node, "resume")
        return f"{ref.node} resumed"

    @implements(act.DECOMMISSION_NODE)
    async def decommission_node(self, ref: NodeRef) -> str:
        return await self._provider.decommission(ref.node, policy.drain_reason(ref.incident_id, "replaced"))

    @implements(act.WAIT_FOR_TRAINING_PROGRESS)
    async def wait_for_training_progress(self, req: VerifyRequest) -> VerifyResult:
        """Poll until every requeued job runs on a healthy node and has trained past the
        checkpoint it had before the failure. Heartbeats carry what is still awaited."""
        pending = {j.job_id: j for j in req.jobs if j.requeued}
        resumed: dict[int, ResumedJob] = {}
        while True:
            for job in await self._slurm.jobs(set(pending) - set(resumed)):  # one query for them all
                want = pending.get(job.job_id)
                if want is None or job.job_id in resumed:
                    continue
                done = await self._resumed(job, want, req.avoid_node)
                if done is not None:
                    resumed[job.job_id] = done
            waiting = sorted(set(pending) - set(resumed))
            if not waiting:
                return VerifyResult(resumed=tuple(resumed[j] for j in sorted(resumed)))
            activity.heartbeat({"waiting_for_jobs": waiting})
            await asyncio.sleep(req.poll_interval_s)

    async def _resumed(self, job: JobSnapshot, want: RequeueResult, avoid_node: str | None) -> ResumedJob | None:
        p = job.progress
        if job.state != "RUNNING" or p is None or job.restart_count <= want.restart_count_before:
            return None
        if p.restart != job.restart_count:
            return None  # the comment is still the failed run's
        nodes = expand(job.nodes)
        if avoid_node is not None and avoid_node in nodes:
            raise ApplicationError(
                f"job {job.job_id} restarted on the failed node {avoid_node}",
                type=NOT_RESUMED,
                non_retryable=True,
            )
        if p.step <= (want.checkpoint_step or 0):
            return None
        return ResumedJob(
            job_id=job.job_id,
            node=",".join(nodes),
            step=p.step,
            checkpoint_step=want.checkpoint_step or 0,
            restart_count=job.restart_count,
            observed_at=datetime.now(UTC),
        )

    @implements(act.RECORD_INCIDENT_METRICS)
    async def record_incident_metrics(self, result: RemediationResult) -> None:
        self._on_closed(result)
