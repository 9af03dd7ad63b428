"""GpuRemediation: one durable workflow per failed node.

Thin and deterministic: decisions come from gpuheal.core.policy and gpuheal.core.job_policy (pure
functions), words from gpuheal.core.render, and every external action is an activity called through
its typed reference (workflows/activity.py), so this module never loads a Slurm, Kubernetes or
HTTP client. The stages, in order, each a method below:

  triage (+ admission by the cluster's coordinator) -> [observe] -> [held] -> [drain, approval]
         -> notify -> protect_progress -> drain -> requeue -> [evict] -> repair_or_replace
         [-> borrow, awaiting_capacity, give_back] -> verify_resume -> return_to_service -> close

The cluster's coordinator (workflows/fleet.py) admits the incident (the cluster's policy and its
version: mode, approval, budget; repeat offenders; the breaker; the node's domain) and grants it
capacity before it takes the node out of service; a held incident waits in `held`, in line.
In observe mode the incident records what it would do and touches nothing.

protect_progress asks only the jobs that said they handle a signal to checkpoint, and waits for
their confirmation (or the grace). requeue hands every job that was on the node to its job
recovery (workflows/job_recovery.py), which requeues it once however many of its nodes failed;
verify_resume collects their answers. Every job that was on the node is in the result, with its
fate. When policy asks for a human, the node is drained first (containment) and the workflow
waits for `approve` / `abort`. No capacity for a replacement is a stage with a bound, then a
named outcome (`no_capacity`), never a failed workflow.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

from gpuheal.workflows.activity import run as act_run

with workflow.unsafe.imports_passed_through():
    from gpuheal.activities import interface as act
    from gpuheal.core import fleet, job_policy, policy, render
    from gpuheal.core import search_attributes as sa
    from gpuheal.core.errors import UNKNOWN_NODE
    from gpuheal.core.fleet import (
        CAPACITY_SIGNAL,
        AdmitAsk,
        CapacityDecision,
        CapacityRequest,
        FleetPolicy,
        GrantNotice,
        Placement,
        ReleaseRequest,
        VersionedPolicy,
    )
    from gpuheal.core.jobs import RECOVERED_SIGNAL, JobRecoveryResult, RecoveryJoin
    from gpuheal.core.models import (
        ActionClass,
        BorrowedNode,
        BorrowRequest,
        CheckpointOutcome,
        CheckpointRequest,
        CheckpointWait,
        CordonRequest,
        CordonResult,
        Decision,
        DrainRequest,
        DrainResult,
        EarlierReplacement,
        EvictRequest,
        HealthReport,
        JobAccount,
        JobFate,
        JobList,
        JobSnapshot,
        KubeEvent,
        KubeNodeRef,
        MapNodeRequest,
        NodeEmptyWait,
        NodeRef,
        Notification,
        Outcome,
        RecordedDecision,
        RemediationInput,
        RemediationResult,
        RemediationSettings,
        RemediationStatus,
        RepairRequest,
        ReplacementResult,
        Severity,
        Stage,
        StageRecord,
        UnrequeuedJob,
        Verdict,
    )

PROVIDER_HEARTBEAT = timedelta(seconds=60)
# Stages during which a more severe report still changes what the incident will do.
ESCALATABLE = frozenset({Stage.HELD, Stage.APPROVAL, Stage.NOTIFY, Stage.PROTECT, Stage.DRAIN, Stage.REQUEUE})


@dataclass
class Progress:
    """What the incident has done so far: the facts its close reports."""

    drain: DrainResult | None = None
    affected: list[JobSnapshot] = field(default_factory=list)  # on the node when the incident began
    checkpoints: dict[int, CheckpointOutcome] = field(default_factory=dict)
    accounts: dict[int, JobAccount] = field(default_factory=dict)  # settled without a recovery
    recoveries: dict[str, int] = field(default_factory=dict)  # recovery id -> its job, in order
    recovered: dict[str, JobRecoveryResult] = field(default_factory=dict)  # their answers
    replacement: ReplacementResult | None = None
    borrowed: BorrowedNode | None = None
    capacity_back_at: datetime | None = None
    node_state: str = "untouched"


@workflow.defn(name=policy.REMEDIATION_WORKFLOW)
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
        self._give_back_by: Decision | None = None
        # Set when the coordinator admits the incident (triage): the worker's settings, the
        # cluster's policy (recorded in history by the admission's result) and where the node sits.
        self._settings = RemediationSettings()
        self._policy: VersionedPolicy | None = None
        self._placement: Placement | None = None
        self._repeat: str | None = None
        self._granted = False
        self._grant: GrantNotice | None = None
        self._held_for = ""
        self._earlier: EarlierReplacement | None = None  # a late report for a node gpuheal replaced

    # --- run: the stages in order ---------------------------------------------------------

    @workflow.run
    async def run(self, inp: RemediationInput) -> RemediationResult:
        action = await self._triage()
        if self._earlier is not None:
            self._p.node_state = render.replaced_earlier_state(self._earlier)
            return await self._close("already_replaced", render.replaced_earlier(self._earlier))
        if action == ActionClass.IGNORE:
            return await self._close("ignored", self._reason())
        if self._cluster_policy.mode == "observe":
            return await self._observe(action)
        plan = policy.plan_for(action)
        if plan.drain or plan.repair is not None:
            stopped = await self._request_capacity()
            if stopped is not None:
                return stopped
        if fleet.needs_approval(self._cluster_policy.mode, self._current_action(), self._cluster_policy.approval):
            decision = await self._approval_gate(self._current_action())
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
            stopped = await self._confirm_capacity()
            if stopped is not None:
                return stopped
            if not await self._repair_or_replace(plan.repair):
                return await self._close_without_capacity()
        if self._p.recoveries:
            await self._verify_resume()
        await self._return_to_service(plan.repair)
        return await self._close("resolved", self._reason())

    # --- stages ----------------------------------------------------------------------------

    async def _triage(self) -> ActionClass:
        """Fail fast on a node we cannot remediate, before anything is touched; then the cluster
        admits the incident: its policy, and what it knows of the node (a repeat offender)."""
        async with self._in_stage(Stage.TRIAGE) as rec:
            try:
                await act_run(act.LOOK_UP_SLURM_NODE, self._ref, summary="look up Slurm node")
                verdict = policy.triage_all(self._reports)
                if verdict.action != ActionClass.IGNORE:
                    await self._admit(verdict.action)
                k8s = self._settings.kubernetes
                if k8s is not None:
                    req = MapNodeRequest(ref=self._ref, node_label=k8s.node_label)
                    self._kube = await act_run(act.MAP_KUBE_NODE, req, summary="find the Kubernetes node")
            except ActivityError as err:
                cause = err.cause if isinstance(err.cause, ApplicationError) else None
                if cause is not None and cause.type == UNKNOWN_NODE:
                    self._earlier = await self._earlier_replacement()
                if self._earlier is not None:  # a late report: a named outcome, nothing touched
                    rec.outcome = render.replaced_earlier(self._earlier)
                    return self._current_action()
                msg = cause.message if cause is not None else str(err)
                raise ApplicationError(f"cannot remediate {self._input.report.describe()}: {msg}") from err
            action = self._current_action()
            self._set_action(action)
            rec.outcome = render.triaged(action, self._reason()) + render.admitted(self._policy, self._placement)
        return action

    async def _earlier_replacement(self) -> EarlierReplacement | None:
        """Slurm has no such node in service: did gpuheal replace it in an earlier incident?"""
        found = await act_run(act.FIND_EARLIER_REPLACEMENT, self._ref, summary="did gpuheal replace this node?")
        return found.earlier

    async def _admit(self, action: ActionClass) -> None:
        report = self._input.report
        ask = AdmitAsk(
            incident_id=self._ref.incident_id,
            run_id=workflow.info().first_execution_run_id,
            cluster=self._ref.cluster,
            node=self._ref.node,
            action=action,
            what=report.describe(),
            gpu_uuids=tuple(r.gpu_uuid for r in self._reports if r.gpu_uuid),
        )
        answer = await act_run(act.ADMIT_INCIDENT, ask, summary="admitted by the cluster's coordinator")
        self._settings, self._placement = answer.settings, answer.placement
        self._policy = answer.admission.policy
        self._repeat = answer.admission.repeat_offender

    @property
    def _cluster_policy(self) -> FleetPolicy:
        return self._policy.policy if self._policy is not None else FleetPolicy()

    async def _observe(self, action: ActionClass) -> RemediationResult:
        """Observe mode: the plan, as the actions it would take; nothing is touched."""
        async with self._in_stage(Stage.OBSERVE) as rec:
            jobs = await act_run(act.LIST_JOBS_ON_NODE, self._ref, summary="find jobs on node (read only)")
            self._p.affected = list(jobs.jobs)
            asks = {j.job_id: job_policy.checkpoint_ask(j) for j in jobs.jobs}
            would = render.would_do(
                self._ref.node, policy.plan_for(action), jobs.jobs, asks, self._kube, self._reason()
            )
            rec.outcome = "; ".join(would)
        self._p.node_state = "untouched (observe mode)"
        return await self._close("observed", f"observe mode: {self._reason()}")

    async def _request_capacity(self) -> RemediationResult | None:
        """Ask the coordinator before taking capacity out of service; held, wait in line (with
        the containment the policy says). Returns the closed result if it never goes."""
        req = self._capacity_request()
        decision = await act_run(act.REQUEST_CAPACITY, req, summary="ask the coordinator for capacity")
        self._granted = decision.granted
        return None if decision.granted else await self._held(decision)

    async def _confirm_capacity(self) -> RemediationResult | None:
        """Before replacing: the grant stands unless the breaker tripped or the domain escalated."""
        req = self._capacity_request()
        decision = await act_run(act.CONFIRM_CAPACITY, req, summary="the grant still stands?")
        self._granted = decision.granted
        return None if decision.granted else await self._held(decision)

    def _capacity_request(self) -> CapacityRequest:
        assert self._placement is not None
        return CapacityRequest(
            cluster=self._ref.cluster,
            incident_id=self._ref.incident_id,
            placement=self._placement,
            action=self._current_action(),
        )

    async def _held(self, decision: CapacityDecision) -> RemediationResult | None:
        limit = self._cluster_policy.max_hold_s
        async with self._in_stage(Stage.HELD) as rec:
            self._held_for = f"{decision.reason} (number {decision.position} in line)"
            await self._notify("held", "warning", render.held(self._input.report, self._held_for))
            if self._cluster_policy.containment_while_held == "drain" and self._p.drain is None:
                await self._drain("contained while held (nothing new lands on it)")
                self._stage = Stage.HELD
            self._grant = None
            try:
                await workflow.wait_condition(
                    lambda: self._grant is not None,
                    timeout=timedelta(seconds=limit),
                    timeout_summary="held: capacity never freed within the bound",
                )
            except TimeoutError:
                rec.outcome = f"not granted within {limit:g} s: {self._held_for}"
            else:
                assert self._grant is not None
                rec.outcome = self._grant.reason
            self._held_for = ""
        if self._grant is not None and self._grant.granted:
            self._granted = True
            return None
        await self._account_for_untouched_jobs()
        if self._grant is not None:  # dismissed: its domain incident handles the node
            self._p.node_state = render.escalated_state(self._ref.node, self._p.drain, self._grant.reason)
            return await self._close("escalated", self._grant.reason)
        self._p.node_state = render.aborted_node_state(self._ref.node, self._p.drain)
        return await self._close("not_granted", rec.outcome)

    async def _approval_gate(self, action: ActionClass) -> RecordedDecision:
        if policy.plan_for(action).drain:
            await self._drain("contained while awaiting approval")
        return await self._await_decision()

    async def _account_for_untouched_jobs(self) -> None:
        """Stopped before the jobs were looked at: they are accounted for, untouched."""
        if not self._p.affected:
            jobs = await act_run(act.LIST_JOBS_ON_NODE, self._ref, summary="find jobs on node")
            self._p.affected = list(jobs.jobs)

    async def _close_aborted(self, decision: RecordedDecision) -> RemediationResult:
        await self._account_for_untouched_jobs()
        await self._notify("aborted", "warning", render.abort_notice(decision))
        self._p.node_state = render.aborted_node_state(self._ref.node, self._p.drain)
        return await self._close("aborted", decision.reason)

    async def _notify_remediating(self) -> None:
        async with self._in_stage(Stage.NOTIFY) as rec:
            rec.outcome = "operators notified"
            msg = render.remediating(self._input.report, self._current_action(), self._reason())
            await self._notify("remediating", "critical", msg)

    async def _protect_progress(self) -> None:
        """The jobs on the node now are the incident's to account for. Those that said they
        handle a signal are asked to checkpoint, and waited for until each confirms (a checkpoint
        newer than the signal) or the grace ends; the others are not signalled at all."""
        settings = self._settings
        async with self._in_stage(Stage.PROTECT) as rec:
            jobs = await act_run(act.LIST_JOBS_ON_NODE, self._ref, summary="find jobs on node")
            self._p.affected = list(jobs.jobs)
            asks = [a for a in (job_policy.checkpoint_ask(j) for j in jobs.jobs) if a is not None]
            self._p.checkpoints = {j.job_id: render.not_signalled(j) for j in jobs.jobs}
            if asks:
                req = CheckpointRequest(node=self._ref.node, asks=tuple(asks))
                sent = await act_run(
                    act.REQUEST_CHECKPOINT, req, summary="ask jobs to checkpoint (the signal each asked for)"
                )
                wait = CheckpointWait(
                    asks=sent.asks,
                    deadline_at=workflow.now().timestamp() + settings.checkpoint_grace_s,
                    unconfirmed_wait_s=min(settings.checkpoint_unconfirmed_wait_s, settings.checkpoint_grace_s),
                )
                confirmed = await act_run(
                    act.WAIT_FOR_CHECKPOINTS,
                    wait,
                    summary="wait for each job to confirm a checkpoint (or the grace)",
                    timeout=timedelta(seconds=settings.checkpoint_grace_s + 60),
                    heartbeat=timedelta(seconds=30),
                )
                self._p.checkpoints.update({o.job_id: o for o in confirmed.outcomes})
            rec.outcome = render.checkpoints(len(jobs.jobs), [self._p.checkpoints[j.job_id] for j in jobs.jobs])

    async def _drain(self, why: str) -> None:
        """Slurm first (eviction alone tells Slurm nothing), then the Kubernetes cordon."""
        async with self._in_stage(Stage.DRAIN) as rec:
            req = DrainRequest(node=self._ref, reason=policy.drain_reason(self._ref.incident_id, why))
            self._p.drain = await act_run(act.DRAIN_SLURM_NODE, req, summary=f"drain {self._ref.node}")
            rec.outcome = render.drained(self._p.drain, why)
        k8s = self._settings.kubernetes
        if self._kube is not None and k8s is not None and self._cordon is None:
            async with self._in_stage(Stage.CORDON) as rec:
                cordon = CordonRequest(node=self._kube, no_execute=k8s.no_execute)
                self._cordon = await act_run(
                    act.CORDON_AND_TAINT_NODE, cordon, summary=f"cordon {self._kube.kube_node}"
                )
                rec.outcome = render.cordoned(self._cordon, k8s.no_execute)

    async def _requeue(self, avoid_failed_node: bool) -> None:
        """Every job that was on the node: still there -> its job recovery (which requeues it
        once, whichever incidents join); gone -> how it ended (and a failed, requeueable one is
        recovered too, not forgotten)."""
        async with self._in_stage(Stage.REQUEUE) as rec:
            live = await act_run(act.LIST_JOBS_ON_NODE, self._ref, summary="find jobs on node")
            live_ids = {j.job_id for j in live.jobs}
            left = [j for j in self._p.affected if j.job_id not in live_ids]
            now = (
                await act_run(act.FIND_JOBS, JobList(jobs=tuple(left)), summary="how the others ended")
                if left
                else JobList()
            )
            now_by_id = {j.job_id: j for j in now.jobs}
            for job in [*live.jobs, *(j for j in left)]:
                current = now_by_id.get(job.job_id) if job.job_id not in live_ids else job
                if job.job_id not in live_ids and not job_policy.recoverable(job, current):
                    self._p.accounts[job.job_id] = job_policy.account_ended(
                        job, current, self._p.checkpoints.get(job.job_id)
                    )
                    continue
                await self._hand_over(job, avoid_failed_node)
            rec.outcome = render.handed_over(list(self._p.accounts.values()), list(self._p.recoveries))

    async def _hand_over(self, job: JobSnapshot, avoid_failed_node: bool, node: str = "", what: str = "") -> None:
        if job.job_id not in {j.job_id for j in self._p.affected}:
            self._p.affected.append(job)  # it started on the node after the protect stage
        join = RecoveryJoin(
            incident_id=self._ref.incident_id,
            cluster=self._ref.cluster,
            failed_node=node or self._ref.node,
            what=what or self._input.report.describe(),
            failure_at=self._input.report.observed_at,
            job=job,
            checkpoint=self._p.checkpoints.get(job.job_id),
            exclude_failed_node=avoid_failed_node,
        )
        handoff = await act_run(act.START_JOB_RECOVERY, join, summary=f"hand job {job.job_id} to its recovery")
        self._p.recoveries[handoff.recovery_id] = job.job_id
        if handoff.result is not None:  # it had already answered (a retried hand-over)
            self._p.recovered[handoff.recovery_id] = handoff.result

    async def _evict_pods(self) -> RemediationResult | None:
        """Evict through the Eviction API; pods a PDB still protects at the deadline wait for a
        human. Returns the closed result when the human aborts."""
        k8s, node = self._settings.kubernetes, self._kube
        assert k8s is not None and node is not None
        async with self._in_stage(Stage.EVICT) as rec:
            delete = k8s.on_pdb_timeout == "delete"
            req = EvictRequest(node=node, deadline_s=k8s.drain_deadline_s, delete_when_blocked=delete)
            evicted = await act_run(
                act.EVICT_PODS,
                req,
                summary=f"evict pods from {node.kube_node}",
                timeout=timedelta(seconds=k8s.drain_deadline_s + 60),
                heartbeat=timedelta(seconds=30),
            )
            rec.outcome = render.evicted(evicted)
        if not evicted.blocked:
            return None
        why = f"pods {list(evicted.blocked)} are still protected by a PodDisruptionBudget"
        decision = await self._await_decision(why)
        if decision.verdict != "abort":
            return None
        self._p.node_state = render.blocked_node_state(evicted.blocked)
        return await self._close("aborted", decision.reason)

    async def _repair_or_replace(self, repair: ActionClass) -> bool:
        """False: no replacement came within the capacity bound."""
        async with self._in_stage(Stage.REPAIR) as rec:
            if repair != ActionClass.REPLACE_NODE:
                done = await act_run(
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
                rec.outcome = (
                    render.replaced(self._p.replacement.new_node, self._ref.node)
                    if self._p.replacement.new_node
                    else self._p.replacement.no_capacity
                )
        if self._p.replacement is not None and self._p.replacement.new_node is None:
            settings = self._settings
            if settings.borrow is not None and self._kube is not None:
                await self._borrow()  # a bridge until the replacement comes
            got = await self._await_capacity()
            if self._p.borrowed is not None:
                await self._give_back()
            if not got:
                return False
        if self._p.capacity_back_at is None:
            self._p.capacity_back_at = workflow.now()
        return True

    async def _borrow(self) -> None:
        """No spare: take a node from the inference pool (never below its minimum) into Slurm."""
        policy_ = self._settings.borrow
        assert policy_ is not None and self._kube is not None
        async with self._in_stage(Stage.BORROW) as rec:
            req = BorrowRequest(incident_id=self._ref.incident_id, failed=self._kube, policy=policy_)
            got = await act_run(
                act.BORROW_INFERENCE_NODE,
                req,
                summary=f"borrow a node from pool {policy_.pool}",
                timeout=timedelta(seconds=req.deadline_s + 60),
                heartbeat=timedelta(seconds=30),
            )
            if got.node is None:
                rec.outcome = f"nothing to borrow from pool {policy_.pool}: {got.why}"
                return
            self._p.borrowed = BorrowedNode(incident_id=self._ref.incident_id, node=got.node, from_pool=got.from_pool)
            workflow.upsert_search_attributes([sa.BORROWED.value_set(got.node)])  # found by its node
            joined = await act_run(
                act.ADOPT_BORROWED_NODE,
                self._p.borrowed,
                summary=f"{got.node} joins Slurm",
                timeout=self._provider_timeout,
                heartbeat=PROVIDER_HEARTBEAT,
            )
            self._p.capacity_back_at = workflow.now()
            rec.outcome = render.borrowed(got, joined)
            await self._notify("borrowed", "warning", rec.outcome)

    async def _give_back(self) -> None:
        """The borrowed node goes back the way it came: drained, its jobs asked to checkpoint
        and moved off (each to its recovery), out of Slurm, back into its inference pool."""
        borrowed = self._p.borrowed
        assert borrowed is not None
        ref = NodeRef(cluster=self._ref.cluster, node=borrowed.node, incident_id=self._ref.incident_id)
        async with self._in_stage(Stage.GIVE_BACK) as rec:
            why = policy.drain_reason(self._ref.incident_id, "borrowed node goes back to inference")
            await act_run(act.DRAIN_SLURM_NODE, DrainRequest(node=ref, reason=why), summary=f"drain {borrowed.node}")
            jobs = await act_run(act.LIST_JOBS_ON_NODE, ref, summary=f"jobs on {borrowed.node}")
            for job in jobs.jobs:
                what = f"{borrowed.node} goes back to pool {borrowed.from_pool}"
                await self._hand_over(job, avoid_failed_node=True, node=borrowed.node, what=what)
            empty = NodeEmptyWait(node=borrowed.node, deadline_at=workflow.now().timestamp() + 300)
            left = await act_run(
                act.WAIT_FOR_NODE_EMPTY,
                empty,
                summary=f"wait for the jobs to leave {borrowed.node}",
                timeout=timedelta(seconds=360),
                heartbeat=timedelta(seconds=30),
            )
            released = await act_run(act.RELEASE_BORROWED_NODE, borrowed, summary=f"{borrowed.node} leaves Slurm")
            back = await act_run(act.GIVE_BACK_NODE, borrowed, summary=f"{borrowed.node} back to {borrowed.from_pool}")
            rec.outcome = render.given_back(borrowed.node, len(jobs.jobs), left, released, back, self._give_back_by)

    async def _await_capacity(self) -> bool:
        """No spare now: say so once, retry on a slow cadence, give up at the bound."""
        settings = self._settings
        started = workflow.now()
        async with self._in_stage(Stage.AWAITING_CAPACITY) as rec:
            assert self._p.replacement is not None
            why = self._p.replacement.no_capacity
            await self._notify(
                "awaiting_capacity", "warning", render.awaiting_capacity(why, 0, settings.capacity_wait_s)
            )
            while (workflow.now() - started).total_seconds() < settings.capacity_wait_s:
                try:  # the slow cadence; a borrowed node's early give-back ends the wait
                    await workflow.wait_condition(
                        lambda: self._give_back_by is not None,
                        timeout=timedelta(seconds=settings.capacity_retry_s),
                        timeout_summary="no capacity: try the replacement again",
                    )
                    break
                except TimeoutError:
                    pass
                self._p.replacement = await self._replace()
                if self._p.replacement.new_node is not None:
                    rec.outcome = render.replaced(self._p.replacement.new_node, self._ref.node)
                    return True
            waited = (workflow.now() - started).total_seconds()
            rec.outcome = render.awaiting_capacity(self._p.replacement.no_capacity, waited, settings.capacity_wait_s)
        return False

    async def _close_without_capacity(self) -> RemediationResult:
        self._p.node_state = render.no_capacity_state(self._ref.node, self._job_accounts())
        return await self._close("no_capacity", f"{self._reason()}; no replacement within the capacity bound")

    async def _verify_resume(self) -> None:
        """The job recoveries verify (each job once, across all its new nodes); this collects
        their answers, for at most their bound."""
        jobs = self._settings.jobs
        bound = jobs.verify_timeout_s + jobs.gather_s + 120
        async with self._in_stage(Stage.VERIFY) as rec:
            try:
                await workflow.wait_condition(
                    lambda: set(self._p.recoveries) <= set(self._p.recovered),
                    timeout=timedelta(seconds=bound),
                    timeout_summary="job recoveries: stop waiting for their answers",
                )
            except TimeoutError:
                pass  # the unanswered are recorded as such; their recoveries go on
            rec.outcome = "; ".join(render.job_line(a) for a in self._job_accounts()) or "no job"

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
            health = await act_run(act.CHECK_NODE_HEALTH, ref, summary=f"health check {ref.node}")
            if not health.healthy:  # a repair that did not take: the node goes, a spare comes
                self._set_action(ActionClass.REPLACE_NODE)
                self._p.replacement = await self._replace()
                msg = await act_run(act.DECOMMISSION_NODE, ref, summary=f"remove {ref.node} from the cluster")
                new = self._p.replacement.new_node or "(none yet)"
                return f"health check failed after the repair ({health.detail}): " + render.returned_replaced(new, msg)
            elif drain is not None and drain.drained_by_us:
                msg = await act_run(act.RESUME_SLURM_NODE, ref, summary=f"resume {ref.node}")
                if self._kube is not None:
                    msg += "; " + await act_run(act.UNCORDON_NODE, self._kube, summary="uncordon")
                return render.returned_repaired(msg)
            else:
                return render.left_drained(drain)
        msg = await act_run(act.DECOMMISSION_NODE, ref, summary=f"remove {ref.node} from the cluster")
        return render.returned_replaced(self._p.replacement.new_node or "(none yet)", msg)

    async def _replace(self) -> ReplacementResult:
        return await act_run(
            act.REPLACE_NODE,
            self._ref,
            summary=f"replace {self._ref.node}",
            timeout=self._provider_timeout,
            heartbeat=PROVIDER_HEARTBEAT,
        )

    async def _await_decision(self, why: str = "policy asks for a human") -> RecordedDecision:
        approval = self._cluster_policy.approval
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
        async with self._in_stage(Stage.CLOSE) as rec:
            result = self._result_for(outcome, reason)
            severity: Severity = "warning" if outcome != "resolved" or self._jobs_not_back(result) else "info"
            await self._notify(f"closed_{outcome}", severity, render.closed_notice(outcome, self._p.node_state, result))
            rec.outcome = outcome
        self._stage = Stage.DONE
        workflow.upsert_search_attributes([sa.STAGE.value_set(Stage.DONE.value)])
        if self._policy is not None and self._cluster_policy.mode != "observe":
            # The node is back (or gone for good): the budget frees, whatever the outcome.
            release = ReleaseRequest(cluster=self._ref.cluster, incident_id=self._ref.incident_id)
            await act_run(act.RELEASE_CAPACITY, release, summary="give the capacity back to the cluster")
        await act_run(act.RECORD_INCIDENT_METRICS, result, summary="record metrics")
        self._result = result
        await workflow.wait_condition(workflow.all_handlers_finished)
        return result

    def _result_for(self, outcome: Outcome, reason: str) -> RemediationResult:
        p, settings = self._p, self._settings
        accounts = self._job_accounts()
        requeues = [r.requeue for r in p.recovered.values() if r.requeue is not None and r.requeue.requeued]
        resumed = [a.resumed for a in accounts if a.resumed is not None]
        cost = policy.incident_cost(
            self._input.report.observed_at, requeues, resumed, settings.gpus_per_node, p.capacity_back_at
        )
        counted = outcome == "resolved"
        return RemediationResult(
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
            jobs=accounts,
            jobs_requeued=requeues,
            jobs_not_requeued=[
                UnrequeuedJob(job_id=a.job_id, reason=a.detail) for a in accounts if a.fate != JobFate.REQUEUED
            ],
            jobs_resumed=resumed,
            replacement_node=p.replacement.new_node if p.replacement else None,
            borrowed_node=p.borrowed.node if p.borrowed else None,
            mode=self._policy.policy.mode if self._policy is not None else "",
            policy_version=self._policy.version if self._policy is not None else None,
            mttr_s=cost.mttr_s if counted else None,
            steps_lost=cost.steps_lost if counted else 0,
            gpu_seconds_lost=cost.gpu_seconds_lost if counted else 0.0,
        )

    # --- helpers ---------------------------------------------------------------------------

    def _job_accounts(self) -> list[JobAccount]:
        """Every job that was on the node, in the order they were found, with its fate (from its
        latest recovery: a job moved off a borrowed node has two)."""
        latest = {job_id: recovery for recovery, job_id in self._p.recoveries.items()}
        accounts = []
        for job in self._p.affected:
            checkpoint = self._p.checkpoints.get(job.job_id)
            recovery = latest.get(job.job_id)
            if job.job_id in self._p.accounts:
                accounts.append(self._p.accounts[job.job_id])
            elif recovery is not None and recovery in self._p.recovered:
                result = self._p.recovered[recovery]
                accounts.append(job_policy.account_from_recovery(job, result, checkpoint, self._ref.incident_id))
            elif recovery is not None:
                accounts.append(job_policy.unanswered(job, recovery, checkpoint))
            else:  # the incident stopped before the requeue stage (aborted, ignored): untouched
                accounts.append(job_policy.untouched(job, checkpoint))
        return accounts

    @staticmethod
    def _jobs_not_back(result: RemediationResult) -> bool:
        return any(a.fate != JobFate.REQUEUED or a.resumed is None for a in result.jobs)

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
        if self._kube is not None and self._cluster_policy.mode != "observe":
            await self._post_event(stage, rec.outcome or stage.value)  # `kubectl describe node` tells the story

    async def _post_event(self, stage: Stage, message: str) -> None:
        """Best effort: an Event tells the story, it must not hold up the remediation (during an
        apiserver outage the cordon and eviction are retried; the Events are not)."""
        assert self._kube is not None
        reason = "Gpuheal" + "".join(w.capitalize() for w in stage.value.split("_"))
        event = KubeEvent(node=self._kube, reason=reason, message=message)
        try:
            await act_run(act.POST_NODE_EVENT, event, summary=f"event {reason}", attempts=3)
        except ActivityError as err:
            workflow.logger.warning("could not post Event %s on %s: %s", reason, self._kube.kube_node, err.cause)

    @property
    def _provider_timeout(self) -> timedelta:
        """A provider may wait up to provider_timeout_s (and heartbeats meanwhile): its activity
        gets that plus a margin, so the provider's own timeout always fires first."""
        return timedelta(seconds=self._settings.provider_timeout_s + 60)

    async def _notify(self, event: str, severity: Severity, message: str) -> None:
        note = Notification(
            incident_id=self._ref.incident_id,
            event=event,
            severity=severity,
            message=message,
            node=self._ref.node,
            cluster=self._ref.cluster,
        )
        await act_run(act.NOTIFY_OPERATORS, note, summary=f"notify: {event}")

    def _set_action(self, action: ActionClass) -> None:
        self._action = action
        workflow.upsert_search_attributes([sa.ACTION.value_set(action.value)])

    def _current_action(self) -> ActionClass:
        if self._action is not None:
            return self._action
        action = policy.triage_all(self._reports).action
        if self._repeat and action in (ActionClass.RESTART_APP, ActionClass.RESET_GPU, ActionClass.REBOOT_NODE):
            return ActionClass.REPLACE_NODE  # a repeat offender is replaced, whatever the XID
        return action

    def _reason(self) -> str:
        verdict = policy.triage_all(self._reports)
        if self._repeat and verdict.action != ActionClass.IGNORE:
            return f"{self._repeat} (this time: {verdict.reason})"
        return verdict.reason

    # --- signals, updates, queries ---------------------------------------------------------

    @workflow.signal
    def report(self, report: HealthReport) -> None:
        """Another report for this node (signal-with-start delivers the first one again)."""
        if report in self._reports:
            self._duplicates += 1
            return
        self._reports.append(report)
        if report.alert_key:  # the same alert re-sent after this incident closed starts nothing
            keys = sorted({r.alert_key for r in self._reports if r.alert_key})
            workflow.upsert_search_attributes([sa.ALERT_KEYS.value_set(keys)])
        # Before the node is repaired, a more severe report escalates the remediation.
        if self._action is not None and self._stage in ESCALATABLE:
            escalated = policy.triage_all(self._reports).action
            if escalated != self._action:
                self._set_action(escalated)

    @workflow.signal(name=CAPACITY_SIGNAL)
    def capacity(self, notice: GrantNotice) -> None:
        """The coordinator: a held incident may go now (or its domain incident dismissed it)."""
        self._grant = notice

    @workflow.signal(name=RECOVERED_SIGNAL)
    def job_recovered(self, result: JobRecoveryResult) -> None:
        """A job recovery's answer for one of this incident's jobs."""
        self._p.recovered.setdefault(result.recovery_id, result)

    @workflow.update
    def give_back(self, d: Decision) -> str:
        """Demand shifted back to inference: return the borrowed node now (its jobs move off)."""
        self._give_back_by = d
        assert self._p.borrowed is not None
        return f"{self._p.borrowed.node} goes back to pool {self._p.borrowed.from_pool} ({d.operator}: {d.reason})"

    @give_back.validator
    def _validate_give_back(self, d: Decision) -> None:
        if self._p.borrowed is None or self._stage != Stage.AWAITING_CAPACITY:
            raise ValueError(f"incident has no borrowed node to give back (stage: {self._stage.value})")

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
            held=self._held_for or None,
            stages=self._stages,
            reports_received=len(self._reports) + self._duplicates,
            done=self._done,
            result=self._result,
        )
