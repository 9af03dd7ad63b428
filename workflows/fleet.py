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

from datetime import datetime

from temporalio import workflow

from gpuheal.workflows.activity import run

with workflow.unsafe.imports_passed_through():
    from gpuheal.activities import interface as act
    from gpuheal.core import fleet as policy
    from gpuheal.core import ids
    from gpuheal.core import messages as m
    from gpuheal.core.fleet import (
        Admission,
        AdmitRequest,
        Arrival,
        Breaker,
        CapacityDecision,
        CapacityRequest,
        CoordinatorInput,
        DomainDecision,
        DomainIncident,
        FleetState,
        FleetStatus,
        Grant,
        GrantNotice,
        Held,
        OperatorAction,
        Override,
        Placement,
    )
    from gpuheal.core.fleet_policy import FleetPolicy, ModeChange, PolicyChange, VersionedPolicy
    from gpuheal.core.models import ActionClass, Notification, Severity

HISTORY_LIMIT = 4000  # events: continue as new well before Temporal suggests it


DETAILS_HELD = 20  # the UI's details list the first held incidents (every update redraws them)


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
        self._s = inp.state or FleetState(cluster=inp.cluster, policy=seed)
        self._seed = inp.seed
        self._signals: list[tuple[str, GrantNotice]] = []  # to held incidents
        self._notes: list[tuple[str, Severity, str]] = []  # to the operators
        self._domains: list[DomainIncident] = []  # domain incidents to open

    @workflow.run
    async def run(self, inp: CoordinatorInput) -> None:
        while True:
            await workflow.wait_condition(lambda: self._pending() or self._long())
            await self._send()
            if self._long() and not self._pending():
                await workflow.wait_condition(workflow.all_handlers_finished)
                if not self._pending():
                    workflow.continue_as_new(CoordinatorInput(cluster=self._s.cluster, seed=self._seed, state=self._s))

    def _pending(self) -> bool:
        return bool(self._signals or self._notes or self._domains)

    def _long(self) -> bool:
        info = workflow.info()
        return info.is_continue_as_new_suggested() or info.get_current_history_length() > HISTORY_LIMIT

    async def _send(self) -> None:
        """What the updates decided, done: signals to held incidents, notices, domain incidents."""
        while self._domains:
            domain = self._domains.pop(0)
            await run(act.OPEN_DOMAIN_INCIDENT, domain, summary=f"open domain incident {domain.domain}")
        while self._signals:
            incident, notice = self._signals.pop(0)
            try:
                await m.INCIDENT_CAPACITY.send(workflow.get_external_workflow_handle(incident), notice)
            except Exception as err:  # the incident ended meanwhile: nothing to tell
                workflow.logger.info("incident %s not told (%s)", incident, err)
        while self._notes:
            event, severity, message = self._notes.pop(0)
            note = Notification(
                incident_id=workflow.info().workflow_id,
                event=event,
                severity=severity,
                message=message,
                node="-",
                cluster=self._s.cluster,
            )
            await run(act.NOTIFY_OPERATORS, note, summary=f"notify: {event}")
        self._details()

    # --- incidents --------------------------------------------------------------------------

    @workflow.update(name=m.FLEET_ADMIT.name)
    def admit(self, req: AdmitRequest) -> Admission:
        """A new incident: its arrival counts (once), the breaker and the domains are checked."""
        now = workflow.now()
        s = self._s
        policy.forget_before(s, now)
        if all((a.incident_id, a.run_id) != (req.incident_id, req.run_id) for a in s.arrivals):
            s.arrivals.append(
                Arrival(
                    at=now,
                    incident_id=req.incident_id,
                    run_id=req.run_id,
                    node=req.placement.node,
                    domains=tuple(req.placement.domains),
                    gpu_uuids=req.gpu_uuids,
                )
            )
            self._check_breaker(req, now)
            self._check_domains(req, now)
        repeat = policy.repeat_offender(s.arrivals, req.placement.node, req.gpu_uuids, now, s.policy.policy.repeat)
        domain = policy.escalated_domain(s, req.placement)
        self._details()
        return Admission(
            policy=s.policy,
            repeat_offender=repeat,
            domain_incident=domain.incident_id if domain else None,
            breaker=s.breaker.why if s.breaker.tripped else None,
        )

    def _check_breaker(self, req: AdmitRequest, now: datetime) -> None:
        s = self._s
        if s.breaker.tripped:
            return
        why = policy.breaker_trip(s, req.placement, now)
        if why is None:
            return
        window = policy.within(s.arrivals, now, s.policy.policy.breaker.window_s)
        nodes = tuple(sorted({a.node for a in window}))
        s.breaker = Breaker(tripped=True, at=now, why=why, nodes=nodes, by="gpuheal")
        self._notes.append(
            (
                "breaker_tripped",
                "critical",
                f"circuit breaker tripped: {why}; nodes {', '.join(nodes)}. New incidents are recorded and held, "
                "nothing is replaced, until `gpuheal resume --operator NAME --reason TEXT`.",
            )
        )

    def _check_domains(self, req: AdmitRequest, now: datetime) -> None:
        s = self._s
        found = policy.escalation(s, req.placement, now)
        if found is None:
            return
        domain, nodes = found
        incident_id = ids.domain_incident_id(s.cluster, domain, now)
        d = DomainIncident(cluster=s.cluster, domain=domain, incident_id=incident_id, nodes=tuple(nodes), opened_at=now)
        s.domain_incidents[domain] = d
        self._domains.append(d)
        # Those already in line for this domain are held by the domain incident now.
        for held in s.queue:
            if domain in held.placement.domains:
                s.queue[s.queue.index(held)] = held.model_copy(
                    update={"reason": f"held by domain incident {incident_id}"}
                )

    @workflow.update(name=m.FLEET_REQUEST_CAPACITY.name)
    def request_capacity(self, req: CapacityRequest) -> CapacityDecision:
        """May this incident take its node out of service now? Idempotent: asked again, the same
        answer (granted, or its place in line)."""
        return self._decide_capacity(req)

    def _decide_capacity(self, req: CapacityRequest) -> CapacityDecision:
        s, now = self._s, workflow.now()
        if req.incident_id in s.grants:
            return CapacityDecision(granted=True, reason="granted already", already=True)
        for i, held in enumerate(s.queue):
            if held.incident_id == req.incident_id:
                return CapacityDecision(granted=False, reason=held.reason, position=i + 1, already=True)
        policy.forget_before(s, now)
        granted, why = policy.capacity_decision(s, req, now)
        if granted and not s.queue:  # nobody is ahead in line
            self._grant(req.incident_id, req.placement, now)
            self._details()
            return CapacityDecision(granted=True, reason=why)
        if granted:
            granted, why = False, "others are ahead in line"
        s.queue.append(
            Held(incident_id=req.incident_id, node=req.placement.node, placement=req.placement, since=now, reason=why)
        )
        self._serve_queue(now)  # it may go at once if the ones ahead cannot (another pool)
        position = next((i + 1 for i, h in enumerate(s.queue) if h.incident_id == req.incident_id), None)
        self._details()
        if position is None:
            return CapacityDecision(granted=True, reason="within the disruption budget")
        return CapacityDecision(granted=False, reason=s.queue[position - 1].reason, position=position)

    @workflow.update(name=m.FLEET_CONFIRM.name)
    def confirm(self, req: CapacityRequest) -> CapacityDecision:
        """Before a replacement: a grant stands unless the breaker has tripped or the node's
        domain has become a domain incident since; then it is taken back and the incident held
        (its node stays drained: nothing is replaced)."""
        s, now = self._s, workflow.now()
        if req.incident_id not in s.grants:
            return self._decide_capacity(req)
        domain = policy.escalated_domain(s, req.placement)
        why = ""
        if s.breaker.tripped:
            why = f"circuit breaker tripped ({s.breaker.why}); `gpuheal resume` resets it"
        elif domain is not None:
            why = f"held by domain incident {domain.incident_id} ({domain.domain}: suspected switch, power or cooling)"
        if not why:
            return CapacityDecision(granted=True, reason="the grant stands", already=True)
        s.grants.pop(req.incident_id)
        s.queue.append(
            Held(incident_id=req.incident_id, node=req.placement.node, placement=req.placement, since=now, reason=why)
        )
        self._details()
        return CapacityDecision(granted=False, reason=why, position=len(s.queue))

    @workflow.update(name=m.FLEET_RELEASE.name)
    def release(self, incident_id: str) -> str:
        """The incident gave its node back (closed, aborted, returned): budget frees, the next
        in line may go. Idempotent."""
        s, now = self._s, workflow.now()
        grant = s.grants.pop(incident_id, None)
        s.queue = [h for h in s.queue if h.incident_id != incident_id]
        if grant is not None:
            s.last_release[grant.node] = now
        self._serve_queue(now)
        self._details()
        return f"released {grant.node}" if grant else "nothing held"

    def _grant(self, incident_id: str, placement: Placement, now: datetime, override: str | None = None) -> None:
        self._s.grants[incident_id] = Grant(
            incident_id=incident_id,
            node=placement.node,
            pool=placement.pool,
            domains=tuple(placement.domains),
            at=now,
            override=override,
        )
        self._s.remediations.append(now)
        self._s.decisions += 1

    def _serve_queue(self, now: datetime) -> None:
        """Grant, in order, every held incident the budget has room for now."""
        s = self._s
        still: list[Held] = []
        for held in s.queue:
            req = CapacityRequest(
                cluster=s.cluster,
                incident_id=held.incident_id,
                placement=held.placement,
                action=ActionClass.REPLACE_NODE,
            )
            granted, why = policy.capacity_decision(s, req, now)
            if granted:
                self._grant(held.incident_id, held.placement, now)
                self._signals.append((held.incident_id, GrantNotice(granted=True, reason=why)))
            else:
                still.append(held.model_copy(update={"reason": why}))
        s.queue = still

    # --- operators --------------------------------------------------------------------------

    @workflow.update(name=m.FLEET_PAUSE.name)
    def pause(self, by: OperatorAction) -> str:
        """Trip the breaker by hand: new incidents are held, nothing is replaced."""
        self._s.breaker = Breaker(
            tripped=True, at=workflow.now(), why=f"paused by {by.operator}: {by.reason}", by=by.operator
        )
        self._notes.append(("breaker_paused", "warning", f"gpuheal paused by {by.operator}: {by.reason}"))
        self._details()
        return f"paused by {by.operator}"

    @pause.validator
    def _validate_pause(self, by: OperatorAction) -> None:
        if self._s.breaker.tripped:
            raise ValueError(f"already tripped: {self._s.breaker.why}")

    @workflow.update(name=m.FLEET_RESUME.name)
    def resume(self, by: OperatorAction) -> str:
        """Reset the breaker (it never resets by itself); held incidents go on, within the budget."""
        was = self._s.breaker
        self._s.breaker = Breaker(by=by.operator, at=workflow.now())
        self._notes.append(("breaker_reset", "info", f"circuit breaker reset by {by.operator}: {by.reason}"))
        self._serve_queue(workflow.now())
        self._details()
        return f"resumed by {by.operator} (was: {was.why}); {len(self._s.queue)} still held"

    @resume.validator
    def _validate_resume(self, by: OperatorAction) -> None:
        if not self._s.breaker.tripped:
            raise ValueError("the circuit breaker is not tripped")

    @workflow.update(name=m.FLEET_SET_MODE.name)
    def set_mode(self, change: ModeChange) -> str:
        old = self._s.policy.policy.mode
        self._new_policy(self._s.policy.policy.model_copy(update={"mode": change.mode}), change.operator, change.reason)
        return f"mode {old} -> {change.mode} (policy version {self._s.policy.version})"

    @workflow.update(name=m.FLEET_SET_POLICY.name)
    def set_policy(self, change: PolicyChange) -> str:
        self._new_policy(change.policy, change.operator, change.reason)
        self._serve_queue(workflow.now())  # a larger budget lets the line move
        return f"policy version {self._s.policy.version}"

    def _new_policy(self, new: FleetPolicy, operator: str, reason: str) -> None:
        v = self._s.policy.version + 1
        self._s.policy = VersionedPolicy(version=v, policy=new, changed_by=operator, reason=reason, at=workflow.now())
        self._notes.append(("policy_changed", "info", f"policy version {v} by {operator}: {reason}"))
        self._details()

    @workflow.update(name=m.FLEET_OVERRIDE.name)
    def override(self, o: Override) -> str:
        """Let one held incident go now, past the budget (the operator answers for it)."""
        s = self._s
        held = next((h for h in s.queue if h.incident_id == o.incident_id), None)
        if held is None:
            raise ValueError(f"{o.incident_id} is not held")
        s.queue.remove(held)
        self._grant(held.incident_id, held.placement, workflow.now(), override=f"{o.operator}: {o.reason}")
        self._signals.append(
            (held.incident_id, GrantNotice(granted=True, reason=f"override by {o.operator}: {o.reason}"))
        )
        self._details()
        return f"{o.incident_id} granted by {o.operator}"

    @override.validator
    def _validate_override(self, o: Override) -> None:
        if all(h.incident_id != o.incident_id for h in self._s.queue):
            raise ValueError(f"{o.incident_id} is not held (held: {[h.incident_id for h in self._s.queue]})")

    @workflow.update(name=m.FLEET_DOMAIN_DECISION.name)
    def domain_decision(self, d: DomainDecision) -> str:
        """A domain incident's operator decided: release its node incidents (within the budget)
        or dismiss them (they end, the domain is handled as one)."""
        s, now = self._s, workflow.now()
        incident = s.domain_incidents.get(d.domain)
        if incident is None:
            return f"no domain incident for {d.domain}"
        s.domain_incidents[d.domain] = incident.model_copy(update={"decided": d.decision})
        if d.decision == "dismiss":
            mine = [h for h in s.queue if d.domain in h.placement.domains]
            s.queue = [h for h in s.queue if h not in mine]
            for h in mine:
                why = f"dismissed by domain incident {incident.incident_id} ({d.operator}: {d.reason})"
                self._signals.append((h.incident_id, GrantNotice(granted=False, reason=why)))
        self._serve_queue(now)
        self._details()
        return f"{d.domain}: {d.decision} by {d.operator}"

    # --- seeing it --------------------------------------------------------------------------

    @workflow.query(name=m.FLEET_STATUS.name)
    def status(self) -> FleetStatus:
        s = self._s
        recent = [
            t for t in s.remediations if (workflow.now() - t).total_seconds() < s.policy.policy.budget.rate_window_s
        ]
        uses = policy.budget_uses(s, None)
        return FleetStatus(
            cluster=s.cluster,
            mode=s.policy.policy.mode,
            policy_version=s.policy.version,
            breaker=s.breaker,
            out_of_service=tuple(s.grants.values()),
            held=tuple(s.queue),
            budget=tuple(uses),
            domain_incidents=tuple(s.domain_incidents.values()),
            remediations_in_window=len(recent),
        )

    @workflow.query(name=m.FLEET_POLICY.name)
    def current_policy(self) -> VersionedPolicy:
        return self._s.policy

    def _details(self) -> None:
        s = self._s
        lines = [
            f"mode **{s.policy.policy.mode}**, policy version {s.policy.version}",
            f"breaker: {'TRIPPED: ' + s.breaker.why if s.breaker.tripped else 'closed'}",
            f"out of service: {len(s.grants)} ({', '.join(g.node for g in s.grants.values()) or '-'})",
            f"held: {len(s.queue)}"
            + "".join(f"\n  {i + 1}. {h.node}: {h.reason}" for i, h in enumerate(s.queue[:DETAILS_HELD])),
        ]
        if len(s.queue) > DETAILS_HELD:
            lines.append(f"  ... and {len(s.queue) - DETAILS_HELD} more (`gpuheal fleet`)")
        lines += [
            f"domain incident {d.domain}: {', '.join(d.nodes)} ({d.decided or 'open'})"
            for d in s.domain_incidents.values()
        ]
        workflow.set_current_details("\n".join(lines))
