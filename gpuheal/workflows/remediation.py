"""GpuRemediation: one durable workflow per failed node.

Thin and deterministic: decisions come from gpuheal.core.policy and gpuheal.core.job_policy (pure
functions), words from gpuheal.core.render, and every external action is an activity called
through its typed reference (workflows/activity.py), so this module never loads a Slurm,
Kubernetes or HTTP client. The incident's state is one model (workflows/incident/state.py); the
coordinator's negotiation, the job ledger and borrowing are helpers beside it. `run` calls the
stages in order, one method each:

  triage (+ admission by the cluster's coordinator) -> [observe] -> [held] -> [drain, approval]
         -> notify | drain | protect_progress (side by side) -> requeue -> [evict] -> repair_or_replace
         [-> borrow, awaiting_capacity, give_back] -> verify_resume -> return_to_service -> close

The coordinator (workflows/fleet.py) admits the incident and grants it capacity before it takes
the node out of service; a held incident waits in `held`, in line. In observe mode the incident
records what it would do and touches nothing. protect_progress asks only the jobs that said they
handle a signal to checkpoint; requeue hands every job on the node to its job recovery
(workflows/job_recovery.py); verify_resume collects their answers. When policy asks for a human,
the node is drained first (containment) and the workflow waits for `approve` / `abort`. No
capacity for a replacement is a stage with a bound, then a named outcome (`no_capacity`); a
coordinator that does not answer is one too (`not_granted`, workflows/incident/holding.py).
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

from gpuheal.workflows.activity import run as act_run
from gpuheal.workflows.activity import side_by_side
from gpuheal.workflows.incident import approval, capacity, evidence, follow_up, holding, jobs, ladder, node, replacing
from gpuheal.workflows.incident.ledger import not_back
from gpuheal.workflows.incident.result import result_for
from gpuheal.workflows.incident.state import IncidentState
from gpuheal.workflows.incident.timeline import in_stage, index_report, notify, set_action

with workflow.unsafe.imports_passed_through():
    from gpuheal.activities import interface as act
    from gpuheal.core import job_policy, policy, render
    from gpuheal.core import messages as m
    from gpuheal.core import search_attributes as sa
    from gpuheal.core.errors import NODE_NOT_IN_SERVICE, UNKNOWN_NODE
    from gpuheal.core.fleet import budget
    from gpuheal.core.fleet.models import GrantNotice
    from gpuheal.core.jobs import JobRecoveryResult
    from gpuheal.core.models.base import ActionClass, NodeState, Outcome, Severity, Stage
    from gpuheal.core.models.incident import Decision, RecordedDecision, RemediationInput
    from gpuheal.core.models.kubernetes import MapNodeRequest
    from gpuheal.core.models.report import HealthReport
    from gpuheal.core.models.result import RemediationResult, RemediationStatus
    from gpuheal.core.models.slurm import NodeRef

# Incidents before this release told, checkpointed and drained one after another, the drain last.
EARLY_STEPS_SIDE_BY_SIDE = "notice-drain-and-checkpoint-side-by-side"
# Stages during which a more severe report still changes what the incident will do.
ESCALATABLE = frozenset({Stage.HELD, Stage.APPROVAL, Stage.NOTIFY, Stage.PROTECT, Stage.DRAIN, Stage.REQUEUE})


@workflow.defn(name=m.INCIDENT.name)
class GpuRemediationWorkflow:
    @workflow.init
    def __init__(self, inp: RemediationInput) -> None:
        ref = NodeRef(cluster=inp.report.cluster, node=inp.report.node, incident_id=workflow.info().workflow_id)
        told = follow_up.notice_key(inp, workflow.info())
        self._s = IncidentState(ref=ref, reports=[inp.report, *inp.also], notice_key=told)

    # --- run: the stages in order ---------------------------------------------------------

    @workflow.run
    async def run(self, inp: RemediationInput) -> RemediationResult:
        result = await self._remediate()
        if follow_up.due(self._s):  # a more severe report the plan could not take in
            follow_up.continue_as_follow_up(self._s)
        return result

    async def _remediate(self) -> RemediationResult:
        s = self._s
        action = await self._triage()
        if s.earlier is not None:
            s.node_at = render.replaced_earlier_state(s.earlier)
            return await self._close("already_replaced", render.replaced_earlier(s.earlier))
        if s.not_in_service is not None:  # nothing held: it was not admitted
            return await self._close("not_in_service", s.not_in_service)
        if action == ActionClass.IGNORE:
            s.planned = True
            return await self._close("ignored", s.reason())
        if s.observing:
            return await self._observe(action)
        plan = policy.plan_for(action)
        asked = plan.drain or plan.repair is not None
        if asked and (ended := await self._go(capacity.request)) is not None:
            return ended
        if budget.needs_approval(s.cluster_policy.mode, s.current_action(), s.cluster_policy.approval):
            decision = await self._approval_gate(s.current_action())
            if decision.verdict == "abort":
                return await self._close_aborted(decision)
        await self._early_steps(plan.drain)
        await capacity.admit_again_if_hardware(s)  # a report saying hardware joined an application fault
        await ladder.climb(s)  # an application fault one too many for its GPU: a burn-in
        plan = ladder.plan_for(s)  # a later report may have escalated it
        s.planned = True  # from here a more severe report is a follow-up's (follow_up.py)
        asked = asked or ladder.burning_in(s)  # (the ladder's burn-in was granted as it was decided)
        if (plan.drain or plan.repair is not None) and not asked and workflow.patched(capacity.ESCALATION_ASKS):
            if (ended := await self._go(capacity.request)) is not None:  # a drain takes a grant, however it came
                return ended
        if plan.drain and s.drain is None:
            await self._drain(s.drain_why())
        if plan.requeue:
            await self._requeue(plan.avoid_failed_node)
        if s.kube is not None and plan.drain and (aborted := await self._evict_pods()) is not None:
            return await self._close("aborted", aborted.reason)
        if plan.repair is not None:
            if (ended := await self._go(capacity.confirm)) is not None:
                return ended
            if not await replacing.repair_or_replace(s, plan.repair):
                s.node_at = render.no_capacity_state(s.ref.node, s.jobs.accounts(s.ref.incident_id))
                if s.unvalidated is not None:  # a spare came, but its burn-in said nothing
                    assert s.replacement is not None
                    return await self._close("unvalidated", f"{s.reason()}; {s.replacement.no_capacity}")
                return await self._close("no_capacity", f"{s.reason()}; {render.no_replacement(s.rejected)}")
        if s.jobs.recoveries:
            await self._verify_resume()
        if (late := s.follow_up) is not None:  # the follow-up takes the node as it is, now
            s.node_at = render.kept_for_follow_up(s.ref.node, s.drain)
            return await self._close("followed_up", render.followed_up(s.reason(), late))
        await self._return_to_service(plan.repair)
        if s.node_at.state == NodeState.FAILED_VALIDATION:
            return await self._close("failed_validation", f"{s.reason()}; {s.node_at.detail}")
        if s.node_at.state == NodeState.UNVALIDATED or s.unvalidated is not None:
            return await self._close("unvalidated", f"{s.reason()}; {s.node_at.detail}")
        if s.node_at.state == NodeState.AWAITING_REPLACEMENT and workflow.patched(node.NO_SPARE_IS_NOT_RESOLVED):
            return await self._close("no_capacity", f"{s.reason()}; {s.node_at.detail}")
        return await self._close("resolved", s.reason())

    # --- stages ----------------------------------------------------------------------------

    async def _triage(self) -> ActionClass:
        """Fail fast on a node we cannot remediate, before anything is touched; then the cluster
        admits the incident: its policy, and what it knows of the node (a repeat offender)."""
        s = self._s
        async with in_stage(s, Stage.TRIAGE) as rec:
            try:
                await act_run(act.LOOK_UP_SLURM_NODE, s.ref, summary="look up Slurm node")
                verdict = policy.triage_all(s.reports)
                if verdict.action != ActionClass.IGNORE:
                    await capacity.admit(s, verdict.action, self._s.first_report.describe(), with_request=True)
                k8s = s.settings.kubernetes
                if k8s is not None:
                    req = MapNodeRequest(ref=s.ref, node_label=k8s.node_label)
                    s.kube = await act_run(act.MAP_KUBE_NODE, req, summary="find the Kubernetes node")
            except ActivityError as err:
                cause = err.cause if isinstance(err.cause, ApplicationError) else None
                if cause is not None and cause.type in (UNKNOWN_NODE, NODE_NOT_IN_SERVICE):
                    found = await act_run(act.FIND_EARLIER_REPLACEMENT, s.ref, summary="did gpuheal replace this node?")
                    s.earlier = found.earlier
                if s.earlier is not None:  # a late report: a named outcome, nothing touched
                    rec.outcome = render.replaced_earlier(s.earlier)
                    return s.current_action()
                if cause is not None and cause.type == NODE_NOT_IN_SERVICE:  # a spare, or one joining
                    s.not_in_service = rec.outcome = cause.message
                    return s.current_action()
                msg = cause.message if cause is not None else str(err)
                if capacity.may_hold_from_admission(s):  # granted or in line with it, maybe: given back
                    await capacity.release(s, attempts=3)
                raise ApplicationError(f"cannot remediate {self._s.first_report.describe()}: {msg}") from err
            action = s.current_action()
            set_action(s, action)
            rec.outcome = render.triaged(action, s.reason()) + render.admitted(s.policy, s.placement)
        return action

    async def _observe(self, action: ActionClass) -> RemediationResult:
        """Observe mode: the plan, as the actions it would take; nothing is touched."""
        s = self._s
        async with in_stage(s, Stage.OBSERVE) as rec:
            jobs = await act_run(act.LIST_JOBS_ON_NODE, s.ref, summary="find jobs on node (read only)")
            s.jobs.found(jobs.jobs)
            asks = {j.job_id: job_policy.checkpoint_ask(j) for j in jobs.jobs}
            would = render.would_do(s.ref.node, policy.plan_for(action), jobs.jobs, asks, s.kube, s.reason())
            rec.outcome = "; ".join(would)
        s.node_at = render.OBSERVED
        return await self._close("observed", f"observe mode: {s.reason()}")

    async def _go(self, ask: capacity.Ask) -> RemediationResult | None:
        """None once granted (at once, or after waiting in line in `held`); otherwise the close:
        never granted, dismissed into its domain incident, or the coordinator did not answer."""
        answer = await ask(self._s)
        if isinstance(answer, capacity.Unanswered):
            return await self._close(*await holding.unanswered(self._s, answer))
        if await holding.granted(self._s, answer, self._drain):
            return None
        return await self._close(*await holding.never_granted(self._s))

    async def _approval_gate(self, action: ActionClass) -> RecordedDecision:
        if policy.plan_for(action).drain:  # the failure named: a drain for another is seen as one
            await self._drain(f"contained while awaiting approval: {self._s.drain_why()}")
        return await self._await_decision()

    async def _close_aborted(self, decision: RecordedDecision) -> RemediationResult:
        await jobs.account_for_untouched(self._s)
        await notify(self._s, "aborted", "warning", render.abort_notice(decision))
        self._s.node_at = render.aborted_node_state(self._s.ref.node, self._s.drain)
        return await self._close("aborted", decision.reason)

    async def _early_steps(self, drain: bool) -> None:
        """The notice, the drain and the checkpoint ask at once: none needs another's answer. A
        drain leaves running jobs running; it keeps new ones off the failing node while the old
        ones checkpoint (one landing before it is found by the requeue's second look). A plan
        that drains only once escalated drains after, as before."""
        s = self._s
        if not workflow.patched(EARLY_STEPS_SIDE_BY_SIDE):
            await self._notify_remediating()
            await self._protect_progress()
            return
        s.escalates_until_planned = True
        # A NoExecute taint evicts the node's pods at once (slurmd's too, on Slurm on Kubernetes):
        # that cordon waits for the checkpoints. A drain and a NoSchedule cordon go beside them.
        k8s = s.settings.kubernetes
        cordon_after = k8s is not None and k8s.no_execute
        drains = [self._drain(s.drain_why(), cordon=not cordon_after)] if drain and s.drain is None else []
        await side_by_side(self._notify_remediating(), *drains, self._protect_progress())
        if drains and cordon_after:
            await self._cordon()

    async def _notify_remediating(self) -> None:
        async with in_stage(self._s, Stage.NOTIFY) as rec:
            rec.outcome = "operators notified"
            msg = render.remediating(self._s.first_report, self._s.current_action(), self._s.reason())
            await notify(self._s, "remediating", "critical", msg)

    async def _protect_progress(self) -> None:
        async with in_stage(self._s, Stage.PROTECT) as rec:
            rec.outcome = await jobs.protect_progress(self._s)

    async def _drain(self, why: str, cordon: bool = True) -> None:
        """Slurm first (eviction alone tells Slurm nothing), then the Kubernetes cordon."""
        async with in_stage(self._s, Stage.DRAIN) as rec:
            rec.outcome = await node.drain_in_slurm(self._s, why)
        if cordon:
            await self._cordon()

    async def _cordon(self) -> None:
        s, k8s = self._s, self._s.settings.kubernetes
        if s.kube is not None and k8s is not None and s.cordon is None:
            async with in_stage(s, Stage.CORDON) as rec:
                rec.outcome = await node.cordon(s, k8s)

    async def _requeue(self, avoid_failed_node: bool) -> None:
        async with in_stage(self._s, Stage.REQUEUE) as rec:
            rec.outcome = await jobs.requeue(self._s, avoid_failed_node)

    async def _evict_pods(self) -> RecordedDecision | None:
        """Pods a PDB still protects at the deadline wait for a human. Returns the human's
        decision when it is to abort."""
        s = self._s
        async with in_stage(s, Stage.EVICT) as rec:
            evicted = await node.evict(s)
            rec.outcome = render.evicted(evicted)
        if not evicted.blocked:
            return None
        decision = await self._await_decision(
            f"pods {list(evicted.blocked)} are still protected by a PodDisruptionBudget"
        )
        if decision.verdict != "abort":
            return None
        s.node_at = render.blocked_node_state(evicted.blocked)
        return decision

    async def _verify_resume(self) -> None:
        async with in_stage(self._s, Stage.VERIFY) as rec:
            rec.outcome = await jobs.collect_answers(self._s)

    async def _return_to_service(self, repair: ActionClass | None) -> None:
        """Resume a repaired node only after its health check passes; a replaced node leaves."""
        async with in_stage(self._s, Stage.RETURN) as rec:
            s = self._s
            s.node_at = await (ladder.after_burn_in(s) if ladder.burning_in(s) else node.back_in_service(s, repair))
            rec.outcome = self._s.node_at.detail

    async def _await_decision(self, why: str = "policy asks for a human") -> RecordedDecision:
        s = self._s
        approval_policy = s.cluster_policy.approval
        async with in_stage(s, Stage.APPROVAL) as rec:
            msg = render.approval_needed(
                s.first_report, s.action, why, approval_policy.timeout_s, approval_policy.default_on_timeout
            )
            approval.open(s)  # before the notice: a decision may come as soon as it is read
            await notify(s, "approval_needed", "warning", msg)
            decision = await approval.wait(s)
            rec.outcome = render.decided(decision)
            return decision

    async def _close(self, outcome: Outcome, reason: str) -> RemediationResult:
        s = self._s
        async with in_stage(s, Stage.CLOSE) as rec:
            await evidence.for_the_vendor(s)
            result = result_for(s, outcome, reason)
            severity: Severity = "warning" if outcome != "resolved" or not_back(result.jobs) else "info"
            await notify(s, f"closed_{outcome}", severity, render.closed_notice(outcome, s.node_at.detail, result))
            rec.outcome = outcome
        s.stage = Stage.DONE
        workflow.upsert_search_attributes([sa.STAGE.value_set(Stage.DONE.value)])
        await capacity.release(s)
        await act_run(act.RECORD_INCIDENT_METRICS, result, summary="record metrics")
        s.result = result
        await workflow.wait_condition(workflow.all_handlers_finished)
        return result

    # --- signals, updates, queries ---------------------------------------------------------

    @workflow.signal(name=m.INCIDENT_REPORT.name)
    def report(self, report: HealthReport) -> None:
        """Another report for this node (signal-with-start delivers the first one again)."""
        s = self._s
        if report in s.reports:
            s.duplicates += 1
            return
        s.reports.append(report)
        index_report(s, report)
        # After the plan: never swallowed, a follow-up run acts on it (and this run keeps its action).
        follows = follow_up.outgrows(s) and workflow.patched(follow_up.LATE_SEVERE_FOLLOWS)
        # Before that, a more severe report escalates the remediation.
        escalatable = s.stage in ESCALATABLE or (s.escalates_until_planned and not s.planned)
        if s.action is not None and escalatable and not follows:
            escalated = policy.triage_all(s.reports).action
            if escalated != s.action:
                set_action(s, escalated)
        if follows:
            s.follow_up = report  # the first report that outgrew the plan: the follow-up starts from it

    @workflow.signal(name=m.INCIDENT_CAPACITY.name)
    def capacity(self, notice: GrantNotice) -> None:
        """The coordinator: a held incident may go now (or its domain incident dismissed it)."""
        self._s.grant = notice

    @workflow.signal(name=m.INCIDENT_JOB_RECOVERED.name)
    def job_recovered(self, result: JobRecoveryResult) -> None:
        """A job recovery's answer for one of this incident's jobs."""
        self._s.jobs.answered(result)

    @workflow.update(name=m.INCIDENT_GIVE_BACK.name)
    def give_back(self, d: Decision) -> str:
        """Demand shifted back to inference: return the borrowed node now (its jobs move off)."""
        s = self._s
        s.give_back_by = d
        assert s.borrowed is not None
        return f"{s.borrowed.node} goes back to pool {s.borrowed.from_pool} ({d.operator}: {d.reason})"

    @give_back.validator
    def _validate_give_back(self, d: Decision) -> None:
        if self._s.borrowed is None or self._s.stage != Stage.AWAITING_CAPACITY:
            raise ValueError(f"incident has no borrowed node to give back (stage: {self._s.stage.value})")

    def _check_decidable(self, d: Decision) -> None:
        refusal = approval.refusal(self._s)
        if refusal is not None:
            raise ValueError(refusal)

    @workflow.update(name=m.INCIDENT_APPROVE.name)
    def approve(self, d: Decision) -> str:
        return approval.record(self._s, "approve", d)

    @approve.validator
    def _validate_approve(self, d: Decision) -> None:
        self._check_decidable(d)

    @workflow.update(name=m.INCIDENT_ABORT.name)
    def abort(self, d: Decision) -> str:
        return approval.record(self._s, "abort", d)

    @abort.validator
    def _validate_abort(self, d: Decision) -> None:
        self._check_decidable(d)

    @workflow.signal(name=m.INCIDENT_APPROVE_SIGNAL.name)
    def approve_signal(self, d: Decision) -> None:
        """Fire-and-forget approve; ignored unless the incident awaits a decision."""
        if approval.refusal(self._s) is None:
            approval.record(self._s, "approve", d)

    @workflow.signal(name=m.INCIDENT_ABORT_SIGNAL.name)
    def abort_signal(self, d: Decision) -> None:
        if approval.refusal(self._s) is None:
            approval.record(self._s, "abort", d)

    @workflow.query(name=m.INCIDENT_STATUS.name)
    def status(self) -> RemediationStatus:
        s = self._s
        return RemediationStatus(
            incident_id=workflow.info().workflow_id,
            stage=s.stage,
            action=s.action,
            awaiting_approval=s.awaiting_approval,
            held=s.held_for or None,
            stages=s.stages,
            reports_received=len(s.reports) + s.duplicates,
            done=s.done,
            result=s.result,
        )
