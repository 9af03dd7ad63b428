"""JobRecovery: one job, hit on one or more of its nodes, brought back once.

Incidents hand it their affected jobs (the `join` signal, by signal-with-start: id
`gpuheal-<cluster>-job-<job>-r<restart count at the failure>`, so every incident that saw the same
failure of the same job lands in the same recovery, and a later failure is a new one). After a
short gather (the job's other nodes' incidents join), it decides once, from policy and the job's
history:

  gather -> budget -> (hold | requeue) -> tell the owner -> verify resume -> tell the owner
         -> answer every incident that joined (the `job_recovered` signal)

A job requeued by gpuheal `retry_budget` times within `retry_window_s` is held instead, with its
owner told why and the nodes it failed on listed as suspects. Verification ends at once when the
job dies and at its deadline when it is silent; either way the answer says so.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from temporalio import workflow
from temporalio.exceptions import ActivityError, FailureError

from gpuheal.workflows.activity import run, run_waiting

with workflow.unsafe.imports_passed_through():
    from gpuheal.activities import interface as act
    from gpuheal.core import job_policy, render
    from gpuheal.core import messages as m
    from gpuheal.core.jobs import (
        HoldRequest,
        JobHistoryRequest,
        JobRecoveryInput,
        JobRecoveryResult,
        JobRecoveryStatus,
        OwnerEvent,
        OwnerNotice,
        RecoveryJoin,
        RetryBudget,
        VerifyJobRequest,
        VerifyOutcome,
    )
    from gpuheal.core.models.result import JobFate
    from gpuheal.core.models.slurm import RequeueRequest, RequeueResult

# Recoveries started before this release waited `gather_s` for every job, one node or many.
GATHER_ONLY_MULTI_NODE = "recovery-gathers-only-for-jobs-on-several-nodes"

RecoveryStage = Literal["gathering", "deciding", "requeueing", "verifying", "answering", "done"]


@workflow.defn(name=m.JOB_RECOVERY.name)
class JobRecoveryWorkflow:
    @workflow.init
    def __init__(self, inp: JobRecoveryInput) -> None:
        self._input = inp
        self._joins: list[RecoveryJoin] = []
        self._stage: RecoveryStage = "gathering"
        self._result: JobRecoveryResult | None = None
        self._answered: set[str] = set()
        self._notices: list[str] = []

    @workflow.run
    async def run(self, inp: JobRecoveryInput) -> JobRecoveryResult:
        await workflow.wait_condition(lambda: bool(self._joins))  # signal-with-start brings the first
        if inp.settings.gather_s > 0 and self._has_other_nodes():
            await workflow.sleep(inp.settings.gather_s, summary="gather: incidents on the job's other nodes join")
        self._stage = "deciding"
        budget = await self._budget()
        if budget.spent:
            result = await self._hold(budget)
        else:
            result = await self._requeue_and_verify(budget)
        self._result = result
        self._stage = "answering"
        await self._answer_incidents()
        # A join that arrives while the answers go out is answered too, then the workflow ends.
        await workflow.wait_condition(lambda: self._unanswered() == [] and workflow.all_handlers_finished())
        self._stage = "done"
        return result

    def _has_other_nodes(self) -> bool:
        """Only a job on more than one node can have incidents on other nodes to wait for; a
        one-node job is requeued at once (recoveries before this release waited for all)."""
        return self._joins[0].job.node_count > 1 or not workflow.patched(GATHER_ONLY_MULTI_NODE)

    # --- steps ------------------------------------------------------------------------------

    async def _budget(self) -> RetryBudget:
        s = self._input.settings
        since = workflow.now() - timedelta(seconds=s.retry_window_s)
        request = JobHistoryRequest(
            cluster=self._input.cluster, job_id=self._input.job_id, since=since, exclude_id=workflow.info().workflow_id
        )
        history = await run(act.JOB_RECOVERY_HISTORY, request, summary="this job's recent recoveries")
        return job_policy.retry_budget(history.recoveries, s.retry_budget, s.retry_window_s, self._failed_nodes())

    async def _hold(self, budget: RetryBudget) -> JobRecoveryResult:
        first = self._joins[0]
        why = render.budget_spent(budget)
        hold = HoldRequest(job_id=first.job.job_id, failed_node=first.failed_node, reason=why)
        await run(act.HOLD_SLURM_JOB, hold, summary="hold the job")
        await self._tell_owner("job_held", render.owner_held(first.job, self._failed_nodes(), budget))
        return self._record(JobFate.HELD, why, budget=budget)

    async def _requeue_and_verify(self, budget: RetryBudget) -> JobRecoveryResult:
        first = self._joins[0]
        request = RequeueRequest(
            job=first.job,
            failed_node=first.failed_node,
            also_failed=tuple(self._failed_nodes()[1:]),
            exclude_failed_node=self._excludes(),
            release_nodes=job_policy.released_exclusions(budget),
            cluster=self._input.cluster,
        )
        self._stage = "requeueing"
        requeue = await run(act.REQUEUE_SLURM_JOB, request, summary=f"requeue job {first.job.job_id}")
        # What a later recovery of this job reads (its retry budget, the nodes to let it back on).
        fresh = requeue.requeued and not requeue.already_requeued
        memo: dict[str, Any] = {"requeued": fresh, "failed_nodes": self._failed_nodes()}
        if requeue.avoided:  # (only then: recoveries before this release upserted these two alone)
            memo["avoided_nodes"] = list(requeue.avoided)
        workflow.upsert_memo(memo)
        if not requeue.requeued:
            fate = JobFate.ENDED if requeue.ended_state else JobFate.NOT_REQUEUED
            return self._record(fate, requeue.reason, budget=budget, requeue=requeue)
        hit = render.owner_hit(first.job, [j.what for j in self._joins], self._failed_nodes(), requeue)
        await self._tell_owner("job_hit", hit, steps_at_risk=job_policy.steps_at_risk(requeue))
        self._stage = "verifying"
        verify = await self._verify(requeue)
        cost = job_policy.job_cost(first, requeue, verify, self._input.settings.gpus_per_node, workflow.now())
        if verify.resumed is not None:
            back = render.owner_running_again(first.job, verify.resumed, cost)
            await self._tell_owner(
                "job_running_again",
                back,
                nodes=tuple(verify.resumed.node.split(",")),
                step=verify.resumed.step,
                steps_lost=cost.steps_lost,
                gpu_seconds_lost=cost.gpu_seconds_lost,
            )
        else:
            await self._tell_owner("job_not_resumed", render.owner_not_resumed(first.job, verify))
        detail = render.verified(verify)
        return self._record(
            JobFate.REQUEUED,
            detail,
            budget=budget,
            requeue=requeue,
            verify=verify,
            steps_lost=cost.steps_lost,
            gpu_seconds_lost=cost.gpu_seconds_lost,
        )

    async def _verify(self, requeue: RequeueResult) -> VerifyOutcome:
        """Its deadline counts from when it runs again (at most start_wait_s in Slurm first);
        only the nodes it was requeued away from are wrong places for it to run."""
        s = self._input.settings
        bound = s.start_wait_s + s.verify_timeout_s
        request = VerifyJobRequest(
            requeue=requeue,
            avoid_nodes=tuple(self._failed_nodes()) if self._excludes() else (),
            deadline_at=workflow.now().timestamp() + bound,
            run_for_s=s.verify_timeout_s,
        )
        return await run_waiting(
            act.WAIT_FOR_JOB_RESUME,
            request,
            summary=f"wait for job {requeue.job_id} to train past its checkpoint",
            deadline_s=bound,
        )

    async def _tell_owner(self, event: OwnerEvent, message: str, **fields: object) -> None:
        """One notice per job per stage: its own activity, keyed for the receiver's dedup."""
        first = self._joins[0]
        notice = OwnerNotice.model_validate(
            {
                # One per job, event and recovery run: a receiver that dedupes drops only a repeat.
                "key": f"{workflow.info().workflow_id}/{workflow.info().first_execution_run_id}"
                f":{first.job.job_id}:{event}",
                "event": event,
                "cluster": self._input.cluster,
                "job_id": first.job.job_id,
                "job_name": first.job.name,
                "user": first.job.user,
                "account": first.job.account,
                "mail_user": first.job.mail_user,
                "recipients": job_policy.owner_recipients(first.job),
                "nodes": tuple(self._failed_nodes()),
                "message": message,
                **fields,
            }
        )
        try:
            await run(act.NOTIFY_JOB_OWNER, notice, summary=f"tell {first.job.user or 'the owner'}: {event}")
        except ActivityError as err:
            # A notice that cannot be delivered (a relay refusing the address, a dead webhook)
            # never stops the recovery: the job goes on, the history says the notice was lost.
            workflow.logger.warning("owner notice %s lost: %s", notice.key, err.cause or err)
            return
        self._notices.append(event)

    async def _answer_incidents(self) -> None:
        assert self._result is not None
        for incident in self._unanswered():
            self._answered.add(incident)
            handle = workflow.get_external_workflow_handle(incident)
            try:
                await m.INCIDENT_JOB_RECOVERED.send(handle, self._result)
            except FailureError as err:
                # The incident closed first (it stopped waiting at its bound, e.g. no capacity):
                # its record names this recovery, whose own result is the answer.
                workflow.logger.info("incident %s has closed; not answered: %s", incident, err)

    # --- helpers ----------------------------------------------------------------------------

    def _failed_nodes(self) -> list[str]:
        nodes: list[str] = []
        for j in self._joins:
            if j.failed_node not in nodes:
                nodes.append(j.failed_node)
        return nodes

    def _excludes(self) -> bool:
        """Kept off its failed nodes when any incident that joined takes its node out (an
        application restart alone leaves the job free to run where it ran)."""
        return any(j.exclude_failed_node for j in self._joins)

    def _unanswered(self) -> list[str]:
        if self._result is None:
            return []
        return [j.incident_id for j in self._joins if j.incident_id not in self._answered]

    def _record(self, fate: JobFate, detail: str, **fields: object) -> JobRecoveryResult:
        first = self._joins[0]
        return JobRecoveryResult.model_validate(
            {
                "recovery_id": workflow.info().workflow_id,
                "job_id": first.job.job_id,
                "job_name": first.job.name,
                "user": first.job.user,
                "fate": fate,
                "detail": detail,
                "incidents": tuple(j.incident_id for j in self._joins),
                "failed_nodes": tuple(self._failed_nodes()),
                "owner_notices": tuple(self._notices),
                **fields,
            }
        )

    # --- signals, queries -------------------------------------------------------------------

    @workflow.signal(name=m.RECOVERY_JOIN.name)
    def join(self, j: RecoveryJoin) -> None:
        """An incident hands this job over (again, after a retry: counted once)."""
        if all(j.incident_id != x.incident_id for x in self._joins):
            self._joins.append(j)

    @workflow.query(name=m.RECOVERY_STATUS.name)
    def status(self) -> JobRecoveryStatus:
        return JobRecoveryStatus(
            recovery_id=workflow.info().workflow_id,
            job_id=self._input.job_id,
            stage=self._stage,
            incidents=tuple(j.incident_id for j in self._joins),
            result=self._result,
        )
