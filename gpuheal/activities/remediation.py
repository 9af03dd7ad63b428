"""The node activities: look up, drain, repair or replace, check, resume, decommission, notify.

Each activity reads the current state before it acts (is the node drained already? has this
incident a spare already?), so a retry after a worker crash does nothing twice. Bad input fails
fast with a non-retryable ApplicationError whose message names what was wrong. The job
activities (checkpoint, requeue, verify, owners) are in activities/jobs.py.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from temporalio import activity
from temporalio.exceptions import ApplicationError

from gpuheal.activities import interface as act
from gpuheal.activities.interface import implements
from gpuheal.clients.notify import Notifier
from gpuheal.clients.slurm import NodeOutOfService, SlurmBackend, UnknownNode
from gpuheal.core import policy, queries
from gpuheal.core import search_attributes as sa
from gpuheal.core.errors import NODE_NOT_IN_SERVICE, UNKNOWN_NODE
from gpuheal.core.messages import INCIDENT
from gpuheal.core.models.base import ActionClass
from gpuheal.core.models.kubernetes import BorrowedNode
from gpuheal.core.models.replacement import (
    EarlierReplacement,
    HealthCheckResult,
    RepairRequest,
    RepairResult,
    ReplacementLookup,
    ReplacementResult,
    ReplaceRequest,
)
from gpuheal.core.models.result import Notification, RemediationResult
from gpuheal.core.models.slurm import DrainRequest, DrainResult, JobList, NodeInfo, NodeRef
from gpuheal.providers.base import NodeProvider, NoSpareCapacity, run_key

log = logging.getLogger("gpuheal.remediation")
IncidentObserver = Callable[[RemediationResult], None]
# Holds a node out of service for a burn-in within a bound: ValidationActivities.hold.
NodeHolder = Callable[[str, str | None, float], Awaitable[None]]


class RemediationActivities:
    """Slurm, provider and notification activities. The clients are built by the worker and
    injected; `on_closed` is how a closed incident reaches the worker's metrics."""

    def __init__(
        self,
        slurm: SlurmBackend,
        provider: NodeProvider,
        notifier: Notifier,
        on_closed: IncidentObserver,
        holder: NodeHolder | None = None,
    ) -> None:
        self._slurm = slurm
        self._provider = provider
        self._notifier = notifier
        self._on_closed = on_closed
        self._holder = holder

    @implements(act.LOOK_UP_SLURM_NODE)
    async def look_up_slurm_node(self, ref: NodeRef) -> NodeInfo:
        """Fail fast on a node Slurm does not know, before anything is touched."""
        try:
            return await self._slurm.node(ref.node)
        except UnknownNode as err:
            raise ApplicationError(f"cluster {ref.cluster!r}: {err}", type=UNKNOWN_NODE, non_retryable=True) from err
        except NodeOutOfService as err:
            raise ApplicationError(
                f"cluster {ref.cluster!r}: {err}", type=NODE_NOT_IN_SERVICE, non_retryable=True
            ) from err

    @implements(act.FIND_EARLIER_REPLACEMENT)
    async def find_earlier_replacement(self, ref: NodeRef) -> ReplacementLookup:
        """For a node Slurm no longer has in service: the last incident of it that replaced it,
        from Temporal (visibility, then that run's result), so a late report can say so."""
        client = activity.client()
        query = queries.where(
            queries.of_type(INCIDENT),
            queries.eq(sa.CLUSTER, ref.cluster),
            queries.eq(sa.NODE, ref.node),
            queries.eq(sa.ACTION, ActionClass.REPLACE_NODE.value),
            queries.status("Completed"),
        )
        # Most recently closed first: visibility's documented default order (as already_handled).
        async for wf in client.list_workflows(query, limit=20):
            result = await INCIDENT.handle(client, wf.id, run_id=wf.run_id).result(follow_runs=False)
            if result.replacement_node:
                earlier = EarlierReplacement(
                    node=ref.node,
                    replacement_node=result.replacement_node,
                    incident_id=wf.id,
                    run_id=wf.run_id,
                    closed_at=result.closed_at,
                )
                return ReplacementLookup(earlier=earlier)
        return ReplacementLookup()

    @implements(act.NOTIFY_OPERATORS)
    async def notify_operators(self, note: Notification) -> None:
        await self._notifier.send(note)

    @implements(act.LIST_JOBS_ON_NODE)
    async def list_jobs_on_node(self, ref: NodeRef) -> JobList:
        return JobList(jobs=tuple(await self._slurm.jobs_on_node(ref.node)))

    @implements(act.DRAIN_SLURM_NODE)
    async def drain_slurm_node(self, req: DrainRequest) -> DrainResult:
        ref = req.node
        node = await self._slurm.node(ref.node)
        if node.drained:
            ours = policy.is_our_drain(node.reason, ref.incident_id)
            return DrainResult(node=ref.node, drained_by_us=ours, already_drained=True, previous_reason=node.reason)
        await self._slurm.update_node(ref.node, "drain", req.reason)
        return DrainResult(node=ref.node, drained_by_us=True, already_drained=False)

    @implements(act.REPAIR_NODE)
    async def repair_node(self, req: RepairRequest) -> RepairResult:
        return await self._provider.repair(req.node.node, req.action)

    @implements(act.REPLACE_NODE)
    async def replace_node(self, req: ReplaceRequest) -> ReplacementResult:
        """A new node in place of the failed one; "no capacity" is an answer, not an error to
        retry thirty times: the workflow waits for capacity on its own, slower, cadence, and
        hands each try the last one's pool and start. With validation on, the new node is held
        before it joins where the provider can, else as soon as it is known."""
        earlier = req.earlier()
        held: set[str] = set()
        bound, holder = req.hold_for_validation_s, self._holder

        async def hold(new: str) -> None:
            assert bound is not None and holder is not None
            await holder(new, req.run_id, bound)
            held.add(new)

        holding = bound is not None and holder is not None
        try:
            key = run_key(req.incident_id, req.run_id)
            result = await self._provider.replace(req.node, key, earlier, hold if holding else None)
            if result.new_node in req.rejected:  # whatever a provider says: this run never takes it again
                raise NoSpareCapacity(f"the provider offered {result.new_node} again, which this run rejected")
            if holding and result.new_node and result.new_node not in held:
                try:  # the replacement is done: a failed hold must not undo it (validation reserves again)
                    await hold(result.new_node)
                except Exception as err:
                    log.warning("could not hold %s for its validation yet: %s", result.new_node, err)
            return result
        except NoSpareCapacity as err:
            searched = err.searched or earlier
            memory = searched.search() if searched is not None else {}
            return ReplacementResult(failed_node=req.node, new_node=None, no_capacity=str(err), **memory)

    @implements(act.CHECK_NODE_HEALTH)
    async def check_node_health(self, ref: NodeRef) -> HealthCheckResult:
        return await self._provider.check_health(ref.node)

    @implements(act.RESUME_SLURM_NODE)
    async def resume_slurm_node(self, ref: NodeRef) -> str:
        node = await self._slurm.node(ref.node)
        if not node.drained:
            return f"{ref.node} already in service ({node.state})"
        if not policy.is_our_drain(node.reason, ref.incident_id):
            # Someone else drained it (or re-drained it since): never undo their drain.
            return f"{ref.node} left drained: its drain is not ours ({node.reason!r})"
        if policy.failed_validation_detail(node.reason, ref.incident_id) is not None:
            # An earlier run of this incident failed its burn-in: for the vendor, never back to work.
            return f"{ref.node} {policy.KEPT_FOR_THE_VENDOR} ({node.reason!r})"
        await self._slurm.update_node(ref.node, "resume")
        return f"{ref.node} resumed"

    @implements(act.DECOMMISSION_NODE)
    async def decommission_node(self, ref: NodeRef) -> str:
        return await self._provider.decommission(ref.node, policy.drain_reason(ref.incident_id, "replaced"))

    @implements(act.ADOPT_BORROWED_NODE)
    async def adopt_borrowed_node(self, node: BorrowedNode) -> str:
        return await self._provider.adopt(node.node)

    @implements(act.RELEASE_BORROWED_NODE)
    async def release_borrowed_node(self, node: BorrowedNode) -> str:
        """Out of Slurm again (its jobs were moved off first), for the inference side."""
        if node.node not in await self._slurm.nodes():
            return f"{node.node} already out of Slurm"
        return await self._provider.release(node.node, policy.drain_reason(node.incident_id, policy.GIVES_BACK))

    @implements(act.RECORD_INCIDENT_METRICS)
    async def record_incident_metrics(self, result: RemediationResult) -> None:
        self._on_closed(result)
