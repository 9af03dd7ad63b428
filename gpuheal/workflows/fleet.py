"""FleetCoordinator: one per cluster, the keeper of its policy and of what gpuheal has taken out.

Every incident is admitted by it (the cluster's policy and version, the circuit breaker, the
node's domain, repeat offenders) and asks it before taking capacity out of service; it grants
within the disruption budget or holds the incident in line, and grants held ones as capacity
comes back. Everything it decides is an update (recorded in its history, idempotent per incident:
a retried or replayed request never counts twice) and every decision comes from gpuheal.core.fleet
(pure). Operators steer it with updates too: pause, resume, set the mode or the policy,
override a hold. It continues as new when its history grows long, carrying its whole state.

Its domain incidents are workflows/domain.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

from gpuheal.workflows import gate
from gpuheal.workflows.activity import run

with workflow.unsafe.imports_passed_through():
    from gpuheal.activities import interface as act
    from gpuheal.core import messages as m
    from gpuheal.core.fleet import coordination, reaping, steering
    from gpuheal.core.fleet import view as fleet_view
    from gpuheal.core.fleet.coordination import Effects
    from gpuheal.core.fleet.models import (
        BATCH_MOST,
        Admission,
        Admissions,
        AdmitRequest,
        AdmitRequests,
        Breaker,
        CapacityDecision,
        CapacityDecisions,
        CapacityRequest,
        CapacityRequests,
        CoordinatorInput,
        DomainDecision,
        DomainIncident,
        FleetState,
        FleetStatus,
        GrantNotice,
        Note,
        OperatorAction,
        Override,
        ReleaseRequest,
        RunRef,
        RunRefs,
    )
    from gpuheal.core.fleet.policy import ConfiguredPolicy, ModeChange, PolicyChange, VersionedPolicy
    from gpuheal.core.models.result import Notification

# Coordinators started before this release waited only for events (a held incident freed by time
# alone waited for the next one), awaited each notice in their loop (a notice receiver down failed
# them), served no one when a grant was taken back, and sent a grant notice to an incident that
# had its grant in the answer already. They keep doing so until they continue as new
# (workflow.patched: one id for all of it), so their histories replay.
COORDINATOR_2 = "coordinator-2-wakes-for-time-notices-beside-the-loop-serves-after-a-revoke"
# Coordinators started before this release never looked for closed runs (a run terminated while
# granted kept its grant); they keep so until they continue as new.
COORDINATOR_3 = "coordinator-3-reaps-closed-runs"
# Nor did they rebuild from the open incidents when started afresh (their own marker: a start
# is one moment, the reaping a way of running).
REBUILD = "coordinator-rebuilds-from-the-open-incidents"
# Nor did they keep their view in their memo (gpuheal.core.fleet.view): `gpuheal fleet` asks
# their query until they continue as new.
VIEW = "coordinator-keeps-its-view-in-its-memo"
# Nor did they count a node contained while held once its incident ended (it stays drained).
KEEP_CONTAINED = "coordinator-counts-a-contained-node-after-its-incident"
# Nor did they bound containment by everything out (grants, containments and left nodes against
# the budget plus the containment bound), nor keep a terminated run's node counted when its
# incident's next run asked.
COUNTS_LEFT = "coordinator-bounds-containment-by-all-out-and-keeps-a-dead-runs-node"
# Nor did they serve the line only when something frees (a request that freed nothing, in a
# storm, served a line of a thousand); they serve at every request until they continue as new.
SERVE_WHEN_FREED = "coordinator-serves-the-line-when-something-frees"
HISTORY_LIMIT = 4000  # events: continue as new well before Temporal suggests it


# A look for closed runs: describes, 16 at a time, of every holder (thousands in a storm).
LOOK: dict[str, Any] = {"timeout": timedelta(minutes=3), "attempts": 3}


@workflow.defn(name=m.COORDINATOR.name)
class FleetCoordinator:
    @workflow.init
    def __init__(self, inp: CoordinatorInput) -> None:
        seed = VersionedPolicy(
            version=1,
            policy=inp.seed,
            changed_by="gpuheal",
            reason="the worker's configuration, when the first incident came",
            at=workflow.now(),
        )
        self._s = inp.state or FleetState(cluster=inp.cluster, policy=seed, configured=inp.seed_digest)
        self._seed = inp.seed
        self._signals: list[tuple[str, GrantNotice]] = []  # to held incidents
        self._notes: list[Note] = []  # to the operators
        self._domains: list[DomainIncident] = list(inp.domains)  # domain incidents to open
        self._notes += list(inp.notes)  # carried across continue-as-new, still to go out
        self._on_way: dict[asyncio.Future[None], Note | DomainIncident] = {}  # running beside the loop
        self._undelivered: list[str] = []  # what could not be done, for the UI's details
        self._reaping = False  # a look for closed runs is on its way
        self._look: asyncio.Future[None] | None = None
        # A fresh start may be a recreation: nothing is granted until it has rebuilt (run()).
        self._rebuilding = inp.state is None
        self._reap_now = False  # a grant notice found its incident gone: look at once
        self._changed = True  # the memo's view is to be written (_show)
        self._showing: asyncio.Future[None] | None = None  # _show, for coordinators with VIEW

    @workflow.run
    async def run(self, inp: CoordinatorInput) -> None:
        if workflow.patched(VIEW):
            self._showing = asyncio.ensure_future(self._show())  # beside the loop, for the whole run
        if self._rebuilding and workflow.patched(REBUILD):
            await self._rebuild()
        self._rebuilding = False
        while True:
            await self._wait()
            await self._send()
            if self._long() and not self._pending():
                await workflow.wait_condition(workflow.all_handlers_finished)
                if not self._pending():  # what is still on its way goes on in the next run
                    notes = tuple(x for x in self._on_way.values() if not isinstance(x, DomainIncident))
                    domains = tuple(x for x in self._on_way.values() if isinstance(x, DomainIncident))
                    if self._reaping:  # a look on its way is not carried: the next run looks soon
                        self._s.reaped_at = None
                    carried = CoordinatorInput(
                        cluster=self._s.cluster, seed=self._seed, state=self._s, notes=notes, domains=domains
                    )
                    # A new current build (gpuheal rollout): the next run starts on it. Pinned
                    # to its build like every workflow of a versioned worker, the coordinator
                    # moves up this way, its state carried, whatever the new build changed.
                    upgrade = workflow.info().is_target_worker_deployment_version_changed()
                    workflow.continue_as_new(
                        carried,
                        initial_versioning_behavior=workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE
                        if upgrade
                        else workflow.ContinueAsNewVersioningBehavior.UNSPECIFIED,
                    )

    async def _wait(self) -> None:
        """Until there is something to send, or a held incident's limit frees by time alone (a
        cooldown ends, the rate's window slides): then the line is served again. A handler that
        moves that moment (a new hold, a release) wakes the loop to set its timer anew."""
        if not workflow.patched(COORDINATOR_2):
            await workflow.wait_condition(lambda: self._pending() or self._long())
            return
        if workflow.patched(SERVE_WHEN_FREED) and coordination.frees_due(self._s, workflow.now()):
            # A moment that passed while the loop was away (sending notices): next_wake no longer
            # sees it, and requests serve only what they free themselves.
            self._apply(coordination.serve_freed(self._s, workflow.now()))
            return
        reaps = workflow.patched(COORDINATOR_3)

        def wakes() -> tuple[datetime | None, datetime | None]:
            serve = coordination.next_wake(self._s, workflow.now())
            return serve, (self._reap_at() if reaps else None)

        serve, reap = wakes()
        times = [t for t in (serve, reap) if t is not None]

        def moved() -> bool:
            return wakes() != (serve, reap)

        if not times:
            await workflow.wait_condition(lambda: self._pending() or self._long() or moved())
            return
        if min(times) > workflow.now():
            await gate.wait_for(
                lambda: True if self._pending() or self._long() or moved() else None,
                within=min(times) - workflow.now(),
                summary="a held incident's cooldown or rate window ends, or a look for closed runs",
            )
        now = workflow.now()  # however the wait ended (an admit may land just after the moment)
        if serve is not None and now >= serve:
            self._apply(coordination.serve_queue(self._s, now))
        if reap is not None and now >= reap and not self._reaping:
            self._reap(reaping.start_reap(self._s, now))

    async def _rebuild(self) -> None:
        """Started afresh: incidents of the cluster may be open already (this coordinator was
        terminated by hand, or its namespace restored). What they hold is rebuilt from them
        (gpuheal.core.fleet.reaping.rebuild); one that cannot be listed trips the breaker too."""
        try:
            found = await run(
                act.FIND_OPEN_INCIDENTS, self._s.cluster, summary="rebuild from the open incidents", attempts=5
            )
        except ActivityError as err:
            why = (
                f"could not list the open incidents to rebuild from ({err.cause or err}): check them (`gpuheal fleet`)"
            )
            self._s.breaker = Breaker(tripped=True, at=workflow.now(), why=why, by="gpuheal")
            self._notes.append(("coordinator_rebuilt", "critical", why))
            return
        self._apply(Effects(notes=reaping.rebuild(self._s, found, workflow.now())))

    def _reap_at(self) -> datetime | None:
        if self._reaping:
            return None
        return workflow.now() if self._reap_now else reaping.reap_due(self._s, workflow.now())

    def _reap(self, runs: list[RunRef]) -> None:
        """Look for closed runs among those holding something, beside the loop, and give back
        what they hold (gpuheal.core.fleet.reaping.reap): their nodes that Slurm still shows drained
        by them stay counted. A look that fails is said in the details and made again at the
        next one; it never fails the coordinator."""
        self._reaping, self._reap_now = True, False

        async def look() -> None:
            try:
                closed = await run(
                    act.FIND_CLOSED_RUNS, RunRefs(runs=tuple(runs)), summary="look for closed runs", **LOOK
                )
                check = RunRefs(runs=(*closed.runs, *reaping.left_refs(self._s)))
                try:
                    drained = check
                    if check.runs:
                        drained = await run(act.FIND_NODES_LEFT_DRAINED, check, summary="still drained?", **LOOK)
                except ActivityError:  # Slurm not answering: every node counts as still drained
                    drained = check
                self._apply(coordination.reap(self._s, closed.runs, drained.runs, workflow.now()))
            except ActivityError as err:
                self._undelivered.append(f"look for closed runs failed: {err.cause or err}")
                self._details()
            finally:
                self._reaping = False

        self._look = asyncio.ensure_future(look())

    def _pending(self) -> bool:
        return bool(self._signals or self._notes or self._domains)

    def _long(self) -> bool:
        """Time for a new run: a long history, or a new current build to move to (versioned
        workers only: the flag comes with the task after `gpuheal rollout`)."""
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() > HISTORY_LIMIT
            or info.is_target_worker_deployment_version_changed()
        )

    async def _send(self) -> None:
        """What the updates decided, done: domain incidents, signals to held incidents, notices."""
        background = workflow.patched(COORDINATOR_2)
        while self._domains:
            domain = self._domains.pop(0)
            opening = run(act.OPEN_DOMAIN_INCIDENT, domain, summary=f"open domain incident {domain.domain}")
            if background:
                self._in_background(domain, opening, f"domain incident {domain.domain} not opened")
            else:
                await opening
        while self._signals:
            incident, notice = self._signals.pop(0)
            try:
                await m.INCIDENT_CAPACITY.send(workflow.get_external_workflow_handle(incident), notice)
            except Exception as err:  # the incident ended meanwhile: what it holds is reaped
                workflow.logger.info("incident %s not told (%s)", incident, err)
                self._reap_now = True
        while self._notes:
            item = self._notes.pop(0)
            event, severity, message = item
            note = Notification(
                incident_id=workflow.info().workflow_id,
                event=event,
                severity=severity,
                message=message,
                node="-",
                cluster=self._s.cluster,
                # The coordinator lives on: the same event recurs, each occurrence its own notice.
                key=f"{workflow.info().workflow_id}:{event}:{workflow.now().isoformat()}:{len(self._notes)}",
            )
            delivery = run(act.NOTIFY_OPERATORS, note, summary=f"notify: {event}")
            if background:
                self._in_background(item, delivery, f"notice {event} undelivered")
            else:
                await delivery
        self._details()

    def _in_background(self, item: Note | DomainIncident, call: Awaitable[object], failed: str) -> None:
        """Run an activity beside the loop: it retries on its own, and when it gives up the
        coordinator says so and goes on (a notice receiver down must never fail it: the breaker,
        the grants and the line would be lost with it). A domain incident that could not be
        opened is tried again: its rack's incidents wait for it."""

        async def attempt() -> None:
            try:
                await call
            except ActivityError as err:
                self._undelivered.append(f"{failed}: {err.cause or err}")
                workflow.logger.warning("%s: %s", failed, err.cause or err)
                if isinstance(item, DomainIncident):
                    self._domains.append(item)
                self._details()

        task = asyncio.ensure_future(attempt())
        self._on_way[task] = item
        task.add_done_callback(lambda done: self._on_way.pop(done, None))

    # --- incidents (each handler one pure state change, gpuheal.core.fleet.coordination) ------------

    def _apply(self, out: Effects) -> None:
        """What a state change asked for, queued for the loop to do (outside the handler)."""
        self._signals += out.signals
        self._notes += out.notes
        self._domains += out.domains
        self._details()

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

    def _admit(self, req: AdmitRequest) -> Admission:
        answer, out = coordination.admit(
            self._s, req, workflow.now(), serve_when_freed=workflow.patched(SERVE_WHEN_FREED)
        )
        self._apply(out)
        return answer

    async def _rebuilt(self) -> None:
        """Capacity is decided only once a fresh coordinator has rebuilt what the open incidents
        hold (else the incident that started it could be granted past a budget it does not
        know is used). Coordinators of earlier releases never wait here: no await, as before."""
        if self._rebuilding:
            await workflow.wait_condition(lambda: not self._rebuilding)

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
        self._apply(out)
        return CapacityDecisions(answers=tuple(answers))

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
        self._apply(out)
        return answer

    @workflow.update(name=m.FLEET_CONFIRM.name)
    async def confirm(self, req: CapacityRequest) -> CapacityDecision:
        """Before a replacement: the grant stands unless the breaker tripped or the domain escalated."""
        await self._rebuilt()
        old = not workflow.patched(COORDINATOR_2)
        answer, out = coordination.confirm(
            self._s, req, workflow.now(), contain=not old, tell_requester=old, counts_left=self._counts()
        )
        self._apply(out)
        return answer

    @workflow.update(name=m.FLEET_CONTAIN.name)
    async def contain(self, req: CapacityRequest) -> CapacityDecision:
        """May a held incident drain its node as containment? Within its bound, never while tripped."""
        await self._rebuilt()
        answer, out = coordination.contain(self._s, req, workflow.now(), counts_left=self._counts())
        self._apply(out)
        return answer

    def _counts(self) -> bool:
        """Whether this coordinator counts what stays drained in its decisions (COUNTS_LEFT)."""
        return workflow.patched(COUNTS_LEFT)

    @workflow.update(name=m.FLEET_RELEASE.name)
    def release(self, incident_id: str) -> str:
        """The incident gave its node back: budget frees, the next in line may go. Idempotent."""
        keep = workflow.patched(KEEP_CONTAINED)
        answer, out = coordination.release(self._s, incident_id, workflow.now(), keep_contained=keep)
        self._apply(out)
        return answer

    @workflow.update(name=m.FLEET_RELEASE_RUN.name)
    def release_run(self, req: ReleaseRequest) -> str:
        """As release, for one run of the incident only, saying whether its node stays drained
        (sent by incidents of this release)."""
        answer, out = coordination.release(
            self._s, req.incident_id, workflow.now(), req.run_id, left_drained=req.left_drained
        )
        self._apply(out)
        return answer

    # --- operators --------------------------------------------------------------------------

    @workflow.signal(name=m.FLEET_WAKE.name)
    def wake(self, why: str) -> None:
        """Nothing to do: the task it brings is the point (a new current build: _long())."""

    @workflow.update(name=m.FLEET_PAUSE.name)
    def pause(self, by: OperatorAction) -> str:
        """Trip the breaker by hand: new incidents are held, nothing is replaced."""
        answer, out = steering.pause(self._s, by, workflow.now())
        self._apply(out)
        return answer

    @pause.validator
    def _validate_pause(self, by: OperatorAction) -> None:
        if self._s.breaker.tripped:
            raise ValueError(f"already tripped: {self._s.breaker.why}")

    @workflow.update(name=m.FLEET_RESUME.name)
    def resume(self, by: OperatorAction) -> str:
        """Reset the breaker (it never resets by itself); held incidents go on, within the budget."""
        answer, out = steering.resume(self._s, by, workflow.now())
        self._apply(out)
        return answer

    @resume.validator
    def _validate_resume(self, by: OperatorAction) -> None:
        if not self._s.breaker.tripped:
            raise ValueError("the circuit breaker is not tripped")

    @workflow.update(name=m.FLEET_SET_MODE.name)
    def set_mode(self, change: ModeChange) -> str:
        old = self._s.policy.policy.mode
        new = self._s.policy.policy.model_copy(update={"mode": change.mode})
        _, out = steering.set_policy(self._s, new, change.operator, change.reason, workflow.now(), serve=False)
        self._apply(out)
        return f"mode {old} -> {change.mode} (policy version {self._s.policy.version})"

    @workflow.update(name=m.FLEET_SET_POLICY.name)
    def set_policy(self, change: PolicyChange) -> str:
        answer, out = steering.set_policy(self._s, change.policy, change.operator, change.reason, workflow.now())
        self._apply(out)
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
        answer, out = steering.configure(self._s, c, workflow.now())
        self._apply(out)
        return answer

    @workflow.update(name=m.FLEET_OVERRIDE.name)
    def override(self, o: Override) -> str:
        """Let one held incident go now, past the budget (the operator answers for it)."""
        answer, out = steering.override(self._s, o, workflow.now())
        self._apply(out)
        return answer

    @override.validator
    def _validate_override(self, o: Override) -> None:
        if all(h.incident_id != o.incident_id for h in self._s.queue):
            raise ValueError(f"{o.incident_id} is not held (held: {[h.incident_id for h in self._s.queue]})")

    @workflow.update(name=m.FLEET_DOMAIN_DECISION.name)
    def domain_decision(self, d: DomainDecision) -> str:
        """A domain incident's operator decided: release its node incidents (within the budget)
        or dismiss them (they end, the domain is handled as one)."""
        answer, out = steering.domain_decision(self._s, d, workflow.now())
        self._apply(out)
        return answer

    # --- seeing it --------------------------------------------------------------------------

    @workflow.query(name=m.FLEET_STATUS.name)
    def status(self) -> FleetStatus:
        return fleet_view.status(self._s, workflow.now())

    @workflow.query(name=m.FLEET_POLICY.name)
    def current_policy(self) -> VersionedPolicy:
        return self._s.policy

    def _details(self) -> None:
        """A state change: the view is drawn anew, by _show once for all the changes of this
        workflow task (a storm's task carries many); coordinators before VIEW draw it here."""
        if self._showing is None:
            workflow.set_current_details(fleet_view.details(self._view(), self._undelivered))
        self._changed = True

    def _view(self) -> fleet_view.FleetView:
        return fleet_view.view(fleet_view.status(self._s, workflow.now()), workflow.now())

    async def _show(self) -> None:
        """The view in the memo and the UI's details, written anew after state changes: `gpuheal
        fleet` reads the memo from the server, so it answers while this coordinator is too busy
        for a query (a storm). The memo only when a figure changed (each write is a history event)."""
        shown: dict[str, Any] | None = None
        while True:
            await workflow.wait_condition(lambda: self._changed)
            self._changed = False
            view = self._view()
            workflow.set_current_details(fleet_view.details(view, self._undelivered))
            figures = view.model_dump(exclude={"at"})
            if figures != shown:
                workflow.upsert_memo({m.FLEET_VIEW.key: view})
                shown = figures


def _validate_batch(cluster: str, clusters: list[str]) -> None:
    """A batch is one worker's, for this cluster, within BATCH_MOST: refused whole otherwise
    (rejected before it reaches the history; the Batcher then sends its requests alone)."""
    if not 0 < len(clusters) <= BATCH_MOST:
        raise ValueError(f"a batch holds 1 to {BATCH_MOST} requests, not {len(clusters)}")
    if any(c != cluster for c in clusters):
        raise ValueError(f"a batch for coordinator {cluster!r} holds requests of {sorted(set(clusters) - {cluster})}")
