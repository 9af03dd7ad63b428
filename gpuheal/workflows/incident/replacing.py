"""The incident's repair or replacement: the provider's repair (reset, reboot) or a new node,
its GPUs validated before it takes jobs, and while no spare comes, a node borrowed from the
inference pool as a bridge, given back once the replacement is in. Each function is a stage."""

from __future__ import annotations

from functools import partial

from temporalio import workflow

from gpuheal.workflows.incident import borrowing, capacity, jobs, node
from gpuheal.workflows.incident.state import IncidentState
from gpuheal.workflows.incident.timeline import in_stage, notify

with workflow.unsafe.imports_passed_through():
    from gpuheal.core import render
    from gpuheal.core.models.base import ActionClass, Stage


async def repair_or_replace(s: IncidentState, repair: ActionClass) -> bool:
    """False: no replacement (that passed its validation) came within the capacity bound."""
    async with in_stage(s, Stage.REPAIR) as rec:
        if repair != ActionClass.REPLACE_NODE:
            repair, rec.outcome = await node.repair(s, repair)
        if repair == ActionClass.REPLACE_NODE:
            s.replacement = await node.replace(s)
            new = s.replacement.new_node
            rec.outcome = render.replaced(new, s.ref.node) if new else s.replacement.no_capacity
    await validate_new_node(s)
    got, first = True, True
    while s.replacement is not None and s.replacement.new_node is None:
        # No spare, or the new node's GPUs failed (it is drained, rejected): wait for another.
        if len(s.rejected) >= node.MAX_REJECTED or s.unvalidated is not None:
            got = False
            break
        if first and s.settings.borrow is not None and s.kube is not None:
            await borrow(s)  # a bridge until the replacement comes
        first = False
        if not await capacity.await_capacity(s, partial(node.replace, s)):
            got = False
            break
        await validate_new_node(s)
    if s.borrowed is not None:
        await give_back(s)  # its jobs move to the new node (validated), or wait in line
    if not got:
        return False
    if s.capacity_back_at is None:
        s.capacity_back_at = workflow.now()
    return True


async def validate_new_node(s: IncidentState) -> None:
    """Where validation is on, a replacement takes jobs only once its GPUs passed; one that
    failed leaves the replacement "no capacity" again (its reason says why)."""
    if node.new_node_to_validate(s) is None:
        return
    async with in_stage(s, Stage.VALIDATE) as rec:
        passed = await node.validate_new_node(s)
        assert s.replacement is not None
        rec.outcome = s.new_node_verdict.detail if passed and s.new_node_verdict else s.replacement.no_capacity


async def borrow(s: IncidentState) -> None:
    """No spare: take a node from the inference pool (never below its minimum) into Slurm."""
    async with in_stage(s, Stage.BORROW) as rec:
        rec.outcome = await borrowing.borrow(s)
        if s.borrowed is not None:
            await notify(s, "borrowed", "warning", rec.outcome)


async def give_back(s: IncidentState) -> None:
    async with in_stage(s, Stage.GIVE_BACK) as rec:
        rec.outcome = await borrowing.give_back(s, partial(jobs.hand_over_from, s))
