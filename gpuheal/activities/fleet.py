"""Fleet activities: an incident's side of the coordinator, and the coordinator's own actions.

`admit_incident` finds where the node sits (its pool and topology domains, and the sizes the
budget's shares are of) and asks the cluster's coordinator, starting it if it is the first
incident (update-with-start, seeded with this worker's configured policy); the answer carries the
cluster's policy and its version, which the incident records, and, when the incident asked, its
capacity decision (activities/admitting.py: one decision per incident). The others are one update
or one start each. Every call is idempotent on the coordinator's side (per incident).

Temporal accepts at most 10 updates in flight per workflow (`history.maxInFlightUpdates`) and
refuses the rest, so a storm of incidents asking at once would mostly be refused and retried
with backoff. A worker therefore sends at most GPUHEAL_COORDINATOR_UPDATES at a time and queues
the rest in its Batcher (activities/batching.py; with several workers, keep workers x this <= 8:
room for operators' own updates).
Admissions (with their capacity requests, up to ADMIT_BATCH_MOST) and capacity requests asked on
their own (up to BATCH_MOST) that queued meanwhile go together in the next update, decided in one
coordinator workflow task: a storm costs tasks per batch, not per incident.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from temporalio import activity
from temporalio.client import (
    WithStartWorkflowOperation,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from gpuheal.activities import interface as act
from gpuheal.activities.admitting import AdmitLines
from gpuheal.activities.batching import REPROBE_S, Batcher, I, O, refused_field, unknown_update
from gpuheal.activities.interface import implements
from gpuheal.clients.kube import POOL_LABEL, call
from gpuheal.clients.proc import beating
from gpuheal.clients.slurm import SlurmBackend
from gpuheal.core import ids, policy, queries
from gpuheal.core import search_attributes as sa
from gpuheal.core.fleet import packing, policy_file
from gpuheal.core.fleet.models import (
    AdmitAnswer,
    AdmitAsk,
    Admitting,
    CapacityDecision,
    CapacityRequest,
    CapacityRequests,
    CoordinatorInput,
    DomainDecisionFor,
    DomainIncident,
    DomainIncidentInput,
    OpenIncident,
    OpenIncidents,
    Placement,
    ReleaseRequest,
    RunRef,
    RunRefs,
)
from gpuheal.core.fleet.policy import FleetPolicy
from gpuheal.core.messages import (
    COORDINATOR,
    DOMAIN_INCIDENT,
    FLEET_CONFIRM,
    FLEET_CONTAIN,
    FLEET_DOMAIN_DECISION,
    FLEET_RELEASE,
    FLEET_RELEASE_RUN,
    FLEET_REQUEST_CAPACITY,
    FLEET_REQUEST_CAPACITY_MANY,
    INCIDENT,
    INCIDENT_STATUS,
    Update,
)
from gpuheal.core.models.base import Stage
from gpuheal.core.models.incident import RemediationSettings
from gpuheal.core.models.slurm import NodeInfo

PLACEMENT_TTL_S = 10.0
# The domains Slurm itself names (gpuheal.clients.slurm.parsers.parse_topology), where the
# cluster has no Kubernetes labels for them.
SLURM_DOMAINS = ("switch", "block")
SlurmTopology = Callable[[], Awaitable[dict[str, dict[str, str]]]]
# The error type of a refused reference to another cluster (not retried).
FOREIGN_CLUSTER = "ForeignCluster"
CLOSED_RUN_LOOKUPS = 16  # describes at once when the coordinator looks for closed runs
# Stages in which an incident holds nothing of the coordinator's yet (or any more): the rebuild
# does not ask their status (its visibility Stage is enough: it is upserted as a stage begins).
HOLDS_NOTHING = frozenset({Stage.TRIAGE.value, Stage.OBSERVE.value, Stage.CLOSE.value, Stage.DONE.value})


@implements(act.FIND_CLOSED_RUNS)
async def find_closed_runs(refs: RunRefs) -> RunRefs:
    """Which of these incident runs have closed (completed, failed, terminated, timed out,
    or gone past retention)? A run is its workflow id's chain from its first run id: a
    running workflow of that id with another first run is a later incident, and this one
    closed. What cannot be told (Temporal not answering) counts as running: it is asked
    again at the next look."""
    client, lookups = activity.client(), asyncio.Semaphore(CLOSED_RUN_LOOKUPS)
    # "Not found" reaps, so it must mean "gone": the coordinator asking must be found itself
    # (a wrong namespace, or a server failing over, would otherwise reap every live run).
    await client.get_workflow_handle(activity.info().workflow_id or "").describe()

    async def closed(ref: RunRef) -> bool:
        async with lookups:
            try:
                d = await client.get_workflow_handle(ref.incident_id).describe()
            except RPCError as err:
                return err.status == RPCStatusCode.NOT_FOUND
        if d.status != WorkflowExecutionStatus.RUNNING:
            return True
        first = d.raw_description.workflow_execution_info.first_run_id
        return bool(ref.run_id and first and first != ref.run_id)

    found = await asyncio.gather(*(closed(r) for r in refs.runs))
    return RunRefs(runs=tuple(r for r, gone in zip(refs.runs, found, strict=True) if gone))


async def first_run_id(client: Any, wf: Any, asking: asyncio.Semaphore) -> str:
    """The first run of an open incident's continue-as-new chain: the run its grant is keyed by
    (the incident asks with workflow.info().first_execution_run_id). Visibility gives it on some
    servers only (the Temporal cluster on PostgreSQL leaves it empty): else it is described.
    Keyed by a later run, the next look took the chain for closed and reaped its grant, and a
    person could return a node its incident still held (issue 37's hour, after a coordinator was
    terminated). Not answering: its current run (as before), the look asks again."""
    if wf.raw_info.first_run_id:
        return str(wf.raw_info.first_run_id)
    try:
        async with asking:
            described = await client.get_workflow_handle(wf.id, run_id=wf.run_id).describe()
    except RPCError as err:
        activity.logger.warning("%s could not be described (%s): keyed by its current run", wf.id, err)
        return str(wf.run_id)
    return str(described.raw_description.workflow_execution_info.first_run_id or wf.run_id)


class FleetActivities:
    def __init__(
        self,
        slurm: SlurmBackend,
        kube: Any | None,
        seed: FleetPolicy,
        settings: RemediationSettings,
        domain_labels: tuple[str, ...],
        updates: int,
        topology: SlurmTopology | None = None,
        cluster: str | None = None,
    ) -> None:
        self._cluster = cluster  # the worker's (GPUHEAL_CLUSTER): the only one it acts for
        self._slurm = slurm
        self._topology = topology  # Slurm's own domains, for a cluster without Kubernetes
        self._core = None
        if kube is not None:
            from kubernetes import client

            self._core = client.CoreV1Api(kube)
        self._seed = seed
        self._in_flight = asyncio.Semaphore(updates)
        self._admissions = AdmitLines(self._in_flight, self._start, seed)
        self._requests: dict[str, Batcher[CapacityRequest, CapacityDecision]] = {}
        # Per cluster: until when its coordinator (of the release before) is asked without contain_if_held
        self._contain_apart_until: dict[str, float] = {}
        self._listing_lock = asyncio.Lock()
        self._listing: tuple[float, dict[str, NodeInfo], dict[str, dict[str, str]]] | None = None
        self._settings = settings  # the worker's: timeouts, grace, Kubernetes; not the cluster's policy
        self._domain_labels = domain_labels

    def _own(self, cluster: str) -> str:
        """One cluster, one authority: a reference to another cluster's coordinator is refused, not
        retried (this worker's Slurm is not that cluster's, and its coordinator is not this one)."""
        if self._cluster is not None and cluster != self._cluster:
            raise ApplicationError(
                f"cluster {cluster!r} is not this worker's cluster {self._cluster!r}: refused",
                type=FOREIGN_CLUSTER,
                non_retryable=True,
            )
        return cluster

    @implements(act.ADMIT_INCIDENT)
    async def admit_incident(self, ask: AdmitAsk) -> AdmitAnswer:
        self._own(ask.cluster)
        placement = await self._placement(ask.node)
        if ask.no_domains:
            placement = placement.model_copy(update={"domains": {}})
        admitting = Admitting(
            incident_id=ask.incident_id,
            run_id=ask.run_id,
            cluster=ask.cluster,
            placement=placement,
            action=ask.action,
            what=ask.what,
            gpu_uuids=ask.gpu_uuids,
            gpu_serials=ask.gpu_serials,
            application_fault=ask.application_fault,
        )
        # Not where the incident maps its Kubernetes node after its admission: a grant held that long
        # in `triage` is one a recreated coordinator's rebuild would not count (it asks no status of
        # incidents in triage). There the incident asks for capacity once mapped, as before.
        asks = ask.ask_capacity and self._settings.kubernetes is None
        admission, decision = await self._admissions.admit(admitting, asks, ask.contain_if_held)
        return AdmitAnswer(admission=admission, settings=self._settings, placement=placement, decision=decision)

    def _start(self, cluster: str) -> WithStartWorkflowOperation[Any, Any]:
        """The cluster's coordinator, started by the first incident's admission (one use each)."""
        return WithStartWorkflowOperation(
            COORDINATOR.name,
            CoordinatorInput(
                cluster=cluster, seed=self._seed, seed_digest=policy_file.digest(self._seed), on_own_queue=True
            ),
            id=ids.coordinator_id(cluster),
            task_queue=ids.coordinator_queue(activity.info().task_queue),
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            static_summary=f"Fleet coordinator of cluster {cluster}: policy, disruption budget, circuit breaker",
        )

    # Requests start the coordinator too: one terminated since the admission is recreated (and
    # rebuilds before it decides) instead of the request failing until the incident gives up.
    async def _request_one(self, req: CapacityRequest) -> CapacityDecision:
        return await FLEET_REQUEST_CAPACITY.execute_with_start(activity.client(), req, self._start(req.cluster))

    async def _request_many(self, reqs: list[CapacityRequest]) -> list[CapacityDecision]:
        batch = CapacityRequests(requests=tuple(reqs))
        start = self._start(reqs[0].cluster)
        return list((await FLEET_REQUEST_CAPACITY_MANY.execute_with_start(activity.client(), batch, start)).answers)

    def _batcher(
        self,
        batchers: dict[str, Batcher[I, O]],
        cluster: str,
        many: tuple[str, Callable[[list[I]], Awaitable[list[O]]]],
        one: Callable[[I], Awaitable[O]],
    ) -> Batcher[I, O]:
        """The cluster's line for one kind of request (one coordinator per cluster)."""
        if cluster not in batchers:
            batchers[cluster] = Batcher(self._in_flight, many, one)
        return batchers[cluster]

    async def _listings(self) -> tuple[dict[str, NodeInfo], dict[str, dict[str, str]]]:
        """Slurm's nodes and the Kubernetes Nodes' labels, listed at most once per
        PLACEMENT_TTL_S by this worker, however many incidents arrive at once: sizes and
        memberships change slowly, and a storm would otherwise list the whole fleet per incident."""
        async with self._listing_lock:
            now = time.monotonic()
            if self._listing is None or now - self._listing[0] > PLACEMENT_TTL_S:
                nodes = await self._slurm.nodes()
                labels: dict[str, dict[str, str]] = {}
                if self._core is not None:
                    kube_nodes = (await call(self._core.list_node)).items
                    labels = {n.metadata.name: n.metadata.labels or {} for n in kube_nodes}
                elif self._topology is not None:
                    labels = await self._topology()  # {"gpu01": {"switch": "leaf1"}}
                self._listing = (now, nodes, labels)
            return self._listing[1], self._listing[2]

    async def _placement(self, node: str) -> Placement:
        """The node's pool (Kubernetes label, else its first Slurm partition) and domains (the
        configured node labels; without Kubernetes, Slurm's leaf switch and block), with the
        sizes a share is of."""
        nodes, labels = await self._listings()
        info = nodes.get(node)
        pool = info.partitions[0] if info is not None and info.partitions else "default"
        pool_size = sum(1 for n in nodes.values() if pool in n.partitions) or 1
        domains: dict[str, int] = {}
        mine = labels.get(node, {})
        if self._core is not None and POOL_LABEL in mine:
            pool = mine[POOL_LABEL]
            pool_size = sum(1 for lab in labels.values() if lab.get(POOL_LABEL) == pool)
        for key in self._domain_labels if self._core is not None else SLURM_DOMAINS:
            if key in mine:
                size = sum(1 for lab in labels.values() if lab.get(key) == mine[key])
                domains[f"{key}={mine[key]}"] = size
        return Placement(node=node, cluster_size=max(1, len(nodes)), pool=pool, pool_size=pool_size, domains=domains)

    async def _update(self, cluster: str, update: Update[I, O], arg: I) -> O:
        """One update of the cluster's coordinator (confirm, contain, release: not the storm's
        admissions and grants), within this worker's share of its in-flight limit; the activity
        heartbeats while it waits its turn and the answer."""

        async def in_turn() -> O:
            async with self._in_flight:
                return await update.execute(self._coordinator(cluster), arg)

        self._own(cluster)
        return await beating(in_turn(), f"waiting for the coordinator ({update.name})")

    @staticmethod
    def _coordinator(cluster: str) -> WorkflowHandle[Any, Any]:
        """The cluster's coordinator (its workflow id, one per cluster)."""
        return activity.client().get_workflow_handle(ids.coordinator_id(cluster))

    @implements(act.REQUEST_CAPACITY)
    async def request_capacity(self, req: CapacityRequest) -> CapacityDecision:
        self._own(req.cluster)
        line = self._batcher(
            self._requests, req.cluster, (FLEET_REQUEST_CAPACITY_MANY.name, self._request_many), self._request_one
        )
        alone = req.model_copy(update={"contain_if_held": False})
        if req.contain_if_held and time.monotonic() < self._contain_apart_until.get(req.cluster, 0.0):
            return await line.ask(alone)  # its coordinator refused the field a moment ago
        try:
            return await line.ask(req)  # no heartbeat: workflows/incident/capacity.py says why
        except WorkflowUpdateFailedError as err:
            # A worker of the release before runs the coordinator (a rollout half done): it forbids
            # the field. Asked as that release asks (the incident asks `contain` after, as it did),
            # and so for REPROBE_S, so a storm's batches stay batches meanwhile.
            if not (req.contain_if_held and refused_field(err, "contain_if_held")):
                raise
            self._contain_apart_until[req.cluster] = time.monotonic() + REPROBE_S
            return await line.ask(alone)

    @implements(act.CONFIRM_CAPACITY)
    async def confirm_capacity(self, req: CapacityRequest) -> CapacityDecision:
        """Before a replacement: does the grant still stand (no breaker tripped, no domain
        incident opened since)?"""
        return await self._update(req.cluster, FLEET_CONFIRM, req)

    @implements(act.RELEASE_CAPACITY)
    async def release_capacity(self, req: ReleaseRequest) -> str:
        if not req.run_id:  # scheduled by an incident of an earlier release
            return await self._update(req.cluster, FLEET_RELEASE, req.incident_id)
        try:
            return await self._update(req.cluster, FLEET_RELEASE_RUN, req)
        except WorkflowUpdateFailedError as err:
            # A worker of the release before runs the coordinator (a rollout half done): it knows
            # only `release` (whatever the incident holds; a contained node counts as left).
            if not unknown_update(err, FLEET_RELEASE_RUN.name):
                raise
            return await self._update(req.cluster, FLEET_RELEASE, req.incident_id)

    @implements(act.CONTAIN_WHILE_HELD)
    async def contain_while_held(self, req: CapacityRequest) -> CapacityDecision:
        """May this held incident drain its node so nothing new lands on it?"""
        return await self._update(req.cluster, FLEET_CONTAIN, req)

    # The coordinator's own look for closed runs needs nothing of a worker's but its client.
    find_closed_runs = staticmethod(find_closed_runs)

    @implements(act.FIND_NODES_LEFT_DRAINED)
    async def find_nodes_left_drained(self, refs: RunRefs) -> RunRefs:
        """Which of these closed runs' nodes Slurm still shows drained by their incident (its
        drain reason names it): those stay counted against the budget. Listed afresh, never from
        the placements' cache: a drain made since that listing would read as back in service."""
        nodes = await self._slurm.nodes()
        return RunRefs(
            runs=tuple(
                r
                for r in refs.runs
                if (n := nodes.get(r.node)) is not None and n.drained and policy.is_our_drain(n.reason, r.incident_id)
            )
        )

    @implements(act.FIND_OPEN_INCIDENTS)
    async def find_open_incidents(self, cluster: str) -> OpenIncidents:
        """The cluster's running incidents (visibility), each with its stage and whether it
        drained its node (its status query), and where its node sits; every node Slurm shows
        drained by gpuheal; and how the coordinator's earlier run ended, if visibility shows
        it yet. Listed whether or not an earlier run is visible: a coordinator recreated within
        a second of its termination does not see it closed yet. One that does not answer counts
        as visibility shows it, contained if held: a rebuilt coordinator must over-count, never
        under. It heartbeats: thousands of status queries on a loaded server take a while."""
        return await beating(self._find_open_incidents(self._own(cluster)), "listing the open incidents")

    @implements(act.FIND_OPEN_INCIDENTS_PACKED)
    async def find_open_incidents_packed(self, cluster: str) -> bytes:
        """find_open_incidents, packed: a fleet's worth of open incidents within Temporal's
        limit on an activity's result (gpuheal.core.fleet.packing.pack_listing)."""
        found = await beating(self._find_open_incidents(self._own(cluster)), "listing the open incidents")
        return packing.pack_listing(found)

    async def _find_open_incidents(self, cluster: str) -> OpenIncidents:
        client = activity.client()
        earlier = queries.where(
            queries.eq(queries.WORKFLOW_ID, ids.coordinator_id(cluster)), queries.not_status("Running")
        )
        ended = [
            f"{wf.status.name.title() if wf.status else '?'} at {wf.close_time:%Y-%m-%d %H:%M:%S}"
            async for wf in client.list_workflows(earlier, limit=1)
        ]
        query = queries.where(queries.of_type(INCIDENT), queries.eq(sa.CLUSTER, cluster), queries.status("Running"))
        listed = [wf async for wf in client.list_workflows(query)]
        asking = asyncio.Semaphore(CLOSED_RUN_LOOKUPS)

        async def where(wf: Any) -> OpenIncident | None:
            node, stage = wf.typed_search_attributes.get(sa.NODE), wf.typed_search_attributes.get(sa.STAGE)
            if node is None or stage not in {s.value for s in Stage} or stage in HOLDS_NOTHING:
                return None  # (not asked: a storm's first coordinator would query a thousand triaging)
            # Its own status says where it is (visibility's Stage is the last stage entered: a
            # held incident shows `drain` while and after it is contained) and whether its action
            # takes capacity; one that does not answer is taken as visibility says, over-counted.
            contained, takes = stage == Stage.HELD, True
            try:
                async with asking:
                    status = await INCIDENT_STATUS.ask(INCIDENT.handle(client, wf.id))
                drained = any(r.stage == Stage.DRAIN for r in status.stages)
                # Held while it drains as containment: its stage says `drain`, its hold is still open.
                stage = Stage.HELD.value if status.held is not None else status.stage.value
                contained = stage == Stage.HELD and (drained or status.stage == Stage.DRAIN)
                plan = policy.plan_for(status.action) if status.action is not None else None
                takes = plan is None or plan.drain or plan.repair is not None or drained
            except Exception as err:
                activity.logger.warning("%s did not answer its status (%s): counted as visibility shows it", wf.id, err)
            return OpenIncident(
                incident_id=wf.id,
                run_id=await first_run_id(client, wf, asking),
                placement=await self._placement(node),
                stage=Stage(stage),
                contained=contained,
                takes_capacity=takes,
                since=wf.start_time,
            )

        found = [o for o in await asyncio.gather(*(where(wf) for wf in listed)) if o is not None]
        # Every node Slurm shows drained by its incident: the rebuild counts those that no open
        # incident's grant or containment counts (one ended not granted, without capacity, or was
        # terminated; one still running but closing, or a new run held on its node), as left.
        # Listed afresh (not the placements' cache): a drain made since would go uncounted. Slurm
        # not answering does not hold the rebuild up (that would hold every decision): the books
        # are rebuilt from the incidents, and the breaker stays tripped, saying so.
        try:
            nodes = await self._slurm.nodes()
        except Exception as err:
            activity.logger.warning("the rebuild could not list Slurm's nodes: %s", err)
            return OpenIncidents(incidents=tuple(found), earlier_run=ended[0] if ended else "", drains_unread=str(err))
        left = []
        for name, n in sorted(nodes.items()):
            incident = ids.incident_id(cluster, name)
            if n.drained and policy.is_our_drain(n.reason, incident):
                where_ = await self._placement(name)
                left.append(OpenIncident(incident_id=incident, run_id="", placement=where_, stage=Stage.DONE))
        return OpenIncidents(incidents=tuple(found), earlier_run=ended[0] if ended else "", left=tuple(left))

    @implements(act.OPEN_DOMAIN_INCIDENT)
    async def open_domain_incident(self, incident: DomainIncident) -> str:
        self._own(incident.cluster)
        try:
            await activity.client().start_workflow(
                DOMAIN_INCIDENT.name,
                DomainIncidentInput(cluster=incident.cluster, incident=incident),
                id=incident.incident_id,
                task_queue=ids.workflows_queue(activity.info().task_queue),  # run by the coordinator's own
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                static_summary=f"Domain incident: {incident.domain} ({len(incident.nodes)} nodes)",
            )
        except WorkflowAlreadyStartedError:
            return f"{incident.incident_id} already open"
        return f"{incident.incident_id} opened"

    @implements(act.DECIDE_DOMAIN)
    async def decide_domain(self, d: DomainDecisionFor) -> str:
        return await self._update(d.cluster, FLEET_DOMAIN_DECISION, d.decision)
