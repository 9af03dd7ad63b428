"""FleetCoordinator: one per cluster, the keeper of its policy and of what gpuheal has taken out.

Every incident is admitted by it (the cluster's policy and version, the circuit breaker, the
node's domain, repeat offenders) and asks it before taking capacity out of service; it grants
within the disruption budget or holds the incident in line, and grants held ones as capacity
comes back. Everything it decides is an update (recorded in its history, idempotent per incident:
a retried or replayed request never counts twice) and every decision comes from gpuheal.core.fleet
(pure). Operators steer it with updates too: pause, resume, set the mode or the policy,
override a hold. It continues as new when its history grows long, carrying its whole state.

Its parts (state, the rebuild and the look for closed runs, sending, the memo) are
workflows/coordinator/; its domain incidents are workflows/domain.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime, timedelta

from temporalio import workflow

from gpuheal.workflows import gate
from gpuheal.workflows.coordinator import reconcile, sending
from gpuheal.workflows.coordinator.state import CoordinatorState
from gpuheal.workflows.coordinator.versions import (
    APP_FAULTS_APART,
    BOOKS,
    CONTAIN_WITH_REQUEST,
    COORDINATOR_2,
    COORDINATOR_3,
    COUNTS_LEFT,
    GRANTS_WITHIN_ALL_OUT,
    HISTORY_BYTES_LIMIT,
    HISTORY_LIMIT,
    HISTORY_LIMIT_PACKED,
    KEEP_CONTAINED,
    MOVE_ON_SIGNAL,
    OWN_QUEUE,
    OWN_WORKFLOW_QUEUE,
    PACK_CARRIED,
    PACKED,
    PUBLISHES,
    REBUILD,
    RETURN_KEEPS_COUNT,
    SERVE_WHEN_FREED,
    VIEW,
)

with workflow.unsafe.imports_passed_through():
    from gpuheal.core import ids
    from gpuheal.core import messages as m
    from gpuheal.core.fleet import admitting, containment, coordination, packing, reaping, steering
    from gpuheal.core.fleet import view as fleet_view
    from gpuheal.core.fleet.models import (
        ADMIT_BATCH_MOST,
        BATCH_MOST,
        Admission,
        Admissions,
        AdmitBatch,
        AdmitBatchAnswers,
        AdmitRequest,
        AdmitRequests,
        CapacityDecision,
        CapacityDecisions,
        CapacityRequest,
        CapacityRequests,
        CoordinatorInput,
        DomainDecision,
        FleetState,
        FleetStatus,
        NodeReturn,
        OperatorAction,
        Override,
        ReleaseRequest,
    )
    from gpuheal.core.fleet.policy import ConfiguredPolicy, ModeChange, PolicyChange, VersionedPolicy


def _input(inp: object) -> CoordinatorInput:
    """The SDK applies a run's type hints only when the arguments match them in number: a start
    (the input alone) brings it as a dict."""
    return inp if isinstance(inp, CoordinatorInput) else CoordinatorInput.model_validate(inp)


@workflow.defn(name=m.COORDINATOR.name)
class FleetCoordinator:
    @workflow.init
    def __init__(self, inp: CoordinatorInput, packed: bytes = b"") -> None:
        """`packed`: the state carried by a coordinator from PACKED on (gpuheal.core.fleet.packing);
        earlier ones carried it whole in `inp.state`."""
        inp = _input(inp)
        if packed:
            inp = inp.model_copy(update={"state": packing.unpack(packed)})
        seed = VersionedPolicy(
            version=1,
            policy=inp.seed,
            changed_by="gpuheal",
            reason="the worker's configuration, when the first incident came",
            at=workflow.now(),
        )
        self._c = CoordinatorState(
            fleet=inp.state or FleetState(cluster=inp.cluster, policy=seed, configured=inp.seed_digest),
            seed=inp.seed,
            notes=list(inp.notes),  # carried across continue-as-new, still to go out
            domains=list(inp.domains),
            on_own_queue=inp.on_own_queue,  # (a move signal in the first task finds it)
            rebuilding=inp.state is None,  # a fresh start may be a recreation: rebuild first (run())
        )
        # A rule of this run, never carried; decided here, before any handler of the first task
        # decides (the SDK runs them before run() starts).
        if not workflow.patched(GRANTS_WITHIN_ALL_OUT):
            self._s.decide_grants_by_the_budget_alone()

    @property
    def _s(self) -> FleetState:
        """The cluster's state, which every decision takes (continue-as-new carries it)."""
        return self._c.fleet

    @workflow.run
    async def run(self, inp: CoordinatorInput, packed: bytes = b"") -> None:
        self._c.packed = workflow.patched(PACKED)
        self._c.publishes = workflow.patched(PUBLISHES)
        queue = workflow.info().task_queue
        if workflow.patched(OWN_QUEUE):  # decided once per run: its activities all go one way
            self._c.own_queue = ids.coordinator_queue(queue)
        if workflow.patched(OWN_WORKFLOW_QUEUE):
            self._c.on_own_queue = True
            if not _input(inp).on_own_queue:  # started on the cluster's queue: moves now (_long)
                self._c.move_to = ids.coordinator_queue(queue)
            else:  # (a move signal handled before run() started asked for nothing)
                self._c.move_to = None
        if workflow.patched(VIEW):
            self._c.showing = asyncio.ensure_future(self._c.show())  # beside the loop, for the whole run
        if self._c.rebuilding and workflow.patched(REBUILD):
            await reconcile.rebuild(self._c)
        self._c.rebuilding = False
        while True:
            await self._wait()
            await sending.send(self._c)
            if self._long() and not self._c.pending():
                await workflow.wait_condition(workflow.all_handlers_finished)
                if not self._c.pending():  # what is still on its way goes on in the next run
                    carried = self._c.carried()
                    args: list[object] = [carried]
                    # Compact and compressed (a fleet's week stays far below 2 MiB); a run started
                    # before PACKED packs too when it carries on (its own marker, at that moment).
                    if self._c.packed or workflow.patched(PACK_CARRIED):
                        packed_ = await self._c.pack_carried()
                        if packed_ is None:
                            continue  # not this time (CoordinatorState.pack_carried, pack: why)
                        args = [carried.model_copy(update={"state": None}), packed_]
                    # A new current build (gpuheal rollout): the next run starts on it. Pinned
                    # to its build like every workflow of a versioned worker, the coordinator
                    # moves up this way, its state carried, whatever the new build changed.
                    upgrade = workflow.info().is_target_worker_deployment_version_changed()
                    workflow.continue_as_new(
                        args=args,
                        task_queue=self._c.move_to,  # None: where it runs
                        initial_versioning_behavior=workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE
                        if upgrade
                        else workflow.ContinueAsNewVersioningBehavior.UNSPECIFIED,
                    )

    async def _wait(self) -> None:
        """Until there is something to send, or a held incident's limit frees by time alone (a
        cooldown ends, the rate's window slides): then the line is served again. A handler that
        moves that moment (a new hold, a release) wakes the loop to set its timer anew."""
        if not workflow.patched(COORDINATOR_2):
            await workflow.wait_condition(lambda: self._c.pending() or self._long())
            return
        if workflow.patched(SERVE_WHEN_FREED) and coordination.frees_due(self._s, workflow.now()):
            # A moment that passed while the loop was away (sending notices): next_wake no longer
            # sees it, and requests serve only what they free themselves.
            self._c.apply(coordination.serve_freed(self._s, workflow.now()))
            return
        reaps, books = workflow.patched(COORDINATOR_3), workflow.patched(BOOKS)

        def wakes() -> tuple[datetime | None, datetime | None, datetime | None]:
            serve = coordination.next_wake(self._s, workflow.now())
            left = reconcile.check_left_at(self._c) if books else None
            return serve, (reconcile.reap_at(self._c) if reaps else None), left

        serve, reap, left = wakes()
        times = [t for t in (serve, reap, left) if t is not None]

        def moved() -> bool:
            return wakes() != (serve, reap, left)

        if not times:
            await workflow.wait_condition(lambda: self._c.pending() or self._long() or moved())
            return
        if min(times) > workflow.now():
            await gate.wait_for(
                lambda: True if self._c.pending() or self._long() or moved() else None,
                within=min(times) - workflow.now(),
                summary="a held incident's cooldown or rate window ends, or a look for closed runs",
            )
        now = workflow.now()  # however the wait ended (an admit may land just after the moment)
        if serve is not None and now >= serve:
            self._c.apply(coordination.serve_queue(self._s, now))
        if reap is not None and now >= reap and not self._c.reaping:
            reconcile.reap(self._c, reaping.start_reap(self._s, now))
        elif left is not None and now >= left and not self._c.reaping:  # a held incident: are they back?
            reaping.start_left_check(self._s, now)
            reconcile.reap(self._c, [], closed_runs=False)

    def _long(self) -> bool:
        """Time for a new run: a long history, a new current build to move to (versioned
        workers only: the flag comes with the task after `gpuheal rollout`), or its own queue
        to move to (a run started on the cluster's, OWN_WORKFLOW_QUEUE)."""
        info = workflow.info()
        if info.get_current_history_length() < self._c.carry_after:
            return False  # its state was too big to carry a moment ago (reconcile.pack)
        if self._c.move_to is not None:
            return self._c.look_again is None or self._c.look_again.done()  # a rebuild's second look first
        if self._c.packed and info.get_current_history_size() > HISTORY_BYTES_LIMIT:
            return True
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() > (HISTORY_LIMIT_PACKED if self._c.packed else HISTORY_LIMIT)
            or info.is_target_worker_deployment_version_changed()
        )

    # --- incidents (each handler one pure state change, gpuheal.core.fleet.coordination) ------------

    @workflow.update(name=m.FLEET_ADMIT.name)
    def admit(self, req: AdmitRequest) -> Admission:
        """A new incident: its arrival counts (once), the breaker and the domains are checked."""
        return self._admit(req)

    @workflow.update(name=m.FLEET_ADMIT_MANY.name)
    def admit_many(self, reqs: AdmitRequests) -> Admissions:
        """Admissions that queued in one worker, decided in this one task, in their order: a
        storm no longer waits for one workflow task per incident (10 updates in flight at most)."""
        return Admissions(answers=tuple(self._admit(r) for r in reqs.requests))

    @admit_many.validator
    def _validate_admit_many(self, reqs: AdmitRequests) -> None:
        _validate_batch(self._s.cluster, [r.cluster for r in reqs.requests])

    @workflow.update(name=m.FLEET_ADMIT_AND_REQUEST_MANY.name)
    def admit_and_request_many(self, batch: AdmitBatch) -> AdmitBatchAnswers:
        """Admissions with their capacity requests, one decision per incident, in one task
        (gpuheal.core.fleet.admitting). A new update, so no patch: no history without it replays
        here. Capacity is decided only once the books are rebuilt: meanwhile the admissions are
        answered at once (never held up as requests are) and those incidents ask as before."""
        answers, out = admitting.admit_and_request_many(
            self._s,
            batch.requests,
            workflow.now(),
            decide_capacity=not self._c.rebuilding,
            counts_left=self._counts(),
            serve_when_freed=workflow.patched(SERVE_WHEN_FREED),
            compact=workflow.patched(PACKED),
            app_faults_apart=workflow.patched(APP_FAULTS_APART),
        )
        self._c.apply(out)
        return AdmitBatchAnswers(answers=tuple(answers))

    @admit_and_request_many.validator
    def _validate_admit_and_request_many(self, batch: AdmitBatch) -> None:
        _validate_batch(self._s.cluster, [i.admit.cluster for i in batch.requests], ADMIT_BATCH_MOST)

    def _admit(self, req: AdmitRequest) -> Admission:
        answer, out = coordination.admit(
            self._s,
            req,
            workflow.now(),
            serve_when_freed=workflow.patched(SERVE_WHEN_FREED),
            compact=workflow.patched(PACKED),
            app_faults_apart=workflow.patched(APP_FAULTS_APART),
        )
        self._c.apply(out)
        return answer

    async def _rebuilt(self) -> None:
        """Capacity is decided only once a fresh coordinator has rebuilt what the open incidents
        hold (else the incident that started it could be granted past a budget it does not
        know is used). Coordinators of earlier releases never wait here: no await, as before.
        From BOOKS on, a wait is bounded (updates waiting hold Temporal's ten in-flight slots):
        once the rebuild has failed (the breaker is tripped then), or past REBUILD_WAIT_S (it is
        tripped then), the update is decided behind the breaker (held)."""
        if not self._c.rebuilding:
            return
        if not workflow.patched(BOOKS):
            await workflow.wait_condition(lambda: not self._c.rebuilding)
            return
        try:
            within = timedelta(seconds=reconcile.REBUILD_WAIT_S)
            await workflow.wait_condition(lambda: not self._c.rebuilding or self._c.rebuild_failing, timeout=within)
        except TimeoutError:
            reconcile.not_rebuilt_yet(self._c)

    @workflow.update(name=m.FLEET_REQUEST_CAPACITY.name)
    async def request_capacity(self, req: CapacityRequest) -> CapacityDecision:
        """May this incident take its node out of service now? Idempotent: asked again, the same
        answer (granted, or its place in line)."""
        await self._rebuilt()
        return self._request(req)

    @workflow.update(name=m.FLEET_REQUEST_CAPACITY_MANY.name)
    async def request_capacity_many(self, reqs: CapacityRequests) -> CapacityDecisions:
        """Requests that queued in one worker, decided in one task, in their order (as admit_many),
        the line served once for the whole batch."""
        await self._rebuilt()
        answers, out = coordination.request_many(
            self._s,
            reqs.requests,
            workflow.now(),
            tell_requester=not workflow.patched(COORDINATOR_2),
            counts_left=self._counts(),
            serve_when_freed=workflow.patched(SERVE_WHEN_FREED),
        )
        self._c.apply(out)
        return CapacityDecisions(answers=tuple(self._contained(reqs.requests, answers)))

    @request_capacity_many.validator
    def _validate_request_capacity_many(self, reqs: CapacityRequests) -> None:
        _validate_batch(self._s.cluster, [r.cluster for r in reqs.requests])

    def _request(self, req: CapacityRequest) -> CapacityDecision:
        answer, out = coordination.request(
            self._s,
            req,
            workflow.now(),
            tell_requester=not workflow.patched(COORDINATOR_2),
            counts_left=self._counts(),
            serve_when_freed=workflow.patched(SERVE_WHEN_FREED),
        )
        self._c.apply(out)
        return self._contained([req], [answer])[0]

    def _contained(self, reqs: Sequence[CapacityRequest], answers: list[CapacityDecision]) -> list[CapacityDecision]:
        """Held ones that asked (contain_if_held) hear their containment decision too, from
        CONTAIN_WITH_REQUEST on (before it, they ask the contain update, as they did)."""
        if not any(r.contain_if_held for r in reqs) or not workflow.patched(CONTAIN_WITH_REQUEST):
            return answers
        decided, out = containment.with_containment(self._s, reqs, answers, workflow.now(), self._counts())
        self._c.apply(out)
        return decided

    @workflow.update(name=m.FLEET_CONFIRM.name)
    async def confirm(self, req: CapacityRequest) -> CapacityDecision:
        """Before a replacement: the grant stands unless the breaker tripped or the domain escalated."""
        await self._rebuilt()
        old = not workflow.patched(COORDINATOR_2)
        answer, out = coordination.confirm(
            self._s, req, workflow.now(), contain=not old, tell_requester=old, counts_left=self._counts()
        )
        self._c.apply(out)
        return answer

    @workflow.update(name=m.FLEET_CONTAIN.name)
    async def contain(self, req: CapacityRequest) -> CapacityDecision:
        """May a held incident drain its node as containment? Within its bound, never while tripped."""
        await self._rebuilt()
        answer, out = coordination.contain(self._s, req, workflow.now(), counts_left=self._counts())
        self._c.apply(out)
        return answer

    async def _rebuilt_for_release(self) -> None:
        """A release waits for the rebuild too (from BOOKS on; bounded as requests are): applied
        before it, the rebuild would count again, from a listing taken earlier, what the release
        gave back (an over-count a look corrects; the breaker is tripped meanwhile)."""
        if self._c.rebuilding and workflow.patched(BOOKS):
            await self._rebuilt()

    def _counts(self) -> bool:
        """Whether this coordinator counts what stays drained in its decisions (COUNTS_LEFT)."""
        return workflow.patched(COUNTS_LEFT)

    @workflow.update(name=m.FLEET_RELEASE.name)
    async def release(self, incident_id: str) -> str:
        """The incident gave its node back: budget frees, the next in line may go. Idempotent."""
        await self._rebuilt_for_release()
        keep = workflow.patched(KEEP_CONTAINED)
        answer, out = coordination.release(self._s, incident_id, workflow.now(), keep_contained=keep)
        self._c.apply(out)
        return answer

    @workflow.update(name=m.FLEET_RELEASE_RUN.name)
    async def release_run(self, req: ReleaseRequest) -> str:
        """As release, for one run of the incident only, saying whether its node stays drained
        (sent by incidents of this release)."""
        await self._rebuilt_for_release()
        answer, out = coordination.release(
            self._s,
            req.incident_id,
            workflow.now(),
            req.run_id,
            left_drained=req.left_drained,
            placement=req.placement if workflow.patched(BOOKS) else None,
        )
        self._c.apply(out)
        return answer

    # --- operators --------------------------------------------------------------------------

    @workflow.signal(name=m.FLEET_MOVE.name)
    def move(self, why: str) -> None:
        """A run of the release before, taken over on the cluster's queue (its replay knows no
        OWN_WORKFLOW_QUEUE marker, so run() kept it there): onto its own queue now (_long). Decided
        from its own books, not the queue's name (a Replayer's differs)."""
        if not self._c.on_own_queue and workflow.patched(MOVE_ON_SIGNAL):
            self._c.on_own_queue = True
            self._c.move_to = ids.coordinator_queue(workflow.info().task_queue)
            workflow.logger.info("moving to its own task queue %s: %s", self._c.move_to, why)

    @workflow.signal(name=m.FLEET_WAKE.name)
    def wake(self, why: str) -> None:
        """Nothing to do: the task it brings is the point (a new current build: _long())."""

    @workflow.update(name=m.FLEET_PAUSE.name)
    def pause(self, by: OperatorAction) -> str:
        """Trip the breaker by hand: new incidents are held, nothing is replaced."""
        answer, out = steering.pause(self._s, by, workflow.now())
        self._c.apply(out)
        return answer

    @pause.validator
    def _validate_pause(self, by: OperatorAction) -> None:
        if self._s.breaker.tripped:
            raise ValueError(f"already tripped: {self._s.breaker.why}")

    @workflow.update(name=m.FLEET_RESUME.name)
    def resume(self, by: OperatorAction) -> str:
        """Reset the breaker (it never resets by itself); held incidents go on, within the budget."""
        answer, out = steering.resume(self._s, by, workflow.now())
        self._c.apply(out)
        return answer

    @resume.validator
    def _validate_resume(self, by: OperatorAction) -> None:
        if self._c.rebuilding:
            raise ValueError("the coordinator has not rebuilt its books from the open incidents yet: wait for it")
        if not self._s.breaker.tripped:
            raise ValueError("the circuit breaker is not tripped")

    @workflow.update(name=m.FLEET_SET_MODE.name)
    def set_mode(self, change: ModeChange) -> str:
        old = self._s.policy.policy.mode
        new = self._s.policy.policy.model_copy(update={"mode": change.mode})
        _, out = steering.set_policy(self._s, new, change.operator, change.reason, workflow.now(), serve=False)
        self._c.apply(out)
        return f"mode {old} -> {change.mode} (policy version {self._s.policy.version})"

    @workflow.update(name=m.FLEET_SET_POLICY.name)
    def set_policy(self, change: PolicyChange) -> str:
        answer, out = steering.set_policy(self._s, change.policy, change.operator, change.reason, workflow.now())
        self._c.apply(out)
        return answer

    @set_policy.validator
    def _validate_set_policy(self, change: PolicyChange) -> None:
        v = self._s.policy.version
        if change.expected_version is not None and change.expected_version != v:
            raise ValueError(
                f"the policy is at version {v} now, not {change.expected_version} (changed by "
                f"{self._s.policy.changed_by}: {self._s.policy.reason}); diff the file again"
            )

    @workflow.update(name=m.FLEET_CONFIGURE.name)
    def configure(self, c: ConfiguredPolicy) -> str:
        """A worker started: its configuration applies if it changed since the last one offered."""
        answer, out = steering.configure(self._s, c, workflow.now(), refuse_earlier=workflow.patched(BOOKS))
        self._c.apply(out)
        return answer

    @workflow.update(name=m.FLEET_OVERRIDE.name)
    def override(self, o: Override) -> str:
        """Let one held incident go now, past the budget (the operator answers for it)."""
        answer, out = steering.override(self._s, o, workflow.now())
        self._c.apply(out)
        return answer

    @override.validator
    def _validate_override(self, o: Override) -> None:
        if all(h.incident_id != o.incident_id for h in self._s.queue):
            raise ValueError(f"{o.incident_id} is not held (held: {[h.incident_id for h in self._s.queue]})")

    @workflow.update(name=m.FLEET_RETURN_NODE.name)
    def return_node(self, r: NodeReturn) -> str:
        """An operator returns a node an incident left drained (`gpuheal return`): counted until
        Slurm shows it back (before RETURN_KEEPS_COUNT: freed at once)."""
        keep = workflow.patched(BOOKS) and workflow.patched(RETURN_KEEPS_COUNT)  # (its looks come with BOOKS)
        answer, out = steering.return_node(self._s, r, workflow.now(), keep_counted=keep)
        self._c.apply(out)
        return answer

    @return_node.validator
    def _validate_return_node(self, r: NodeReturn) -> None:
        if self._c.rebuilding:
            raise ValueError("the coordinator has not rebuilt its books from the open incidents yet: wait for it")
        holder = steering.holder_of(self._s, r.node)
        if holder is not None:
            raise ValueError(f"{r.node} is held by open incident {holder}: abort or finish it, not return its node")

    @workflow.update(name=m.FLEET_DOMAIN_DECISION.name)
    def domain_decision(self, d: DomainDecision) -> str:
        """A domain incident's operator decided: release its node incidents (within the budget)
        or dismiss them (they end, the domain is handled as one)."""
        answer, out = steering.domain_decision(self._s, d, workflow.now())
        self._c.apply(out)
        return answer

    # --- seeing it --------------------------------------------------------------------------

    @workflow.query(name=m.FLEET_STATUS.name)
    def status(self) -> FleetStatus:
        return fleet_view.status(self._s, workflow.now())

    @workflow.query(name=m.FLEET_POLICY.name)
    def current_policy(self) -> VersionedPolicy:
        return self._s.policy


def _validate_batch(cluster: str, clusters: list[str], most: int = BATCH_MOST) -> None:
    """A batch is one worker's, for this cluster, within its most: refused whole otherwise
    (rejected before it reaches the history; the Batcher then sends its requests alone)."""
    if not 0 < len(clusters) <= most:
        raise ValueError(f"a batch holds 1 to {most} requests, not {len(clusters)}")
    if any(c != cluster for c in clusters):
        raise ValueError(f"a batch for coordinator {cluster!r} holds requests of {sorted(set(clusters) - {cluster})}")
