"""GpuRemediation: one durable workflow per failed node.

Thin and deterministic: decisions come from gpuheal.policy (pure functions), every external
action is an activity (activities/remediation.py). The stages, in order:

  triage -> [drain, approval] -> notify -> protect_progress -> drain -> requeue
         -> repair_or_replace -> verify_resume -> return_to_service -> close

When policy asks for a human, the node is drained first (containment: nothing new lands on a
suspect GPU, running jobs are untouched) and the workflow waits for `approve` / `abort`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, Literal, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.kubernetes import KubernetesActivities
    from activities.remediation import NOT_RESUMED, UNKNOWN_NODE, RemediationActivities
    from gpuheal import policy
    from gpuheal import search_attributes as sa
    from gpuheal.models import (
        ActionClass,
        CheckpointRequest,
        CordonRequest,
        CordonResult,
        Decision,
        DrainResult,
        EvictRequest,
        EvictResult,
        HealthReport,
        KubeEvent,
        KubeNodeRef,
        KubernetesPolicy,
        MapNodeRequest,
        NodeRef,
        Notification,
        RecordedDecision,
        RemediationInput,
        RemediationResult,
        RemediationStatus,
        RepairRequest,
        ReplacementResult,
        RequeueRequest,
        RequeueResult,
        ResumedJob,
        Stage,
        StageRecord,
        UnrequeuedJob,
        VerifyRequest,
    )

T = TypeVar("T")
Verdict = Literal["approve", "abort"]

RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=30,
    non_retryable_error_types=[UNKNOWN_NODE, NOT_RESUMED],
)
SHORT = timedelta(seconds=30)
ACTS = RemediationActivities
KUBE = KubernetesActivities


@workflow.defn(name="GpuRemediation")
class GpuRemediationWorkflow:
    @workflow.init
    def __init__(self, inp: RemediationInput) -> None:
        self._input = inp
        self._reports: list[HealthReport] = [inp.report]
        self._duplicates = 0
        self._stage = Stage.TRIAGE
        self._stages: list[StageRecord] = []
        self._done: list[str] = []
        self._action: ActionClass | None = None
        self._awaiting_approval = False
        self._decision: RecordedDecision | None = None
        self._result: RemediationResult | None = None
        self._kube: KubeNodeRef | None = None  # set when the node is also a Kubernetes node
        self._cordon: CordonResult | None = None
        self._ref = NodeRef(cluster=inp.report.cluster, node=inp.report.node, incident_id=workflow.info().workflow_id)

    # --- run -----------------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: RemediationInput) -> RemediationResult:
        report, settings = inp.report, inp.settings
        ref = self._ref
        drain: DrainResult | None = None

        async with self._in_stage(Stage.TRIAGE) as rec:
            try:
                await self._act(ACTS.look_up_slurm_node, ref, summary="look up Slurm node")
                if settings.kubernetes is not None:
                    req_map = MapNodeRequest(ref=ref, node_label=settings.kubernetes.node_label)
                    self._kube = await self._act(KUBE.map_kube_node, req_map, summary="find the Kubernetes node")
            except ActivityError as err:
                msg = err.cause.message if isinstance(err.cause, ApplicationError) else str(err)
                raise ApplicationError(f"cannot remediate {report.describe()}: {msg}") from err
            verdict = policy.triage_all(self._reports)
            self._set_action(verdict.action)
            rec.outcome = f"{verdict.action.value}: {verdict.reason}"
        if verdict.action == ActionClass.IGNORE:
            return await self._close("ignored", verdict.reason, "untouched", drain)

        if policy.needs_approval(verdict.action, settings.approval):
            if policy.plan_for(verdict.action).drain:
                drain = await self._drain(ref, "contained while awaiting approval")
            decision = await self._await_decision()
            if decision.verdict == "abort":
                await self._notify(
                    "aborted", "warning", f"remediation aborted by {decision.operator}: {decision.reason}"
                )
                state = "drained by this incident; not replaced" if drain and drain.drained_by_us else "untouched"
                if drain and drain.drained_by_us:
                    state += f"; release with: scontrol update nodename={ref.node} state=resume"
                return await self._close("aborted", decision.reason, state, drain)

        async with self._in_stage(Stage.NOTIFY) as rec:
            rec.outcome = "operators notified"
            await self._notify("remediating", "critical", f"{report.describe()}: {self._action}. {verdict.reason}")

        async with self._in_stage(Stage.PROTECT) as rec:
            jobs = await self._act(ACTS.list_jobs_on_node, ref, summary="find jobs on node")
            if jobs:
                req = CheckpointRequest(node=ref.node, job_ids=tuple(j.job_id for j in jobs))
                signalled = await self._act(ACTS.request_checkpoint, req, summary="ask jobs to checkpoint (SIGUSR1)")
                if signalled and settings.checkpoint_grace_s > 0:
                    await workflow.sleep(timedelta(seconds=settings.checkpoint_grace_s))
                rec.outcome = f"asked {len(signalled)} job(s) to checkpoint, waited {settings.checkpoint_grace_s:g} s"
            else:
                rec.outcome = "no job on the node"

        plan = policy.plan_for(self._current_action())  # a later report may have escalated it
        if plan.drain and drain is None:
            drain = await self._drain(ref, self._reason())

        requeued: list[RequeueResult] = []
        not_requeued: list[UnrequeuedJob] = []
        if plan.requeue:
            async with self._in_stage(Stage.REQUEUE) as rec:
                for job in await self._act(ACTS.list_jobs_on_node, ref, summary="find jobs on node"):
                    req_q = RequeueRequest(job=job, failed_node=ref.node, exclude_failed_node=plan.avoid_failed_node)
                    res = await self._act(ACTS.requeue_slurm_job, req_q, summary=f"requeue job {job.job_id}")
                    if res.requeued:
                        requeued.append(res)
                    else:
                        not_requeued.append(UnrequeuedJob(job_id=res.job_id, reason=res.reason))
                rec.outcome = (
                    f"requeued {[r.job_id for r in requeued]}, not requeued {[u.job_id for u in not_requeued]}"
                )

        if self._kube is not None and plan.drain:
            evicted = await self._evict(self._kube, settings.kubernetes)
            if evicted.blocked:
                decision = await self._await_decision(
                    f"pods {list(evicted.blocked)} are still protected by a PodDisruptionBudget"
                )
                if decision.verdict == "abort":
                    state = f"drained and cordoned; pods {list(evicted.blocked)} still there; not replaced"
                    return await self._close("aborted", decision.reason, state, drain)

        replacement: ReplacementResult | None = None
        capacity_back_at = None
        if plan.repair is not None:
            async with self._in_stage(Stage.REPAIR) as rec:
                if plan.repair == ActionClass.REPLACE_NODE:
                    replacement = await self._replace(ref)
                    rec.outcome = f"{replacement.new_node} joined in place of {ref.node}"
                else:
                    rec.outcome = await self._act(
                        ACTS.repair_node,
                        RepairRequest(node=ref, action=plan.repair),
                        summary=f"{plan.repair} {ref.node}",
                        timeout=timedelta(minutes=5),
                    )
                capacity_back_at = workflow.now()

        resumed: list[ResumedJob] = []
        if requeued:
            async with self._in_stage(Stage.VERIFY) as rec:
                req_v = VerifyRequest(jobs=tuple(requeued), avoid_node=ref.node if plan.avoid_failed_node else None)
                resumed = await self._act(
                    ACTS.wait_for_training_progress,
                    req_v,
                    summary="wait for training past its checkpoint",
                    timeout=timedelta(seconds=settings.verify_timeout_s),
                    heartbeat=timedelta(seconds=10),
                    attempts=0,
                )
                rec.outcome = "; ".join(
                    f"job {r.job_id} at step {r.step} (> ckpt {r.checkpoint_step}) on {r.node}" for r in resumed
                )

        async with self._in_stage(Stage.RETURN) as rec:
            state, replacement = await self._return_to_service(ref, plan.repair, drain, replacement)
            rec.outcome = state

        cost = policy.incident_cost(report.observed_at, requeued, resumed, settings.gpus_per_node, capacity_back_at)
        return await self._close(
            "resolved",
            self._reason(),
            state,
            drain,
            requeued=requeued,
            not_requeued=not_requeued,
            resumed=resumed,
            replacement=replacement,
            cost=cost,
        )

    # --- stages ----------------------------------------------------------------------------

    async def _drain(self, ref: NodeRef, why: str) -> DrainResult:
        """Slurm first (eviction alone tells Slurm nothing), then the Kubernetes cordon."""
        async with self._in_stage(Stage.DRAIN) as rec:
            result = await self._act(
                ACTS.drain_slurm_node,
                ref,
                policy.drain_reason(ref.incident_id, why),
                summary=f"drain {ref.node}",
            )
            rec.outcome = (
                f"drained ({why})" if not result.already_drained else f"already drained: {result.previous_reason!r}"
            )
        k8s = self._input.settings.kubernetes
        if self._kube is not None and k8s is not None and self._cordon is None:
            async with self._in_stage(Stage.CORDON) as rec:
                req = CordonRequest(node=self._kube, no_execute=k8s.no_execute)
                self._cordon = await self._act(
                    KUBE.cordon_and_taint_node, req, summary=f"cordon {self._kube.kube_node}"
                )
                taints = "NoSchedule" + (" + NoExecute" if k8s.no_execute else "")
                rec.outcome = f"cordoned, tainted {taints}" + (
                    " (it was already cordoned by someone else)" if self._cordon.cordoned_by_others else ""
                )
        return result

    async def _evict(self, node: KubeNodeRef, k8s: KubernetesPolicy | None) -> EvictResult:
        assert k8s is not None
        async with self._in_stage(Stage.EVICT) as rec:
            req = EvictRequest(
                node=node, deadline_s=k8s.drain_deadline_s, delete_when_blocked=k8s.on_pdb_timeout == "delete"
            )
            result = await self._act(
                KUBE.evict_pods,
                req,
                summary=f"evict pods from {node.kube_node}",
                timeout=timedelta(seconds=k8s.drain_deadline_s + 60),
                heartbeat=timedelta(seconds=30),
            )
            rec.outcome = (
                f"evicted {len(result.evicted)}, kept {len(result.kept)} (DaemonSet/mirror), "
                f"{result.retries_429} PDB retries"
                + (f", deleted {list(result.deleted)}" if result.deleted else "")
                + (f", BLOCKED {list(result.blocked)}" if result.blocked else "")
            )
            return result

    async def _replace(self, ref: NodeRef) -> ReplacementResult:
        return await self._act(ACTS.replace_node, ref, summary=f"replace {ref.node}", timeout=timedelta(minutes=10))

    async def _return_to_service(
        self,
        ref: NodeRef,
        repair: ActionClass | None,
        drain: DrainResult | None,
        replacement: ReplacementResult | None,
    ) -> tuple[str, ReplacementResult | None]:
        """Resume a repaired node only after its health check passes; a replaced node leaves."""
        if repair is None:
            return "in service (not drained)", None
        if repair != ActionClass.REPLACE_NODE:
            health = await self._act(ACTS.check_node_health, ref, summary=f"health check {ref.node}")
            if not health.healthy:
                # A repair that did not take: the node goes, a spare comes.
                self._set_action(ActionClass.REPLACE_NODE)
                replacement = await self._replace(ref)
            elif drain is not None and drain.drained_by_us:
                msg = await self._act(ACTS.resume_slurm_node, ref, summary=f"resume {ref.node}")
                if self._kube is not None:
                    msg += "; " + await self._act(KUBE.uncordon_node, self._kube, summary="uncordon")
                return f"repaired, health check passed; {msg}", None
            else:
                before = drain.previous_reason if drain else ""
                return f"repaired, health check passed; left drained (drained before us: {before!r})", None
        assert replacement is not None
        msg = await self._act(ACTS.decommission_node, ref, summary=f"remove {ref.node} from the cluster")
        return f"replaced by {replacement.new_node}; {msg}", replacement

    async def _await_decision(self, why: str = "policy asks for a human") -> RecordedDecision:
        approval = self._input.settings.approval
        async with self._in_stage(Stage.APPROVAL) as rec:
            self._decision = None  # an earlier gate's decision does not answer this one
            self._awaiting_approval = True
            await self._notify(
                "approval_needed",
                "warning",
                f"{self._input.report.describe()}: {self._action} awaits approval ({why}; "
                f"default after {approval.timeout_s:g} s: {approval.default_on_timeout})",
            )
            try:
                await workflow.wait_condition(
                    lambda: self._decision is not None, timeout=timedelta(seconds=approval.timeout_s)
                )
            except TimeoutError:
                self._decision = RecordedDecision(
                    verdict=approval.default_on_timeout,
                    operator="gpuheal-policy",
                    reason=f"no decision within {approval.timeout_s:g} s",
                    at=workflow.now(),
                    by_timeout=True,
                )
            finally:
                self._awaiting_approval = False
            assert self._decision is not None
            rec.outcome = f"{self._decision.verdict} by {self._decision.operator}: {self._decision.reason}"
            return self._decision

    async def _close(
        self,
        outcome: Literal["resolved", "ignored", "aborted"],
        reason: str,
        node_state: str,
        drain: DrainResult | None,
        *,
        requeued: list[RequeueResult] | None = None,
        not_requeued: list[UnrequeuedJob] | None = None,
        resumed: list[ResumedJob] | None = None,
        replacement: ReplacementResult | None = None,
        cost: policy.IncidentCost | None = None,
    ) -> RemediationResult:
        async with self._in_stage(Stage.CLOSE) as rec:
            result = RemediationResult(
                incident_id=self._ref.incident_id,
                cluster=self._ref.cluster,
                node=self._ref.node,
                action=self._current_action(),
                outcome=outcome,
                reason=reason,
                node_state=node_state,
                failure_observed_at=self._input.report.observed_at,
                closed_at=workflow.now(),
                stages=self._stages,
                reports=self._reports,
                decision=self._decision,
                drain=drain,
                jobs_requeued=requeued or [],
                jobs_not_requeued=not_requeued or [],
                jobs_resumed=resumed or [],
                replacement_node=replacement.new_node if replacement else None,
                mttr_s=cost.mttr_s if cost else None,
                steps_lost=cost.steps_lost if cost else 0,
                gpu_seconds_lost=cost.gpu_seconds_lost if cost else 0.0,
            )
            unrequeued = "".join(f"; job {u.job_id} NOT requeued: {u.reason}" for u in result.jobs_not_requeued)
            mttr = f", MTTR {result.mttr_s:.1f} s" if result.mttr_s is not None else ""
            await self._notify(
                f"closed_{outcome}",
                "warning" if unrequeued or outcome == "aborted" else "info",
                f"{outcome}: {node_state}{mttr}{unrequeued}",
            )
            rec.outcome = outcome
        self._stage = Stage.DONE
        sa_update = [sa.STAGE.value_set(Stage.DONE.value)]
        workflow.upsert_search_attributes(sa_update)
        await self._act(ACTS.record_incident_metrics, result, summary="record metrics")
        self._result = result
        await workflow.wait_condition(workflow.all_handlers_finished)
        return result

    # --- helpers ---------------------------------------------------------------------------

    @asynccontextmanager
    async def _in_stage(self, stage: Stage) -> AsyncIterator[StageRecord]:
        rec = StageRecord(stage=stage, started_at=workflow.now())
        self._stages.append(rec)
        self._stage = stage
        workflow.upsert_search_attributes([sa.STAGE.value_set(stage.value)])
        workflow.logger.info("stage %s started", stage.value)
        try:
            yield rec
        finally:
            rec.ended_at = workflow.now()
            self._done.append(f"{stage.value}: {rec.outcome}" if rec.outcome else stage.value)
            workflow.set_current_details("\n".join(f"- {d}" for d in self._done))
        if self._kube is not None:  # `kubectl describe node` tells the story, stage by stage
            reason = "Gpuheal" + "".join(w.capitalize() for w in stage.value.split("_"))
            event = KubeEvent(node=self._kube, reason=reason, message=rec.outcome or stage.value)
            await self._act(KUBE.post_node_event, event, summary=f"event {reason}")

    async def _act(
        self,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        summary: str,
        timeout: timedelta = SHORT,
        heartbeat: timedelta | None = None,
        attempts: int | None = None,
    ) -> T:
        """Run one activity with the project's timeouts and retry policy (summary shows in the UI)."""
        retry = (
            RETRY
            if attempts is None
            else RetryPolicy(
                initial_interval=RETRY.initial_interval,
                maximum_interval=RETRY.maximum_interval,
                maximum_attempts=attempts,
                non_retryable_error_types=RETRY.non_retryable_error_types,
            )
        )
        return await workflow.execute_activity_method(
            fn,
            args=list(args),
            start_to_close_timeout=timeout,
            heartbeat_timeout=heartbeat,
            retry_policy=retry,
            summary=summary,
        )

    async def _notify(self, event: str, severity: Literal["info", "warning", "critical"], message: str) -> None:
        note = Notification(
            incident_id=self._ref.incident_id,
            event=event,
            severity=severity,
            message=message,
            node=self._ref.node,
            cluster=self._ref.cluster,
        )
        await self._act(ACTS.notify_operators, note, summary=f"notify: {event}")

    def _set_action(self, action: ActionClass) -> None:
        self._action = action
        workflow.upsert_search_attributes([sa.ACTION.value_set(action.value)])

    def _current_action(self) -> ActionClass:
        return self._action or policy.triage_all(self._reports).action

    def _reason(self) -> str:
        return policy.triage_all(self._reports).reason

    # --- signals, updates, queries ---------------------------------------------------------

    @workflow.signal
    def report(self, report: HealthReport) -> None:
        """Another report for this node (signal-with-start delivers the first one again)."""
        if report in self._reports:
            self._duplicates += 1
            return
        self._reports.append(report)
        # Before the node is repaired, a more severe report escalates the remediation.
        if self._action is not None and self._stage in {
            Stage.APPROVAL,
            Stage.NOTIFY,
            Stage.PROTECT,
            Stage.DRAIN,
            Stage.REQUEUE,
        }:
            escalated = policy.triage_all(self._reports).action
            if escalated != self._action:
                self._set_action(escalated)

    def _decide(self, verdict: Verdict, d: Decision) -> str:
        self._decision = RecordedDecision(verdict=verdict, operator=d.operator, reason=d.reason, at=workflow.now())
        return f"{verdict} recorded for {self._ref.incident_id} by {d.operator}"

    def _check_decidable(self, d: Decision) -> None:
        if not self._awaiting_approval:
            raise ValueError(f"incident is not awaiting approval (stage: {self._stage.value})")
        if self._decision is not None:
            raise ValueError(f"already decided: {self._decision.verdict} by {self._decision.operator}")

    @workflow.update
    def approve(self, d: Decision) -> str:
        return self._decide("approve", d)

    @approve.validator
    def _validate_approve(self, d: Decision) -> None:
        self._check_decidable(d)

    @workflow.update
    def abort(self, d: Decision) -> str:
        return self._decide("abort", d)

    @abort.validator
    def _validate_abort(self, d: Decision) -> None:
        self._check_decidable(d)

    @workflow.signal(name="approve")
    def approve_signal(self, d: Decision) -> None:
        """Fire-and-forget approve; ignored unless the incident awaits a decision."""
        if self._awaiting_approval and self._decision is None:
            self._decide("approve", d)

    @workflow.signal(name="abort")
    def abort_signal(self, d: Decision) -> None:
        if self._awaiting_approval and self._decision is None:
            self._decide("abort", d)

    @workflow.query
    def status(self) -> RemediationStatus:
        return RemediationStatus(
            incident_id=workflow.info().workflow_id,
            stage=self._stage,
            action=self._action,
            awaiting_approval=self._awaiting_approval,
            stages=self._stages,
            reports_received=len(self._reports) + self._duplicates,
            done=self._done,
            result=self._result,
        )
