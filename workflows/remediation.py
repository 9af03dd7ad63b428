"""GpuRemediation: one durable workflow per failed node.

Thin and deterministic: decisions come from gpuheal.policy (pure functions), words from
gpuheal.render, and every external action is an activity, called through its typed reference
in activities.interface (so this module never loads a Slurm, Kubernetes or HTTP client). The
stages, in order, each a method below:

  triage -> [drain, approval] -> notify -> protect_progress -> drain -> requeue -> [evict]
         -> repair_or_replace -> verify_resume -> return_to_service -> close

When policy asks for a human, the node is drained first (containment: nothing new lands on a
suspect GPU, running jobs are untouched) and the workflow waits for `approve` / `abort`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities import interface as act
    from activities.interface import Activity
    from gpuheal import policy, render
    from gpuheal import search_attributes as sa
    from gpuheal.errors import NON_RETRYABLE
    from gpuheal.models import (
        ActionClass,
        CheckpointRequest,
        CordonRequest,
        CordonResult,
        Decision,
        DrainRequest,
        DrainResult,
        EvictRequest,
        HealthReport,
        KubeEvent,
        KubeNodeRef,
        MapNodeRequest,
        NodeRef,
        Notification,
        Outcome,
        RecordedDecision,
        RemediationInput,
        RemediationResult,
        RemediationStatus,
        RepairRequest,
        ReplacementResult,
        RequeueRequest,
        RequeueResult,
        ResumedJob,
        Severity,
        Stage,
        StageRecord,
        UnrequeuedJob,
        Verdict,
        VerifyRequest,
    )

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741

RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=30,
    non_retryable_error_types=list(NON_RETRYABLE),
)
SHORT = timedelta(seconds=30)
PROVIDER_HEARTBEAT = timedelta(seconds=60)
# Stages during which a more severe report still changes what the incident will do.
ESCALATABLE = frozenset({Stage.APPROVAL, Stage.NOTIFY, Stage.PROTECT, Stage.DRAIN, Stage.REQUEUE})


@dataclass
class Progress:
    """What the incident has done so far: the facts its close reports."""

    drain: DrainResult | None = None
    requeued: list[RequeueResult] = field(default_factory=list)
    not_requeued: list[UnrequeuedJob] = field(default_factory=list)
    resumed: list[ResumedJob] = field(default_factory=list)
    replacement: ReplacementResult | None = None
    capacity_back_at: datetime | None = None
    node_state: str = "untouched"


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
        self._p = Progress()

    # --- run: the stages in order ---------------------------------------------------------

    @workflow.run
    async def run(self, inp: RemediationInput) -> RemediationResult:
        action = await self._triage()
        if action == ActionClass.IGNORE:
            return await self._close("ignored", self._reason())
        if policy.needs_approval(action, inp.settings.approval):
            decision = await self._approval_gate(action)
            if decision.verdict == "abort":
                return await self._close_aborted(decision)
        await self._notify_remediating()
        await self._protect_progress()
        plan = policy.plan_for(self._current_action())  # a later report may have escalated it
        if plan.drain and self._p.drain is None:
            await self._drain(self._reason())
        if plan.requeue:
            await self._requeue(plan.avoid_failed_node)
        if self._kube is not None and plan.drain:
            blocked = await self._evict_pods()
            if blocked is not None:
                return blocked
        if plan.repair is not None:
            await self._repair_or_replace(plan.repair)
        if self._p.requeued:
            await self._verify_resume(plan.avoid_failed_node)
        await self._return_to_service(plan.repair)
        return await self._close("resolved", self._reason())

    # --- stages ----------------------------------------------------------------------------

    async def _triage(self) -> ActionClass:
        """Fail fast on a node we cannot remediate, before anything is touched."""
        async with self._in_stage(Stage.TRIAGE) as rec:
            k8s = self._input.settings.kubernetes
            try:
                await self._act(act.LOOK_UP_SLURM_NODE, self._ref, summary="look up Slurm node")
                if k8s is not None:
                    req = MapNodeRequest(ref=self._ref, node_label=k8s.node_label)
                    self._kube = await self._act(act.MAP_KUBE_NODE, req, summary="find the Kubernetes node")
            except ActivityError as err:
                msg = err.cause.message if isinstance(err.cause, ApplicationError) else str(err)
                raise ApplicationError(f"cannot remediate {self._input.report.describe()}: {msg}") from err
            verdict = policy.triage_all(self._reports)
            self._set_action(verdict.action)
            rec.outcome = render.triaged(verdict.action, verdict.reason)
        return verdict.action

    async def _approval_gate(self, action: ActionClass) -> RecordedDecision:
        if policy.plan_for(action).drain:
            await self._drain("contained while awaiting approval")
        return await self._await_decision()

    async def _close_aborted(self, decision: RecordedDecision) -> RemediationResult:
        await self._notify("aborted", "warning", render.abort_notice(decision))
        self._p.node_state = render.aborted_node_state(self._ref.node, self._p.drain)
        return await self._close("aborted", decision.reason)

    async def _notify_remediating(self) -> None:
        async with self._in_stage(Stage.NOTIFY) as rec:
            rec.outcome = "operators notified"
            msg = render.remediating(self._input.report, self._current_action(), self._reason())
            await self._notify("remediating", "critical", msg)

    async def _protect_progress(self) -> None:
        """Ask the jobs on the node to checkpoint now, and give them the grace to do it."""
        grace = self._input.settings.checkpoint_grace_s
        async with self._in_stage(Stage.PROTECT) as rec:
            jobs = await self._act(act.LIST_JOBS_ON_NODE, self._ref, summary="find jobs on node")
            signalled = 0
            if jobs.jobs:
                req = CheckpointRequest(node=self._ref.node, job_ids=tuple(j.job_id for j in jobs.jobs))
                asked = await self._act(act.REQUEST_CHECKPOINT, req, summary="ask jobs to checkpoint (SIGUSR1)")
                signalled = len(asked.signalled)
                if signalled and grace > 0:
                    await workflow.sleep(timedelta(seconds=grace), summary="checkpoint grace: then drain and requeue")
            rec.outcome = render.checkpoint_asked(signalled, grace)

    async def _drain(self, why: str) -> None:
        """Slurm first (eviction alone tells Slurm nothing), then the Kubernetes cordon."""
        async with self._in_stage(Stage.DRAIN) as rec:
            req = DrainRequest(node=self._ref, reason=policy.drain_reason(self._ref.incident_id, why))
            self._p.drain = await self._act(act.DRAIN_SLURM_NODE, req, summary=f"drain {self._ref.node}")
            rec.outcome = render.drained(self._p.drain, why)
        k8s = self._input.settings.kubernetes
        if self._kube is not None and k8s is not None and self._cordon is None:
            async with self._in_stage(Stage.CORDON) as rec:
                cordon = CordonRequest(node=self._kube, no_execute=k8s.no_execute)
                self._cordon = await self._act(
                    act.CORDON_AND_TAINT_NODE, cordon, summary=f"cordon {self._kube.kube_node}"
                )
                rec.outcome = render.cordoned(self._cordon, k8s.no_execute)

    async def _requeue(self, avoid_failed_node: bool) -> None:
        async with self._in_stage(Stage.REQUEUE) as rec:
            jobs = await self._act(act.LIST_JOBS_ON_NODE, self._ref, summary="find jobs on node")
            for job in jobs.jobs:
                req = RequeueRequest(job=job, failed_node=self._ref.node, exclude_failed_node=avoid_failed_node)
                res = await self._act(act.REQUEUE_SLURM_JOB, req, summary=f"requeue job {job.job_id}")
                if res.requeued:
                    self._p.requeued.append(res)
                else:
                    self._p.not_requeued.append(UnrequeuedJob(job_id=res.job_id, reason=res.reason))
            rec.outcome = render.requeued(self._p.requeued, self._p.not_requeued)

    async def _evict_pods(self) -> RemediationResult | None:
        """Evict through the Eviction API; pods a PDB still protects at the deadline wait for a
        human. Returns the closed result when the human aborts."""
        k8s, node = self._input.settings.kubernetes, self._kube
        assert k8s is not None and node is not None
        async with self._in_stage(Stage.EVICT) as rec:
            req = EvictRequest(
                node=node, deadline_s=k8s.drain_deadline_s, delete_when_blocked=k8s.on_pdb_timeout == "delete"
            )
            evicted = await self._act(
                act.EVICT_PODS,
                req,
                summary=f"evict pods from {node.kube_node}",
                timeout=timedelta(seconds=k8s.drain_deadline_s + 60),
                heartbeat=timedelta(seconds=30),
            )
            rec.outcome = render.evicted(evicted)
        if not evicted.blocked:
            return None
        decision = await self._await_decision(
            f"pods {list(evicted.blocked)} are still protected by a PodDisruptionBudget"
        )
        if decision.verdict != "abort":
            return None
        self._p.node_state = render.blocked_node_state(evicted.blocked)
        return await self._close("aborted", decision.reason)

    async def _repair_or_replace(self, repair: ActionClass) -> None:
        async with self._in_stage(Stage.REPAIR) as rec:
            if repair != ActionClass.REPLACE_NODE:
                done = await self._act(
                    act.REPAIR_NODE,
                    RepairRequest(node=self._ref, action=repair),
                    summary=f"{repair} {self._ref.node}",
                    timeout=self._provider_timeout,
                    heartbeat=PROVIDER_HEARTBEAT,
                )
                rec.outcome = done.detail
                if not done.repaired:  # the platform cannot do it: the node goes, a spare comes
                    self._set_action(ActionClass.REPLACE_NODE)
                    repair = ActionClass.REPLACE_NODE
            if repair == ActionClass.REPLACE_NODE:
                self._p.replacement = await self._replace()
                rec.outcome = render.replaced(self._p.replacement.new_node, self._ref.node)
            self._p.capacity_back_at = workflow.now()

    async def _verify_resume(self, avoid_failed_node: bool) -> None:
        async with self._in_stage(Stage.VERIFY) as rec:
            req = VerifyRequest(jobs=tuple(self._p.requeued), avoid_node=self._ref.node if avoid_failed_node else None)
            verified = await self._act(
                act.WAIT_FOR_TRAINING_PROGRESS,
                req,
                summary="wait for training past its checkpoint",
                timeout=timedelta(seconds=self._input.settings.verify_timeout_s),
                heartbeat=timedelta(seconds=10),
                attempts=0,
            )
            self._p.resumed = list(verified.resumed)
            rec.outcome = render.resumed(self._p.resumed)

    async def _return_to_service(self, repair: ActionClass | None) -> None:
        """Resume a repaired node only after its health check passes; a replaced node leaves."""
        async with self._in_stage(Stage.RETURN) as rec:
            self._p.node_state = await self._node_back(repair)
            rec.outcome = self._p.node_state

    async def _node_back(self, repair: ActionClass | None) -> str:
        ref, drain = self._ref, self._p.drain
        if repair is None:
            return render.NOT_DRAINED
        if self._p.replacement is None:
            health = await self._act(act.CHECK_NODE_HEALTH, ref, summary=f"health check {ref.node}")
            if not health.healthy:  # a repair that did not take: the node goes, a spare comes
                self._set_action(ActionClass.REPLACE_NODE)
                self._p.replacement = await self._replace()
            elif drain is not None and drain.drained_by_us:
                msg = await self._act(act.RESUME_SLURM_NODE, ref, summary=f"resume {ref.node}")
                if self._kube is not None:
                    msg += "; " + await self._act(act.UNCORDON_NODE, self._kube, summary="uncordon")
                return render.returned_repaired(msg)
            else:
                return render.left_drained(drain)
        msg = await self._act(act.DECOMMISSION_NODE, ref, summary=f"remove {ref.node} from the cluster")
        return render.returned_replaced(self._p.replacement.new_node, msg)

    async def _replace(self) -> ReplacementResult:
        return await self._act(
            act.REPLACE_NODE,
            self._ref,
            summary=f"replace {self._ref.node}",
            timeout=self._provider_timeout,
            heartbeat=PROVIDER_HEARTBEAT,
        )

    async def _await_decision(self, why: str = "policy asks for a human") -> RecordedDecision:
        approval = self._input.settings.approval
        async with self._in_stage(Stage.APPROVAL) as rec:
            self._decision = None  # an earlier gate's decision does not answer this one
            self._awaiting_approval = True
            msg = render.approval_needed(
                self._input.report, self._action, why, approval.timeout_s, approval.default_on_timeout
            )
            await self._notify("approval_needed", "warning", msg)
            try:
                await workflow.wait_condition(
                    lambda: self._decision is not None,
                    timeout=timedelta(seconds=approval.timeout_s),
                    timeout_summary=f"approval: without a decision, {approval.default_on_timeout}",
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
            rec.outcome = render.decided(self._decision)
            return self._decision

    async def _close(self, outcome: Outcome, reason: str) -> RemediationResult:
        p, settings = self._p, self._input.settings
        cost = policy.incident_cost(
            self._input.report.observed_at, p.requeued, p.resumed, settings.gpus_per_node, p.capacity_back_at
        )
        async with self._in_stage(Stage.CLOSE) as rec:
            result = RemediationResult(
                incident_id=self._ref.incident_id,
                cluster=self._ref.cluster,
                node=self._ref.node,
                action=self._current_action(),
                outcome=outcome,
                reason=reason,
                node_state=p.node_state,
                failure_observed_at=self._input.report.observed_at,
                closed_at=workflow.now(),
                stages=self._stages,
                reports=self._reports,
                decision=self._decision,
                drain=p.drain,
                jobs_requeued=p.requeued,
                jobs_not_requeued=p.not_requeued,
                jobs_resumed=p.resumed,
                replacement_node=p.replacement.new_node if p.replacement else None,
                mttr_s=cost.mttr_s if outcome == "resolved" else None,
                steps_lost=cost.steps_lost if outcome == "resolved" else 0,
                gpu_seconds_lost=cost.gpu_seconds_lost if outcome == "resolved" else 0.0,
            )
            severity: Severity = "warning" if result.jobs_not_requeued or outcome == "aborted" else "info"
            await self._notify(f"closed_{outcome}", severity, render.closed_notice(outcome, p.node_state, result))
            rec.outcome = outcome
        self._stage = Stage.DONE
        workflow.upsert_search_attributes([sa.STAGE.value_set(Stage.DONE.value)])
        await self._act(act.RECORD_INCIDENT_METRICS, result, summary="record metrics")
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
            await self._post_event(stage, rec.outcome or stage.value)

    async def _post_event(self, stage: Stage, message: str) -> None:
        """Best effort: an Event tells the story, it must not hold up the remediation (during an
        apiserver outage the cordon and eviction are retried; the Events are not)."""
        assert self._kube is not None
        reason = "Gpuheal" + "".join(w.capitalize() for w in stage.value.split("_"))
        event = KubeEvent(node=self._kube, reason=reason, message=message)
        try:
            await self._act(act.POST_NODE_EVENT, event, summary=f"event {reason}", attempts=3)
        except ActivityError as err:
            workflow.logger.warning("could not post Event %s on %s: %s", reason, self._kube.kube_node, err.cause)

    async def _act(
        self,
        activity: Activity[I, O],
        arg: I,
        *,
        summary: str,
        timeout: timedelta = SHORT,
        heartbeat: timedelta | None = None,
        attempts: int | None = None,
    ) -> O:
        """Run one activity with the project's timeouts and retry policy (summary shows in the UI)."""
        retry = RETRY
        if attempts is not None:
            retry = RetryPolicy(
                initial_interval=RETRY.initial_interval,
                maximum_interval=RETRY.maximum_interval,
                maximum_attempts=attempts,
                non_retryable_error_types=RETRY.non_retryable_error_types,
            )
        result: O = await workflow.execute_activity(
            activity.name,
            arg,
            result_type=activity.output,
            start_to_close_timeout=timeout,
            heartbeat_timeout=heartbeat,
            retry_policy=retry,
            summary=summary,
        )
        return result

    @property
    def _provider_timeout(self) -> timedelta:
        """A provider may wait up to provider_timeout_s (and heartbeats meanwhile): its activity
        gets that plus a margin, so the provider's own timeout always fires first."""
        return timedelta(seconds=self._input.settings.provider_timeout_s + 60)

    async def _notify(self, event: str, severity: Severity, message: str) -> None:
        note = Notification(
            incident_id=self._ref.incident_id,
            event=event,
            severity=severity,
            message=message,
            node=self._ref.node,
            cluster=self._ref.cluster,
        )
        await self._act(act.NOTIFY_OPERATORS, note, summary=f"notify: {event}")

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
        if self._action is not None and self._stage in ESCALATABLE:
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
