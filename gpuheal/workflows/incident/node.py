"""The incident's work on the node itself: drain it in Slurm and cordon it in Kubernetes, evict
its pods, repair or replace it through the provider, and bring it back (or see it leave). Slurm
is always told first: eviction alone tells Slurm nothing. Each function returns its stage's
outcome in words (a node state, at the return to service)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

from gpuheal.workflows.activity import past_deadline, run_waiting
from gpuheal.workflows.activity import run as act_run
from gpuheal.workflows.incident import capacity
from gpuheal.workflows.incident.state import IncidentState
from gpuheal.workflows.incident.timeline import set_action

with workflow.unsafe.imports_passed_through():
    from gpuheal.activities import interface as act
    from gpuheal.core import policy, render
    from gpuheal.core.models.base import ActionClass, NodeAt
    from gpuheal.core.models.incident import KubernetesPolicy
    from gpuheal.core.models.kubernetes import (
        CordonRequest,
        EvictRequest,
        EvictResult,
        MapNodeRequest,
        RejectNodeRequest,
    )
    from gpuheal.core.models.replacement import RepairRequest, ReplacementResult, ReplaceRequest
    from gpuheal.core.models.slurm import DrainRequest, NodeRef, ValidateRequest, ValidationResult

PROVIDER_HEARTBEAT = timedelta(seconds=60)
# A repair whose health check failed and whose replacement found no capacity removed the node and
# closed `resolved` before; those incidents keep doing so (workflow.patched) to replay.
NO_SPARE_IS_NOT_RESOLVED = "no-spare-is-not-resolved"
# Incidents started before it let a replacement's new node take jobs on joining, unvalidated;
# they keep doing so (workflow.patched) to replay.
VALIDATE_NEW_NODES = "validate-a-replacement-before-it-takes-jobs"
# Before this, a burn-in that could not run was a failed validation (an RMA for a healthy board),
# and a new node's failed burn-in was counted by nobody but its run; those incidents replay so.
NO_VERDICT_CONDEMNS_NOTHING = "a-burn-in-without-a-verdict-condemns-nothing"
# Before this, a rejected new node stayed schedulable in Kubernetes (pods landed on it); replayed so.
REJECTED_NODES_CORDONED = "a-rejected-new-node-is-cordoned-in-kubernetes"
# Before this, an action that needed no drain (restart the app) closed saying its node was in
# service, unread: an earlier run of its incident may have left it drained (issue 37's soak: a
# "resolved: in service" for a node an aborted run had left drained). Those incidents replay so.
NOT_DRAINED_IS_READ = "a-node-not-drained-is-read-from-slurm-at-the-close"
VALIDATE_ATTEMPTS = 5  # a burn-in Slurm keeps refusing is a failed validation, not thirty retries
MAX_REJECTED = 3  # new nodes a run may find bad before it stops looking (no_capacity): a bad batch


def provider_timeout(s: IncidentState) -> timedelta:
    """A provider may wait up to provider_timeout_s (and heartbeats meanwhile): its activity gets
    that plus a margin, so the provider's own timeout always fires first."""
    return past_deadline(s.settings.provider_timeout_s)


async def drain_in_slurm(s: IncidentState, why: str) -> str:
    req = DrainRequest(node=s.ref, reason=policy.drain_reason(s.ref.incident_id, why))
    s.drain = await act_run(act.DRAIN_SLURM_NODE, req, summary=f"drain {s.ref.node}")
    return render.drained(s.drain, why)


async def cordon(s: IncidentState, k8s: KubernetesPolicy) -> str:
    assert s.kube is not None
    req = CordonRequest(node=s.kube, no_execute=k8s.no_execute)
    s.cordon = await act_run(act.CORDON_AND_TAINT_NODE, req, summary=f"cordon {s.kube.kube_node}")
    return render.cordoned(s.cordon, k8s.no_execute)


async def evict(s: IncidentState) -> EvictResult:
    """Through the Eviction API; pods a PDB still protects at the deadline are left `blocked`
    (or deleted, where the policy says so)."""
    k8s, node = s.settings.kubernetes, s.kube
    assert k8s is not None and node is not None
    delete = k8s.on_pdb_timeout == "delete"
    req = EvictRequest(node=node, deadline_s=k8s.drain_deadline_s, delete_when_blocked=delete)
    return await run_waiting(
        act.EVICT_PODS,
        req,
        summary=f"evict pods from {node.kube_node}",
        deadline_s=k8s.drain_deadline_s,
    )


async def repair(s: IncidentState, action: ActionClass) -> tuple[ActionClass, str]:
    """Reset or reboot through the provider; where the platform cannot, the node will be
    replaced instead (returned as the action that remains)."""
    done = await act_run(
        act.REPAIR_NODE,
        RepairRequest(node=s.ref, action=action),
        summary=f"{action} {s.ref.node}",
        timeout=provider_timeout(s),
        heartbeat=PROVIDER_HEARTBEAT,
    )
    if not done.repaired:  # the platform cannot do it: the node goes, a spare comes
        set_action(s, ActionClass.REPLACE_NODE)
        return ActionClass.REPLACE_NODE, done.detail
    return action, done.detail


async def replace(s: IncidentState) -> ReplacementResult:
    """Each try after the first goes on from the last one's pool and start (the failed node may be
    gone by then). An activity's input is not part of replay: no patch needed."""
    last = s.replacement
    hold = s.settings.validate_timeout_s if validating_new_nodes(s) else None
    memory = {**(last.search() if last else {}), "rejected": s.rejected}
    first = workflow.info().first_execution_run_id
    req = ReplaceRequest(**s.ref.model_dump(), **memory, hold_for_validation_s=hold, run_id=first)
    return await act_run(
        act.REPLACE_NODE,
        req,
        summary=f"replace {s.ref.node}",
        timeout=provider_timeout(s),
        heartbeat=PROVIDER_HEARTBEAT,
    )


def validating_new_nodes(s: IncidentState) -> bool:
    return bool(s.settings.validate_job) and workflow.patched(VALIDATE_NEW_NODES)


def new_node_to_validate(s: IncidentState) -> str | None:
    """The replacement's new node while it still awaits its burn-in; None when there is none."""
    new = s.replacement.new_node if s.replacement is not None else None
    if new is None or s.new_node_verdict is not None or not validating_new_nodes(s):
        return None
    return new


async def validate_new_node(s: IncidentState) -> bool:
    """A replacement's new node, held out of service since before it joined, runs the burn-in
    before it takes a job (the requeued ones among them). True: it may take jobs (passed, or
    nothing to validate). False: its GPUs failed; it is drained for the vendor, rejected (never
    taken again by this run) and the replacement is "no capacity" again, so the capacity wait
    looks for another."""
    new = new_node_to_validate(s)
    if new is None:
        return True
    assert s.replacement is not None and s.settings.validate_job is not None
    verdict = await validate(s, s.settings.validate_job, s.ref.model_copy(update={"node": new}))
    if verdict.passed:
        s.new_node_verdict = verdict
        return True
    if verdict.no_verdict:  # nothing said of its GPUs: kept out for a person, no spare spoiled after it
        s.unvalidated = new
        if s.kube is not None and workflow.patched(REJECTED_NODES_CORDONED):
            await _out_of_kubernetes(s, new, verdict)
        why = render.new_node_unvalidated(new, verdict)
        s.replacement = s.replacement.model_copy(update={"new_node": None, "no_capacity": why})
        return False
    # Drained by someone else (Slurm itself, a site check) is no replacement either: its drain is left as it is.
    s.rejected = (*s.rejected, new)
    if verdict.ran_and_failed and workflow.patched(NO_VERDICT_CONDEMNS_NOTHING):
        await capacity.count_rejected(s, new, verdict.detail)  # a run of bad spares trips the breaker
    if verdict.ran_and_failed and s.kube is not None and workflow.patched(REJECTED_NODES_CORDONED):
        await _out_of_kubernetes(s, new, verdict)
    why = render.new_node_rejected(new, verdict)
    s.replacement = s.replacement.model_copy(update={"new_node": None, "no_capacity": why})
    return False


async def _out_of_kubernetes(s: IncidentState, new: str, verdict: ValidationResult) -> None:
    """The new node's Kubernetes Node (found as the incident's own was: by label, else by name)
    cordoned and labelled with its verdict (failed, or none). Best effort: Slurm has it drained
    already, and a Node that cannot be found or marked never fails the incident."""
    k8s = s.settings.kubernetes
    ref = s.ref.model_copy(update={"node": new})
    try:
        mapped = await act_run(
            act.MAP_KUBE_NODE,
            MapNodeRequest(ref=ref, node_label=k8s.node_label if k8s is not None else None),
            summary=f"find {new}'s Kubernetes node",
        )
        req = RejectNodeRequest(node=mapped, detail=verdict.detail, no_verdict=verdict.no_verdict)
        await act_run(act.MARK_REJECTED_NODE, req, summary=f"cordon and label {mapped.kube_node}: {verdict.detail}")
    except ActivityError as err:
        workflow.logger.warning("rejected node %s not marked in Kubernetes: %s", new, err.cause or err)


async def validate(s: IncidentState, job: str, ref: NodeRef | None = None) -> ValidationResult:
    """The burn-in's verdict on `ref` (the incident's node by default). One that could not run at
    all (Slurm refusing the job, the worker gone for good) is a failed validation too: the node is
    drained again, never left in service."""
    ref = ref or s.ref
    first = workflow.info().first_execution_run_id
    req = ValidateRequest(node=ref, job=job, timeout_s=s.settings.validate_timeout_s, run_id=first)
    try:
        return await act_run(
            act.VALIDATE_NODE_GPUS,
            req,
            summary=f"validate the GPUs of {ref.node}",
            timeout=timedelta(seconds=2 * req.timeout_s + 120),  # its wait for the node, then its run
            heartbeat=timedelta(seconds=60),
            attempts=VALIDATE_ATTEMPTS,
        )
    except ActivityError as err:
        detail = f"the burn-in could not run: {err.cause or err}"[:300]
        if workflow.patched(NO_VERDICT_CONDEMNS_NOTHING):  # says nothing of the GPUs: kept out, not condemned
            why = policy.unvalidated_reason(ref.incident_id, detail)
            await act_run(act.DRAIN_SLURM_NODE, DrainRequest(node=ref, reason=why), summary=f"drain {ref.node} again")
            return ValidationResult(passed=False, detail=detail, no_verdict=True)
        why = policy.drain_reason(ref.incident_id, "GPU validation could not run")
        await act_run(act.DRAIN_SLURM_NODE, DrainRequest(node=ref, reason=why), summary=f"drain {ref.node} again")
        return ValidationResult(passed=False, detail=detail)


async def back_in_service(s: IncidentState, repaired: ActionClass | None) -> NodeAt:
    """Resume a repaired node only after its health check passes; a replaced node leaves."""
    ref, drain = s.ref, s.drain
    if repaired is None:
        return await not_drained(s)
    if s.replacement is None:
        health = await act_run(act.CHECK_NODE_HEALTH, ref, summary=f"health check {ref.node}")
        if not health.healthy:  # a repair that did not take: the node goes, a spare comes
            return await replace_after(s, render.health_check_failed(health.detail))
        if drain is not None and drain.drained_by_us:
            if s.settings.validate_job:  # "Ready" says nothing about a GPU: burn it in first
                verdict = await validate(s, s.settings.validate_job)
                if verdict.by_others:
                    return render.left_drained(drain)
                if verdict.no_verdict:
                    return render.unvalidated(health.detail, verdict)
                if not verdict.passed:
                    return render.failed_validation(health.detail, verdict)
            return await resume(s, health.detail)
        return render.left_drained(drain)
    msg = await act_run(act.DECOMMISSION_NODE, ref, summary=f"remove {ref.node} from the cluster")
    return render.returned_replaced(s.replacement.new_node, msg, s.new_node_verdict, s.rejected)


async def not_drained(s: IncidentState) -> NodeAt:
    """An action that needed no drain: the node as Slurm shows it now, not assumed in service.
    Slurm not answering: said so, not guessed."""
    if not workflow.patched(NOT_DRAINED_IS_READ):
        return render.NOT_DRAINED
    try:
        found = await act_run(act.LOOK_UP_SLURM_NODE, s.ref, summary=f"is {s.ref.node} drained?", attempts=3)
    except ActivityError as err:
        return render.not_drained_unread(str(err.cause or err))
    return render.not_drained_as_read(found, s.ref.incident_id)


async def resume(s: IncidentState, checked: str) -> NodeAt:
    """Back into Slurm (and uncordoned) after `checked` said its GPUs are fine."""
    ref = s.ref
    msg = await act_run(act.RESUME_SLURM_NODE, ref, summary=f"resume {ref.node}")
    if policy.KEPT_FOR_THE_VENDOR in msg:  # never back to work: still out, still counted
        return render.failed_validation(checked, ValidationResult(passed=False, detail=msg))
    if s.kube is not None:
        msg += "; " + await act_run(act.UNCORDON_NODE, s.kube, summary="uncordon")
    return render.returned_repaired(msg)


async def replace_after(s: IncidentState, why: str) -> NodeAt:
    """The node's GPUs failed a check (`why` says which): it goes, a spare comes."""
    ref = s.ref
    set_action(s, ActionClass.REPLACE_NODE)
    s.replacement = await replace(s)
    await validate_new_node(s)  # one whose GPUs fail is none
    if s.replacement.new_node is None and workflow.patched(NO_SPARE_IS_NOT_RESOLVED):
        # Nothing in its place: it stays drained and counted, not removed (the close says no_capacity).
        kept = f"kept drained, not removed: {s.replacement.no_capacity}"
        return render.replaced_after_failed_check(why, None, kept)
    msg = await act_run(act.DECOMMISSION_NODE, ref, summary=f"remove {ref.node} from the cluster")
    return render.replaced_after_failed_check(why, s.replacement.new_node, msg, s.new_node_verdict, s.rejected)
