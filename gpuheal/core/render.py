"""Every word an incident says: stage outcomes, notifications, the timeline and the summary.

The workflow decides; this module words it. Keeping the wording here (pure functions, no I/O)
keeps the workflow thin and lets the CLI, the demo and the notifications say the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from gpuheal.core.fleet.models import RETURN_COMMAND, Placement
from gpuheal.core.fleet.policy import VersionedPolicy
from gpuheal.core.job_policy import JobCost
from gpuheal.core.jobs import RetryBudget, VerifyOutcome
from gpuheal.core.models.base import ActionClass, NodeAt, NodeState, Outcome
from gpuheal.core.models.incident import Decision, RecordedDecision
from gpuheal.core.models.kubernetes import BorrowedGiveBack, BorrowResult, CordonResult, EvictResult, KubeNodeRef
from gpuheal.core.models.replacement import EarlierReplacement
from gpuheal.core.models.report import HealthReport
from gpuheal.core.models.result import JobAccount, JobFate, RemediationResult, ResumedJob, StageRecord
from gpuheal.core.models.slurm import (
    CheckpointAsk,
    CheckpointOutcome,
    DrainResult,
    JobList,
    JobSnapshot,
    NodeInfo,
    RequeueResult,
    ValidationResult,
)
from gpuheal.core.policy import Plan, is_our_drain, triage

# --- stage outcomes (the line each stage leaves in the UI's current details) ----------------


def triaged(action: ActionClass, reason: str) -> str:
    return f"{action.value}: {reason}"


def admitted(version: VersionedPolicy | None, placement: Placement | None) -> str:
    if version is None:
        return ""
    where = f"; pool {placement.pool}" + "".join(f", {d}" for d in placement.domains) if placement else ""
    return f" [policy v{version.version}, mode {version.policy.mode}{where}]"


def would_do(
    node: str,
    plan: Plan,
    jobs: Sequence[JobSnapshot],
    asks: Mapping[int, CheckpointAsk | None],
    kube: KubeNodeRef | None,
    reason: str,
) -> list[str]:
    """Observe mode: the actions the incident would take, in order, each one line."""
    lines = []
    for job in jobs:
        ask = asks.get(job.job_id)
        if ask is not None:
            lines.append(f"would ask job {job.job_id} to checkpoint (SIG{ask.signal})")
    if plan.drain:
        lines.append(f"would drain {node} ({reason})")
        if kube is not None:
            lines.append(f"would cordon and taint Kubernetes node {kube.kube_node}, and evict its pods")
    if plan.requeue:
        for job in jobs:
            lines.append(
                f"would requeue job {job.job_id} ({job.name}, {job.user or '?'})"
                + (f" excluding {node}" if plan.avoid_failed_node else "")
            )
    if plan.repair is ActionClass.REPLACE_NODE:
        lines.append(f"would replace {node} through the provider")
    elif plan.repair is not None:
        lines.append(f"would {plan.repair.value.replace('_', ' ')} on {node}, then resume it after a health check")
    return lines or [f"would leave {node} as it is"]


def held(report: HealthReport, why: str) -> str:
    return f"{report.describe()}: held, {why}"


def escalated_state(node: str, drain: DrainResult | None, why: str) -> NodeAt:
    drained = "drained; " if drain is not None and drain.drained_by_us else ""
    return NodeAt(NodeState.ESCALATED, f"{drained}not replaced: {why}")


def decided(d: RecordedDecision) -> str:
    return f"{d.verdict} by {d.operator}: {d.reason}"


def checkpoints(jobs: int, outcomes: Sequence[CheckpointOutcome]) -> str:
    """The protect stage: per job, confirmed at step S after X s, no confirmation, or not signalled."""
    if jobs == 0:
        return "no job on the node"
    parts = [f"job {o.job_id}: {o.detail}" for o in outcomes]
    return "; ".join(parts) if parts else f"{jobs} job(s), none asks to be signalled"


def not_signalled(job: JobSnapshot) -> CheckpointOutcome:
    line = job.progress
    if line is not None and line.signal and job.this_runs_progress is None:
        why = f"its run {job.restart_count} has not said yet that it traps a signal (the line is run {line.restart}'s)"
    else:
        why = "it did not say it traps a signal (progress line signal=, or --signal=B:USR1)"
    return CheckpointOutcome(job_id=job.job_id, signal=None, confirmed=False, detail=f"not signalled: {why}")


def drained(result: DrainResult, why: str) -> str:
    if result.already_drained:
        return f"already drained: {result.previous_reason!r}"
    return f"drained ({why})"


def cordoned(result: CordonResult, no_execute: bool) -> str:
    taints = "NoSchedule" + (" + NoExecute" if no_execute else "")
    by_others = " (it was already cordoned by someone else)" if result.cordoned_by_others else ""
    return f"cordoned, tainted {taints}{by_others}"


def handed_over(accounts: Sequence[JobAccount], recoveries: Sequence[str]) -> str:
    ended = [a for a in accounts if a.fate in (JobFate.ENDED, JobFate.NOT_REQUEUED)]
    parts = [f"{len(recoveries)} job(s) to their recovery"] if recoveries else ["no job to recover"]
    parts += [f"job {a.job_id} {a.fate.value}: {a.detail}" for a in ended]
    return "; ".join(parts)


def job_line(a: JobAccount) -> str:
    """One job in the incident's record: what became of it."""
    how = f"job {a.job_id} ({a.name}, {a.user or '?'}): {a.fate.value}"
    if a.resumed is not None and a.resumed.progress_checked:
        how += f", running again on {a.resumed.node} at step {a.resumed.step}"
    elif a.resumed is not None:
        how += f", running again on {a.resumed.node} (it publishes no progress: RUNNING is all that is checked)"
    elif a.detail:
        how += f": {a.detail}"
    if a.caused_by_gpuheal:
        how += " [gpuheal caused it]"
    if a.joined:
        how += f" [joined {a.recovery_id}]"
    return how


def verified(v: VerifyOutcome) -> str:
    if v.resumed is not None and not v.resumed.progress_checked:
        return f"running again on {v.resumed.node} (it publishes no progress)"
    if v.resumed is not None:
        return f"running again on {v.resumed.node}, step {v.resumed.step} > checkpoint {v.resumed.checkpoint_step}"
    if v.outcome == "died":
        return f"did not resume: it {v.state}" + (f" ({v.reason})" if v.reason and v.reason != "None" else "")
    if v.outcome == "on_failed_node":
        return f"did not resume: {v.reason}"
    return f"did not resume by its deadline: {v.reason}"


def budget_spent(b: RetryBudget) -> str:
    return (
        f"retry budget spent: requeued by gpuheal {b.used} times within {b.window_s / 3600:g} h "
        f"(allowed {b.allowed}); held, not requeued; suspect nodes: {', '.join(b.suspects) or 'none'}"
    )


def owner_hit(job: JobSnapshot, what: Sequence[str], nodes: Sequence[str], requeue: RequeueResult) -> str:
    risk = ""
    if requeue.step_at_failure is not None and requeue.checkpoint_step is not None:
        risk = (
            f" Steps at risk: {max(0, requeue.step_at_failure - requeue.checkpoint_step)} "
            f"(step {requeue.step_at_failure}, checkpoint at {requeue.checkpoint_step})."
        )
    return (
        f"Your job {job.job_id} ({job.name}) was hit by a GPU failure: {'; '.join(what)}. "
        f"It has been requeued to run again without {', '.join(nodes)}; gpuheal will tell you when it trains "
        f"again.{risk}"
    )


def owner_running_again(job: JobSnapshot, v: ResumedJob, cost: JobCost) -> str:
    return (
        f"Your job {job.job_id} ({job.name}) is training again on {v.node}, at step {v.step} "
        f"(checkpoint {v.checkpoint_step}). Lost: {cost.steps_lost} steps, {cost.gpu_seconds_lost:.0f} GPU-seconds."
    )


def owner_not_resumed(job: JobSnapshot, v: VerifyOutcome) -> str:
    return f"Your job {job.job_id} ({job.name}) was requeued after a GPU failure but {verified(v)}. Please check it."


def owner_held(job: JobSnapshot, nodes: Sequence[str], b: RetryBudget) -> str:
    return (
        f"Your job {job.job_id} ({job.name}) failed again on {', '.join(nodes)}. gpuheal has requeued it "
        f"{b.used} times within {b.window_s / 3600:g} h, its retry budget, and has held it instead "
        f"(release with: scontrol release {job.job_id}). Suspect nodes: {', '.join(b.suspects)}."
    )


def borrowed(got: BorrowResult, joined: str) -> str:
    evicted = f"evicted {len(got.evicted)} inference pod(s)" if got.evicted else "no pod to evict"
    return f"borrowed {got.node} from pool {got.from_pool} ({evicted}); {joined}"


def given_back(node: str, jobs: int, left: JobList, released: str, back: str, by: Decision | None) -> str:
    why = f"given back early by {by.operator}: {by.reason}; " if by else ""
    stayed = f"; job(s) {[j.job_id for j in left.jobs]} still there at the deadline" if left.jobs else ""
    return f"{why}{jobs} job(s) moved off {node}{stayed}; {released}; {back}"


def give_back_waits(node: str, left: JobList, bound_s: float) -> str:
    return (
        f"{node} stays in Slurm, drained: job(s) {[j.job_id for j in left.jobs]} still run on it; it goes back"
        f" to inference once they leave (at most {bound_s:.0f} s)"
    )


def kept_borrowed(node: str, pool: str, left: JobList, bound_s: float) -> str:
    return (
        f"{node} kept in Slurm, drained: job(s) {[j.job_id for j in left.jobs]} still on it after {bound_s:.0f} s;"
        f" no job is killed to give it back: return it to pool {pool} by hand once they end"
    )


def awaiting_capacity(reason: str, waited_s: float, bound_s: float) -> str:
    return f"no capacity: {reason}; waited {waited_s:.0f} s of {bound_s:.0f} s"


def no_capacity_state(node: str, jobs: Sequence[JobAccount]) -> NodeAt:
    waiting = [a.job_id for a in jobs if a.fate in (JobFate.REQUEUED, JobFate.UNKNOWN) and a.resumed is None]
    tail = f"; job(s) {waiting} pending on the cluster without {node}" if waiting else ""
    return NodeAt(NodeState.AWAITING_REPLACEMENT, f"{node} drained and out; replacement pending (no capacity){tail}")


def evicted(result: EvictResult) -> str:
    return (
        f"evicted {len(result.evicted)}, kept {len(result.kept)} (DaemonSet/mirror), "
        f"{result.retries_429} PDB retries"
        + (f", deleted {list(result.deleted)}" if result.deleted else "")
        + (f", BLOCKED {list(result.blocked)}" if result.blocked else "")
    )


def replaced(new_node: str, node: str) -> str:
    return f"{new_node} joined in place of {node}"


def replaced_earlier_state(e: EarlierReplacement) -> NodeAt:
    return NodeAt(NodeState.ALREADY_REPLACED, f"replaced earlier by {e.replacement_node}")


def replaced_earlier(e: EarlierReplacement) -> str:
    when = e.closed_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (
        f"{e.node} is no longer in service: gpuheal replaced it by {e.replacement_node} in incident "
        f"{e.incident_id} (run {e.run_id}, closed {when}); this late report changes nothing"
    )


# --- node states at the close ---------------------------------------------------------------


UNTOUCHED = NodeAt(NodeState.UNTOUCHED, "untouched")
OBSERVED = NodeAt(NodeState.UNTOUCHED, "untouched (observe mode)")
NOT_DRAINED = NodeAt(NodeState.IN_SERVICE, "in service (not drained)")


def not_drained_as_read(node: NodeInfo, incident_id: str) -> NodeAt:
    """The node of an action that needed no drain (restart the app), as Slurm shows it at the
    close: in service, or untouched by this run and drained still: by an earlier run of its
    incident (one aborted, or not granted: the person's to return) or by someone else. UNTOUCHED,
    not DRAINED: this run did nothing to the node, so the earlier incident's state stands (dedupe)."""
    if not node.drained:
        return NOT_DRAINED
    if is_our_drain(node.reason, incident_id):
        back = RETURN_COMMAND.format(node=node.name)
        return NodeAt(
            NodeState.UNTOUCHED,
            f"untouched; still drained by an earlier run of its incident ({node.reason!r}); once checked: {back}",
        )
    return NodeAt(NodeState.UNTOUCHED, f"untouched; drained by someone else ({node.reason!r}): theirs to resume")


def not_drained_unread(why: str) -> NodeAt:
    """The node of an action that needed no drain, when Slurm did not answer at the close."""
    return NodeAt(NodeState.UNTOUCHED, f"untouched; Slurm did not say how it is ({why})")


def aborted_node_state(node: str, drain: DrainResult | None) -> NodeAt:
    if drain is None or not drain.drained_by_us:
        return UNTOUCHED
    why = f"drained by this incident; not replaced; once checked, return it with: {RETURN_COMMAND.format(node=node)}"
    return NodeAt(NodeState.DRAINED, why)


def blocked_node_state(blocked: Sequence[str]) -> NodeAt:
    return NodeAt(NodeState.BLOCKED, f"drained and cordoned; pods {list(blocked)} still there; not replaced")


def returned_repaired(detail: str) -> NodeAt:
    return NodeAt(NodeState.RETURNED, f"repaired, health check passed; {detail}")


def kept_for_follow_up(node: str, drain: DrainResult | None) -> NodeAt:
    """A more severe report came: the node is left as it is for the follow-up run (never resumed)."""
    if drain is None or not drain.drained_by_us:
        return NodeAt(NodeState.IN_SERVICE, f"{node} in service (never drained): the follow-up run takes it")
    return NodeAt(NodeState.DRAINED, f"{node} kept drained, not resumed: the follow-up run takes it")


def left_drained(drain: DrainResult | None) -> NodeAt:
    before = drain.previous_reason if drain else ""
    return NodeAt(
        NodeState.LEFT_DRAINED, f"repaired, health check passed; left drained (drained before us: {before!r})"
    )


def no_replacement(rejected: tuple[str, ...]) -> str:
    bad = f" (new node(s) {', '.join(rejected)} failed GPU validation: drained for the vendor)" if rejected else ""
    return f"no replacement within the capacity bound{bad}"


def new_node_rejected(new_node: str, verdict: ValidationResult) -> str:
    if verdict.by_others:
        return f"new node {new_node} was not validated ({verdict.detail}): not taken"
    return f"new node {new_node} failed its GPU validation ({verdict.detail}): drained for the vendor"


def returned_replaced(
    new_node: str | None, detail: str, verdict: ValidationResult | None = None, rejected: tuple[str, ...] = ()
) -> NodeAt:
    """The node left the cluster; replaced, or still awaiting its replacement (no spare yet)."""
    state = NodeState.REPLACED if new_node else NodeState.AWAITING_REPLACEMENT
    validated = f" (GPUs validated: {verdict.detail})" if verdict is not None and verdict.passed else ""
    if rejected:
        validated += f" after {', '.join(rejected)} failed GPU validation (drained for the vendor)"
    return NodeAt(state, f"replaced by {new_node or '(none yet)'}{validated}; {detail}")


def unvalidated(health: str, v: ValidationResult) -> NodeAt:
    return NodeAt(
        NodeState.UNVALIDATED,
        f"repaired and {health or 'healthy'}, but its burn-in gave no verdict ({v.detail}): kept drained;"
        " validate it by hand, then resume it",
    )


def new_node_unvalidated(new_node: str, verdict: ValidationResult) -> str:
    return (
        f"new node {new_node}'s burn-in gave no verdict ({verdict.detail}): kept drained for a person;"
        " no other spare is tried (a burn-in that cannot run would spoil each)"
    )


def failed_validation(health: str, v: ValidationResult) -> NodeAt:
    return NodeAt(
        NodeState.FAILED_VALIDATION,
        f"repaired and {health or 'healthy'}, but its GPUs failed validation ({v.detail}): "
        "drained and out, for the vendor",
    )


def replaced_after_failed_check(
    why: str,
    new_node: str | None,
    detail: str,
    verdict: ValidationResult | None = None,
    rejected: tuple[str, ...] = (),
) -> NodeAt:
    """A check of its GPUs failed (`why`: a repair that did not take, a failed burn-in): the node
    went, a spare came."""
    replaced = returned_replaced(new_node, detail, verdict, rejected)
    return NodeAt(replaced.state, f"{why}: {replaced.detail}")


def burn_in_due(first: HealthReport, jobs: Sequence[int], window_s: float) -> str:
    gpu = f"GPU {first.gpu_serial or first.gpu}" if first.gpu_serial or first.gpu is not None else "a GPU"
    return (
        f"application faults on {gpu} of {first.node} hit {len(jobs)} different jobs within "
        f"{window_s / 86400:g} days ({', '.join(str(j) for j in jobs)}): drained for a burn-in"
    )


def no_burn_in(node: str, why: str, not_now: str) -> str:
    pattern = why.replace(": drained for a burn-in", "")
    return f"{pattern}; {node} wants diagnostics, but {not_now}: its job restarts in place"


def burn_in_failed(detail: str) -> str:
    return f"its GPUs failed the burn-in ({detail})"


def health_check_failed(health: str) -> str:
    return f"health check failed after the repair ({health})"


# --- notifications --------------------------------------------------------------------------


def remediating(report: HealthReport, action: ActionClass, reason: str) -> str:
    return f"{report.describe()}: {action}. {reason}"


def approval_needed(report: HealthReport, action: ActionClass | None, why: str, timeout_s: float, default: str) -> str:
    return f"{report.describe()}: {action} awaits approval ({why}; default after {timeout_s:g} s: {default})"


def abort_notice(d: RecordedDecision) -> str:
    return f"remediation aborted by {d.operator}: {d.reason}"


def followed_up(reason: str, late: HealthReport) -> str:
    more = triage(late)
    return (
        f"{reason}; then {late.describe()} asked for more ({more.action.value}: {more.reason}) once the plan "
        "had left the node in service: a follow-up run of this incident acts on it"
    )


def closed_notice(outcome: Outcome, node_detail: str, result: RemediationResult) -> str:
    jobs = "".join(f"; {job_line(a)}" for a in result.jobs)
    mttr = f", MTTR {result.mttr_s:.1f} s" if result.mttr_s is not None else ""
    return f"{outcome}: {node_detail}{mttr}{jobs}"


# --- the timeline and the summary -----------------------------------------------------------


def _bar(offset: float, duration: float, total: float, width: int) -> str:
    start = int(offset / total * width) if total > 0 else 0
    length = max(1, round(duration / total * width)) if total > 0 else 1
    start = min(start, width - 1)
    length = min(length, width - start)
    return " " * start + "█" * length + " " * (width - start - length)


def render_timeline(
    stages: list[StageRecord], failure_at: datetime, end_at: datetime | None = None, width: int = 40
) -> str:
    """One row per stage, offsets from the failure being observed, bars to scale."""
    done = [s for s in stages if s.ended_at is not None]
    if not done:
        return "(no stage finished yet)"
    last = max([s.ended_at for s in done if s.ended_at] + ([end_at] if end_at else []))
    total = (last - failure_at).total_seconds()
    first = stages[0].started_at
    rows = [f"{'stage':<18} {'start':>8} {'took':>8}  |{'timeline':<{width}}|"]
    detect = (first - failure_at).total_seconds()
    rows.append(f"{'detect+start':<18} {0.0:>7.1f}s {detect:>7.1f}s  |{_bar(0, detect, total, width)}|")
    for s in done:
        assert s.ended_at is not None
        off = (s.started_at - failure_at).total_seconds()
        dur = (s.ended_at - s.started_at).total_seconds()
        rows.append(f"{s.stage.value:<18} {off:>7.1f}s {dur:>7.1f}s  |{_bar(off, dur, total, width)}|")
    return "\n".join(rows)


def render_result(result: RemediationResult, url: str | None = None) -> str:
    lines = [
        f"incident   {result.incident_id}  ({result.outcome}: {result.action.value})",
        f"reason     {result.reason}",
        f"node       {result.node_detail}",
    ]
    for account in result.jobs:
        lines.append(job_line(account))
    if result.mttr_s is not None:
        until = "training past its checkpoint" if result.jobs_resumed else "capacity back in service"
        lines.append(f"MTTR       {result.mttr_s:.1f} s (failure observed -> {until})")
    lines.append(f"lost       {result.steps_lost} steps, {result.gpu_seconds_lost:.0f} GPU-seconds")
    if url:
        lines.append(f"Temporal   {url}")
    return "\n".join(lines)


def ago(seconds: float) -> str:
    """A duration as a person reads it at a glance: 45s, 12m, 3h, 2d."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{max(0, seconds):.0f}s"


def borrowed_given_back(back: BorrowedGiveBack) -> str:
    parts = []
    if back.given_back:
        parts.append(f"back in their inference pool: {', '.join(back.given_back)}")
    if back.waiting:
        parts.append(f"drained, going back once their jobs end: {', '.join(back.waiting)}")
    return "borrowed nodes of incident runs that crashed out without returning them; " + "; ".join(parts)
