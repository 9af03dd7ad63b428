"""Borrowing a node from the inference pool while no spare comes, and giving it back.

A bridge, never a loss for inference: the pool is never taken below its floor (the activity
checks), and the node goes back the way it came: drained, its jobs moved off (each to its
recovery), out of Slurm, back into its pool. The workflow wraps each in its stage."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from temporalio import workflow
from temporalio.exceptions import ActivityError

from gpuheal.workflows.activity import run as act_run
from gpuheal.workflows.activity import run_waiting
from gpuheal.workflows.incident import node
from gpuheal.workflows.incident.state import IncidentState
from gpuheal.workflows.incident.timeline import notify

with workflow.unsafe.imports_passed_through():
    from gpuheal.activities import interface as act
    from gpuheal.core import policy, render
    from gpuheal.core import search_attributes as sa
    from gpuheal.core.models.kubernetes import BorrowedNode, BorrowRequest, BorrowResult, NodeEmptyWait
    from gpuheal.core.models.slurm import DrainRequest, JobList, JobSnapshot, NodeRef

# How long the borrowed node's jobs get to leave it before the operators hear it still waits.
GIVE_BACK_EMPTY_S = 300
LONG_POLL_S = 15.0  # past that, jobs leave by their own time limits: Slurm is asked less often
# Incidents started before a borrowed node waited for its jobs released it with them after
# GIVE_BACK_EMPTY_S; they keep doing so (workflow.patched) to replay.
GIVE_BACK_NEVER_KILLS = "give-back-never-kills"
# Before this, a borrow whose tries ran out failed the incident (its node left cordoned in neither
# pool); from this marker the incident goes on waiting for capacity and the node goes back.
FAILED_BORROW_GIVES_BACK = "a-failed-borrow-gives-its-node-back"

HandOver = Callable[[JobSnapshot, str, str], Awaitable[None]]  # (job, node it was on, why)


async def borrow(s: IncidentState) -> str:
    """Take a node into Slurm from the inference pool; the stage's outcome in words."""
    pool = s.settings.borrow
    assert pool is not None and s.kube is not None
    first = workflow.info().first_execution_run_id  # (its node is given back should this run crash)
    into = s.replacement.pool if s.replacement is not None else None  # (the failed Node may be gone)
    req = BorrowRequest(incident_id=s.ref.incident_id, failed=s.kube, policy=pool, run_id=first, training_pool=into)
    try:
        got = await run_waiting(
            act.BORROW_INFERENCE_NODE,
            req,
            summary=f"borrow a node from pool {pool.pool}",
            deadline_s=req.deadline_s,
        )
    except ActivityError as err:
        if not workflow.patched(FAILED_BORROW_GIVES_BACK):
            raise
        # Its tries spent part way: what it took (cordoned, labelled, in neither pool) goes back; a
        # node it did relabel (its answer lost) is this incident's borrowed node after all.
        try:
            got = await act_run(act.RETURN_UNFINISHED_BORROW, req, summary="return what the failed borrow took")
        except ActivityError as again:
            got = BorrowResult(node=None, why=f"what it took could not be returned ({again.cause or again})")
        if got.node is None:
            return f"borrowing from pool {pool.pool} failed ({err.cause or err}); {got.why}"
    if got.node is None:
        return f"nothing to borrow from pool {pool.pool}: {got.why}"
    s.borrowed = BorrowedNode(incident_id=s.ref.incident_id, node=got.node, from_pool=got.from_pool)
    workflow.upsert_search_attributes([sa.BORROWED.value_set(got.node)])  # found by its node
    joined = await act_run(
        act.ADOPT_BORROWED_NODE,
        s.borrowed,
        summary=f"{got.node} joins Slurm",
        timeout=node.provider_timeout(s),
        heartbeat=node.PROVIDER_HEARTBEAT,
    )
    s.capacity_back_at = workflow.now()
    return render.borrowed(got, joined)


async def give_back(s: IncidentState, hand_over: HandOver) -> str:
    """Return the borrowed node to its pool; the stage's outcome in words."""
    borrowed = s.borrowed
    assert borrowed is not None
    ref = NodeRef(cluster=s.ref.cluster, node=borrowed.node, incident_id=s.ref.incident_id)
    why = policy.drain_reason(s.ref.incident_id, f"{policy.GIVES_BACK} to inference")
    await act_run(act.DRAIN_SLURM_NODE, DrainRequest(node=ref, reason=why), summary=f"drain {borrowed.node}")
    jobs = await act_run(act.LIST_JOBS_ON_NODE, ref, summary=f"jobs on {borrowed.node}")
    for job in jobs.jobs:
        await hand_over(job, borrowed.node, f"{borrowed.node} goes back to pool {borrowed.from_pool}")
    bound = s.settings.borrow.give_back_wait_s if s.settings.borrow is not None else GIVE_BACK_EMPTY_S
    # A bound under the first wait is the whole wait (an activity's input: no patch needed).
    started = workflow.now()  # the bound counts from here: "kept after N s" is so
    left = await _wait_empty(borrowed.node, min(GIVE_BACK_EMPTY_S, bound))
    if left.jobs and workflow.patched(GIVE_BACK_NEVER_KILLS):
        # Releasing it now would take its slurmd, and the jobs with it: it stays in Slurm,
        # drained, until they leave (they were handed to their recovery above).
        await notify(s, "give_back_waits", "warning", render.give_back_waits(borrowed.node, left, bound))
        while left.jobs and (waited := (workflow.now() - started).total_seconds()) < bound:
            left = await _wait_empty(borrowed.node, min(GIVE_BACK_EMPTY_S, bound - waited), poll_s=LONG_POLL_S)
        if left.jobs:
            kept = render.kept_borrowed(borrowed.node, borrowed.from_pool, left, bound)
            await notify(s, "borrowed_node_kept", "critical", kept)
            return kept
    released = await act_run(act.RELEASE_BORROWED_NODE, borrowed, summary=f"{borrowed.node} leaves Slurm")
    back = await act_run(act.GIVE_BACK_NODE, borrowed, summary=f"{borrowed.node} back to {borrowed.from_pool}")
    return render.given_back(borrowed.node, len(jobs.jobs), left, released, back, s.give_back_by)


async def _wait_empty(name: str, within_s: float, poll_s: float = 0.5) -> JobList:
    empty = NodeEmptyWait(node=name, deadline_at=workflow.now().timestamp() + within_s, poll_s=poll_s)
    return await run_waiting(
        act.WAIT_FOR_NODE_EMPTY,
        empty,
        summary=f"wait for the jobs to leave {name}",
        deadline_s=within_s,
    )
