"""Job activities: ask a job to checkpoint and wait for it, requeue it once, verify it resumed,
hold it, tell its owner, and hand it to its recovery.

Every one reads before it acts (a retry after a crash does nothing twice), and none waits
without bound: checkpoint and resume waits end at an absolute deadline the workflow set, so a
retried activity keeps the same bound.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from gpuheal.activities import interface as act
from gpuheal.activities.interface import implements
from gpuheal.clients.owners import OwnerNotifier
from gpuheal.clients.slurm import JobUpdate, RequeueUnavailable, SlurmBackend
from gpuheal.clients.slurm.hostlist import expand
from gpuheal.core import ids, job_policy, policy, polling, queries
from gpuheal.core import search_attributes as sa
from gpuheal.core.jobs import (
    ABNORMAL_ENDS,
    ENDED_STATES,
    HoldRequest,
    JobHistory,
    JobHistoryRequest,
    JobRecoveryInput,
    JobRecoveryResult,
    OwnerNotice,
    PastRecovery,
    RecoveryHandoff,
    RecoveryJoin,
    VerifyJobRequest,
    VerifyOutcome,
)
from gpuheal.core.messages import INCIDENT, JOB_RECOVERY, RECOVERY_JOIN
from gpuheal.core.models.base import REQUEUE_STATES, ActionClass, check_cluster_name
from gpuheal.core.models.incident import JobRecoverySettings
from gpuheal.core.models.kubernetes import NodeEmptyWait
from gpuheal.core.models.result import ResumedJob
from gpuheal.core.models.slurm import (
    CheckpointOutcome,
    CheckpointRequest,
    CheckpointResult,
    CheckpointSent,
    CheckpointWait,
    JobList,
    JobSnapshot,
    RequeueRequest,
    RequeueResult,
)

# A requeued job passes through REQUEUED/COMPLETING in well under a second; the update that makes
# it eligible at once waits for PENDING this often at most for REQUEUED_FAST_S, then (a job stuck
# COMPLETING: a hung node's epilog, in a storm thousands) every REQUEUED_SLOW_POLL_S; this long in all.
REQUEUED_POLL_S = 0.25
# A checkpoint on its signal lands within tens to hundreds of milliseconds, and the incident's
# requeue waits on it: the first half second is asked at polling's first pace (a granted
# incident's checkpoint wait; the budget bounds how many at once), then backing off as before.
CHECKPOINT_FAST_S = 0.5
REQUEUED_FAST_S = 3.0
REQUEUED_SLOW_POLL_S = 2.0
REQUEUED_WAIT_S = 30.0


# The actions whose open incidents leave their node healthy (a requeued job may land there).
HEALTHY_NODE_ACTIONS = frozenset({ActionClass.RESTART_APP.value, ActionClass.IGNORE.value})
log = logging.getLogger(__name__)


# A requeued job's verification: while it pends for the scheduler's next pass (seconds) it is
# asked every request's poll_interval_s; once it has pended PENDING_FAST_S (waiting for a
# replacement or its burn-in, for hours maybe) at most every PENDING_POLL_S (PENDING_POLLS
# polls). Running again, its first steps past the checkpoint come within a second or two: it is
# asked every RESTART_POLL_S for RESTART_FAST_S from that moment, then every poll_interval_s (in
# any other state too: a job stuck COMPLETING). Never faster than the last question took
# (polling.after). Only jobs that just ran again are asked that closely: a storm's grants bound how many.
PENDING_FAST_S = 15.0
PENDING_POLL_S = 10.0
PENDING_POLLS = 20
RESTART_POLL_S = 0.1
RESTART_FAST_S = 10.0


def _running_again(job: JobSnapshot, want: RequeueResult) -> bool:
    """RUNNING in a run after the requeue (a higher restart count than before it)."""
    return job.state == "RUNNING" and job.restart_count > want.restart_count_before


def _heartbeat_field(name: str) -> float | None:
    """A value the last attempt of this activity heartbeated (None on a first attempt)."""
    details = activity.info().heartbeat_details if activity.in_activity() else ()
    value = details[0].get(name) if details and isinstance(details[0], dict) else None
    return float(value) if isinstance(value, int | float) else None


class JobActivities:
    def __init__(self, slurm: SlurmBackend, owners: OwnerNotifier, recovery: JobRecoverySettings) -> None:
        self._slurm = slurm
        self._owners = owners
        self._recovery = recovery  # the worker's configuration for the recoveries it starts

    # --- checkpoint ------------------------------------------------------------------------

    @implements(act.REQUEST_CHECKPOINT)
    async def request_checkpoint(self, req: CheckpointRequest) -> CheckpointSent:
        """Send each job the signal it asked for, if it is still running there and the run there
        now still says it traps one (requeued since it was listed, or at a retry, the run may be
        a new one that has not trapped it yet: job_policy.checkpoint_ask). A second signal after
        a retry only asks for a checkpoint the job already has."""
        now = {
            j.job_id: job_policy.checkpoint_ask(j)
            for j in await self._slurm.jobs_on_node(req.node)
            if j.state == "RUNNING"
        }
        sent = []
        for ask in req.asks:
            current = now.get(ask.job_id)
            if current is not None:  # the signal the run there now names
                at = time.time()
                await self._slurm.signal_job(ask.job_id, current.signal, current.batch_only)
                sent.append(current.model_copy(update={"signalled_at": at}))
        return CheckpointSent(asks=tuple(sent))

    @implements(act.WAIT_FOR_CHECKPOINTS)
    async def wait_for_checkpoints(self, req: CheckpointWait) -> CheckpointResult:
        """Until each signalled job shows a checkpoint taken after its signal (its progress
        line's ckpt_at), or the deadline; a job that publishes no progress is not waited for
        beyond `unconfirmed_wait_s`."""
        done: dict[int, CheckpointOutcome] = {}
        asks = {a.job_id: a for a in req.asks}
        pace = polling.Pace(req.poll_interval_s, fast_for=CHECKPOINT_FAST_S)
        while True:
            now = time.time()
            pace.asking()
            found = await self._slurm.jobs(set(asks) - set(done))
            for job in found:
                ask = asks[job.job_id]
                p = job.progress
                if p is not None and p.checkpoint_at is not None and p.checkpoint_at >= ask.signalled_at:
                    after = max(0.0, p.checkpoint_at - ask.signalled_at)
                    done[job.job_id] = _confirmed(ask.job_id, ask.signal, p.checkpoint_step, after)
                elif job.state in ENDED_STATES:
                    done[job.job_id] = _unconfirmed(job.job_id, ask.signal, now - ask.signalled_at, f"it {job.state}")
                elif p is None and now >= ask.signalled_at + req.unconfirmed_wait_s:
                    done[job.job_id] = _unconfirmed(
                        job.job_id, ask.signal, now - ask.signalled_at, "no progress published"
                    )
            for gone in set(asks) - set(done) - {j.job_id for j in found}:
                done[gone] = _unconfirmed(gone, asks[gone].signal, now - asks[gone].signalled_at, "Slurm forgot it")
            waiting = sorted(set(asks) - set(done))
            if not waiting:
                break
            if now >= req.deadline_at:
                for job_id in waiting:
                    done[job_id] = _unconfirmed(job_id, asks[job_id].signal, now - asks[job_id].signalled_at)
                break
            activity.heartbeat({"waiting_for_checkpoints": waiting})
            await pace.sleep()
        return CheckpointResult(outcomes=tuple(done[j] for j in sorted(done)))

    # --- the jobs' state -------------------------------------------------------------------

    @implements(act.FIND_JOBS)
    async def find_jobs(self, jobs: JobList) -> JobList:
        """What Slurm says now of jobs seen earlier (one query for all of them)."""
        return JobList(jobs=tuple(await self._slurm.jobs(j.job_id for j in jobs.jobs)))

    @implements(act.WAIT_FOR_NODE_EMPTY)
    async def wait_for_node_empty(self, req: NodeEmptyWait) -> JobList:
        """Until no job runs on the node any more (its jobs were requeued elsewhere), or the
        deadline; returns what is still there."""
        while True:
            left = await self._slurm.jobs_on_node(req.node)
            if not left or time.time() >= req.deadline_at:
                return JobList(jobs=tuple(left))
            activity.heartbeat({"still_on_node": [j.job_id for j in left]})
            await asyncio.sleep(req.poll_s)

    # --- requeue, hold, verify -------------------------------------------------------------

    @implements(act.REQUEUE_SLURM_JOB)
    async def requeue_slurm_job(self, req: RequeueRequest) -> RequeueResult:
        """Requeue once (a retry finds the restart count already higher), make it eligible at
        once and keep it off the failed nodes (and let it back on nodes gpuheal excluded after
        earlier failures that are healthy again). A job that ended abnormally during the incident
        is requeued too; one that completed or was cancelled is left as it ended."""
        before = req.job
        base = {"job_id": before.job_id, "restart_count_before": before.restart_count, "node_count": before.node_count}
        current = await self._slurm.job(before.job_id)
        if current is None:
            return RequeueResult(**base, requeued=False, reason="job no longer known to Slurm", ended_state="PURGED")
        if current.restart_count <= before.restart_count:
            failed = {req.failed_node, *req.also_failed}
            why = policy.unrequeueable_reason(current.requeueable, current.state, ABNORMAL_ENDS)
            if why is None and req.exclude_failed_node and failed & set(expand(current.required_nodes)):
                why = f"pinned to {','.join(sorted(failed))} with --nodelist: it cannot restart elsewhere"
            if why:
                ended = current.state if current.state in ENDED_STATES else ""
                return RequeueResult(**base, requeued=False, reason=why, ended_state=ended)
            try:
                await self._slurm.requeue(current.job_id, req.failed_node)
            except RequeueUnavailable as err:
                return RequeueResult(**base, requeued=False, reason=str(err))
            already = False
        else:
            already = True  # a previous attempt requeued it; only finish the job's set-up below
        progress = current.progress
        if progress is None or progress.restart != before.restart_count:
            progress = before.progress  # the restarted run has overwritten the comment already
        excluded: tuple[str, ...] | None = None
        avoided: tuple[str, ...] = ()
        if req.exclude_failed_node:
            healthy = await self._healthy(req.release_nodes)
            keep = set(expand(current.excluded_nodes)) - healthy
            failed = {req.failed_node, *req.also_failed}
            avoided = tuple(sorted(await self._nodes_with_open_incidents(req.cluster) - failed - keep))
            excluded = tuple(sorted(keep | failed | set(avoided)))
        # Slurm holds a requeued job back for CredExpire (BeginTime): its credential is revoked
        # on the nodes it ran on, and a launch there before then is killed ("Job credential
        # revoked": the job FAILED, lost). It starts at once only where none of them can take it.
        ran_on = set(expand(before.nodes)) | set(expand(current.nodes))
        at_once = excluded is not None and ran_on <= set(excluded)
        await self._when_pending(current.job_id, JobUpdate(start_now=at_once, excluded_nodes=excluded))
        return RequeueResult(
            avoided=avoided,
            **base,
            requeued=True,
            already_requeued=already,
            reason="ended " + current.state + "; requeued" if current.state in ENDED_STATES else "",
            step_at_failure=progress.step if progress else None,
            checkpoint_step=progress.checkpoint_step if progress else None,
            checkpoint_at=progress.checkpoint_at if progress else None,
        )

    async def _nodes_with_open_incidents(self, cluster: str) -> set[str]:
        """The nodes of the cluster's running incidents that take their node out (visibility):
        failing, whether or not their drain has come yet. An application restart's node is
        healthy, an ignored report's too: not these. Best effort: visibility not answering
        (a loaded server) costs the job this protection, never its requeue or the exclusion of
        the nodes it failed on. None for a request without its cluster (a recovery started
        before this release). The cluster's name reaches a query: it is checked first."""
        if not cluster:
            return set()
        query = queries.where(
            queries.of_type(INCIDENT), queries.eq(sa.CLUSTER, check_cluster_name(cluster)), queries.status("Running")
        )
        found: set[str] = set()
        try:
            async for execution in activity.client().list_workflows(query):
                attrs = execution.typed_search_attributes
                node = attrs.get(sa.NODE)
                if node and attrs.get(sa.ACTION) not in HEALTHY_NODE_ACTIONS:
                    found.add(node)
        except RPCError as err:
            log.warning(
                "requeue: the cluster's open incidents could not be listed (%s): only the failed nodes kept off", err
            )
            return set()
        return found

    async def _healthy(self, nodes: tuple[str, ...]) -> set[str]:
        if not nodes:
            return set()
        in_service = await self._slurm.nodes()
        return {n for n in nodes if n in in_service and not in_service[n].drained and in_service[n].state != "down"}

    async def _when_pending(self, job_id: int, update: JobUpdate) -> None:
        """A requeued job passes through REQUEUED/COMPLETING before it is PENDING, and only a
        pending job takes these updates; wait for it (a retry of the activity lands here too)."""
        pace = polling.Pace(REQUEUED_POLL_S)
        while pace.slept < REQUEUED_WAIT_S:
            if pace.slept >= REQUEUED_FAST_S:
                pace.slower(REQUEUED_SLOW_POLL_S)
            pace.asking()
            job = await self._slurm.job(job_id)
            if job is None or job.state not in REQUEUE_STATES:
                return  # running again already (or gone): nothing left to adjust
            if job.state == "PENDING" and "COMPLETING" not in job.state_flags:
                await self._slurm.update_job(job_id, update)
                return
            activity.heartbeat(f"job {job_id} is {job.state}")
            await pace.sleep()
        raise RuntimeError(f"job {job_id} did not become PENDING after its requeue")

    @implements(act.HOLD_SLURM_JOB)
    async def hold_slurm_job(self, req: HoldRequest) -> str:
        """Stop the job coming back by itself: requeued held if it still runs (hung on a failed
        node), held if it waits. Released with `scontrol release JOBID`."""
        job = await self._slurm.job(req.job_id)
        if job is None:
            return f"job {req.job_id} is no longer known to Slurm"
        if job.state == "PENDING" and job.state_reason in {"JobHeldAdmin", "JobHeldUser"}:
            return f"job {req.job_id} already held"
        if job.state == "PENDING":
            await self._slurm.hold(req.job_id)
        else:
            await self._slurm.requeue(req.job_id, req.failed_node, hold=True)
        return f"job {req.job_id} held: release with scontrol release {req.job_id}"

    @implements(act.WAIT_FOR_JOB_RESUME)
    async def wait_for_job_resume(self, req: VerifyJobRequest) -> VerifyOutcome:
        """Until the requeued job runs on healthy nodes, all of them, with its progress past the
        checkpoint it had before the failure; a job that ends is seen at once, a silent one at
        the deadline. Heartbeats say what it is doing meanwhile."""
        want = req.requeue
        pace, running, fast_until = polling.Pace(req.poll_interval_s), -1, 0.0
        # When it first ran again (its deadline counts from here), carried across a retry.
        running_since: float | None = _heartbeat_field("running_since")
        pending_since: float | None = None
        while True:
            pace.asking()
            job = await self._slurm.job(want.job_id)
            if job is not None and job.state == "RUNNING" and job.restart_count != running:
                # RUNNING again: its first steps come within a second or two, watched closely
                pace = polling.Pace(min(RESTART_POLL_S, req.poll_interval_s))
                running, fast_until = job.restart_count, time.monotonic() + RESTART_FAST_S
                if _running_again(job, want) and running_since is None:
                    running_since = time.time()
            if time.monotonic() > fast_until:
                pace.slower(req.poll_interval_s)  # not past it yet (or not running): asked less
            if job is None:
                return VerifyOutcome(job_id=want.job_id, outcome="died", state="PURGED", reason="Slurm forgot it")
            if job.state in ENDED_STATES:
                return VerifyOutcome(job_id=job.job_id, outcome="died", state=job.state, reason=job.state_reason)
            if wrong := self._on_failed_node(job, want, req.avoid_nodes):
                why = f"it runs again on {', '.join(wrong)}, a node it was requeued away from"
                return VerifyOutcome(job_id=job.job_id, outcome="on_failed_node", state=job.state, reason=why)
            resumed = self._resumed(job, want)
            if resumed is not None:
                return VerifyOutcome(job_id=job.job_id, outcome="resumed", state=job.state, resumed=resumed)
            if time.time() >= req.silent_at(running_since):
                why = (
                    f"{job.state} ({job.state_reason})" if job.state != "RUNNING" else "no progress past its checkpoint"
                )
                return VerifyOutcome(job_id=job.job_id, outcome="silent", state=job.state, reason=why)
            activity.heartbeat(
                {"job": job.job_id, "state": job.state, "reason": job.state_reason, "running_since": running_since}
            )
            pending_since = (pending_since or time.monotonic()) if job.state == "PENDING" else None
            if pending_since is None or time.monotonic() - pending_since < PENDING_FAST_S:
                await pace.sleep()  # running, or pending for the scheduler's next pass
            else:  # waiting in Slurm for something else (for hours, maybe): asked less often
                await asyncio.sleep(min(PENDING_POLL_S, PENDING_POLLS * req.poll_interval_s))

    @staticmethod
    def _on_failed_node(job: JobSnapshot, want: RequeueResult, avoid: tuple[str, ...]) -> list[str]:
        return sorted(set(avoid) & set(expand(job.nodes))) if _running_again(job, want) else []

    @staticmethod
    def _resumed(job: JobSnapshot, want: RequeueResult) -> ResumedJob | None:
        if not _running_again(job, want):
            return None
        nodes = expand(job.nodes)
        publishes = want.step_at_failure is not None or job.progress is not None
        p = job.this_runs_progress
        if publishes:
            if p is None:
                return None  # no line yet, or the comment is still the failed run's
            if p.step <= (want.checkpoint_step or 0):
                return None
        return ResumedJob(
            job_id=job.job_id,
            node=",".join(nodes),
            step=p.step if publishes and p else 0,
            checkpoint_step=want.checkpoint_step or 0,
            restart_count=job.restart_count,
            observed_at=datetime.now(UTC),
            progress_checked=publishes,
        )

    # --- owners ----------------------------------------------------------------------------

    @implements(act.NOTIFY_JOB_OWNER)
    async def notify_job_owner(self, notice: OwnerNotice) -> str:
        """Deliver the notice; a job whose JSON left out --mail-user (22.05) is asked for it."""
        if not notice.mail_user:
            notice = notice.model_copy(update={"mail_user": await self._slurm.mail_user(notice.job_id)})
        return await self._owners.send(notice)

    # --- recoveries (Temporal) -------------------------------------------------------------

    @implements(act.START_JOB_RECOVERY)
    async def start_job_recovery(self, join: RecoveryJoin) -> RecoveryHandoff:
        """Hand the job to its recovery: start it, or join the one this failure already has. An
        id is used once (REJECT_DUPLICATE): a retry after the recovery ended gets its result."""
        client = activity.client()
        cluster = join.cluster
        recovery_id = ids.recovery_id(cluster, join.job)
        try:
            await client.start_workflow(
                JOB_RECOVERY.name,
                JobRecoveryInput(cluster=cluster, job_id=join.job.job_id, settings=self._recovery),
                id=recovery_id,
                task_queue=ids.workflows_queue(activity.info().task_queue),
                start_signal=RECOVERY_JOIN.name,
                start_signal_args=[join],
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                search_attributes=TypedSearchAttributes(
                    [SearchAttributePair(sa.CLUSTER, cluster), SearchAttributePair(sa.JOB_ID, join.job.job_id)]
                ),
                memo={"requeued": False, "failed_nodes": [join.failed_node]},
                static_summary=f"Job {join.job.job_id} ({join.job.name}, {join.job.user}) hit on {join.failed_node}",
            )
        except WorkflowAlreadyStartedError:
            handle = client.get_workflow_handle(recovery_id, result_type=JobRecoveryResult)
            if (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED:
                return RecoveryHandoff(recovery_id=recovery_id, result=await handle.result())
            raise  # running, but refused the signal: retry
        return RecoveryHandoff(recovery_id=recovery_id)

    @implements(act.JOB_RECOVERY_HISTORY)
    async def job_recovery_history(self, req: JobHistoryRequest) -> JobHistory:
        """The job's recoveries since `since`, from Temporal's visibility (their memos)."""
        query = queries.where(
            queries.of_type(JOB_RECOVERY),
            queries.eq(sa.CLUSTER, req.cluster),
            queries.eq(sa.JOB_ID, req.job_id),
            queries.after(queries.START_TIME, req.since.astimezone(UTC)),
        )
        found = []
        async for execution in activity.client().list_workflows(query):
            if execution.id == req.exclude_id:
                continue
            memo = await execution.memo()
            found.append(
                PastRecovery(
                    recovery_id=execution.id,
                    started_at=execution.start_time,
                    requeued=bool(memo.get("requeued")),
                    failed_nodes=tuple(memo.get("failed_nodes") or ()),
                    avoided_nodes=tuple(memo.get("avoided_nodes") or ()),
                )
            )
        return JobHistory(recoveries=tuple(found))


def _confirmed(job_id: int, signal: str, step: int, after_s: float) -> CheckpointOutcome:
    return CheckpointOutcome(
        job_id=job_id,
        signal=signal,
        confirmed=True,
        step=step,
        after_s=round(after_s, 2),
        detail=f"checkpoint confirmed at step {step} after {after_s:.1f} s",
    )


def _unconfirmed(job_id: int, signal: str, after_s: float, why: str = "") -> CheckpointOutcome:
    return CheckpointOutcome(
        job_id=job_id,
        signal=signal,
        confirmed=False,
        after_s=round(after_s, 2),
        detail=f"no confirmation after {after_s:.1f} s" + (f" ({why})" if why else ""),
    )
