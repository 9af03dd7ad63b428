"""gpuheal's answer to a report in `gpuheal simulate`: the incident's path through the real
coordinator (gpuheal.core.fleet.coordination, steering) on the engine's clock, in the workflow's order
(workflows/remediation.py): triage; admission (breaker, domain, repeat offender) for any action
but `ignore`; observe mode touches nothing; capacity asked before anything is taken (held in line
or granted); approval after the grant; the job requeued; the grant confirmed before the repair (a
breaker tripped or a domain escalated since takes it back: held again, the node stays out); the
node repaired or replaced, then released. A hold ends at the policy's `max_hold_s`; a person
takes over then, as for a tripped breaker (`gpuheal resume`) or a domain incident (released); a
node that stays drained (taken back after its requeue) stays counted until it is back.

Not modelled: containment while held (the workflow may drain a held node within its own bound;
here a held node is left as it is, so the budget shown is the grants', not the containments').
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from gpuheal.core import ids, policy
from gpuheal.core.fleet import coordination, steering
from gpuheal.core.fleet.budget import needs_approval
from gpuheal.core.fleet.coordination import Effects
from gpuheal.core.fleet.models import (
    AdmitRequest,
    CapacityRequest,
    DomainDecision,
    FleetState,
    OperatorAction,
    Placement,
)
from gpuheal.core.fleet.policy import VersionedPolicy
from gpuheal.core.models.base import ActionClass
from gpuheal.core.simulate.engine import EPOCH, Engine
from gpuheal.core.simulate.models import Decision, DecisionKind, ModelResult
from gpuheal.core.simulate.traces import Failure

PERSON = "simulated-operator"


@dataclass
class Incident:
    failure: Failure
    index: int
    reported_at: float
    action: ActionClass
    held_at: float | None = None
    waited: float = 0.0  # held in all, so far
    was_held: bool = False
    requeued: bool = False
    done: bool = False

    @property
    def run_id(self) -> str:
        return f"sim-{self.index}"  # one per failure: keys are per incident run, never per node


class Gpuheal:
    def __init__(self, engine: Engine) -> None:
        self.e = engine
        seed = VersionedPolicy(version=1, policy=engine.policy, changed_by="simulate", reason="candidate", at=EPOCH)
        self.s = FleetState(cluster=engine.fleet.cluster, policy=seed)
        self.incidents: dict[str, Incident] = {}  # by incident id: the node's latest run
        self.decisions: list[Decision] = []
        self.counts = dict.fromkeys(("incidents", "held", "breaker", "domains", "replaced"), 0)
        self.max_budget = 0
        self.wake_at: float | None = None
        engine.respond = self.failed
        engine.on_back = self.back_in_service

    def run(self, trace: list[Failure], days: float) -> ModelResult:
        self.e.run(trace, days, after_each=self.after_each)
        return self.e.result(
            days,
            incidents=self.counts["incidents"],
            held=self.counts["held"],
            breaker_trips=self.counts["breaker"],
            domain_incidents=self.counts["domains"],
            replaced=self.counts["replaced"],
            max_budget_used=self.max_budget,
            decisions=tuple(self.decisions),
        )

    def after_each(self) -> None:
        self.schedule_wake()

    # --- an incident ------------------------------------------------------------------------

    def failed(self, f: Failure, index: int, action: ActionClass) -> None:
        self.e.at(self.e.now + self.e.t.detect_s, partial(self.report, f, index, action))

    def back_in_service(self, node: str) -> None:
        """The coordinator's look for closed runs finds a node left drained back: no longer counted."""
        self.s.left.pop(node, None)

    def placement(self, node: str) -> Placement:
        n, rack = self.e.fleet, self.e.rack.get(node)
        domains = {f"rack=r{rack}": n.rack_size} if rack is not None else {}
        return Placement(node=node, cluster_size=n.nodes, pool="gpu", pool_size=n.nodes, domains=domains)

    def report(self, f: Failure, index: int, action: ActionClass) -> None:
        incident_id = ids.incident_id(self.e.fleet.cluster, f.node)
        inc = Incident(f, index, self.e.now, action)
        self.counts["incidents"] += 1
        if action == ActionClass.IGNORE:  # closed at triage, never admitted (as the workflow)
            self.decide(inc, "ignored", policy.triage(self.e.report_of(f)).reason)
            return
        self.incidents[incident_id] = inc
        req = AdmitRequest(
            incident_id=incident_id,
            run_id=inc.run_id,
            cluster=self.e.fleet.cluster,
            placement=self.placement(f.node),
            action=action,
            what=f.cause,
            seed=self.e.policy,
        )
        admission, out = coordination.admit(self.s, req, self.e.clock(), serve_when_freed=True, app_faults_apart=True)
        if admission.repeat_offender is not None and action in policy.REPLACED_WHEN_REPEATED:
            inc.action = ActionClass.REPLACE_NODE
        self.apply(out)
        if self.s.policy.policy.mode == "observe":
            self.decide(inc, "observed", "observe mode: recorded, nothing done; Slurm and a person")
            self.by_person(inc)
            return
        if not policy.plan_for(inc.action).drain:  # restart_app: no capacity taken, the node stays
            self.decide(inc, "granted", "no capacity taken: the job is requeued")
            self.approved(inc, lambda: self.restart_app(inc))
            return
        answer, out = coordination.request(self.s, self.capacity_request(inc), self.e.clock(), serve_when_freed=True)
        if answer.granted:
            self.decide(inc, "granted", answer.reason)
            self.approved(inc, lambda: self.remediate(inc))
        else:
            self.hold(inc, answer.reason)
        self.apply(out)

    def capacity_request(self, inc: Incident) -> CapacityRequest:
        return CapacityRequest(
            cluster=self.e.fleet.cluster,
            incident_id=ids.incident_id(self.e.fleet.cluster, inc.failure.node),
            placement=self.placement(inc.failure.node),
            action=inc.action,
            run_id=inc.run_id,
        )

    def approved(self, inc: Incident, then: Callable[[], None]) -> None:
        """Approval waits for a person after the grant, where the policy asks for one."""
        p = self.s.policy.policy
        if needs_approval(p.mode, inc.action, p.approval):
            self.amend(inc, "approval", "granted; waits for a person's approval")
            self.e.at(self.e.now + self.e.t.person_s, then)
        else:
            then()

    def restart_app(self, inc: Incident) -> None:
        def requeued() -> None:
            self.e.requeue(inc.failure.node)
            self.e.node_back(inc.failure.node)

        self.e.at(self.e.now + self.e.t.gpuheal_s, requeued)
        inc.done = True

    def remediate(self, inc: Incident) -> None:
        """Requeue the job, then confirm the grant before the repair (the workflow's order)."""
        self.e.at(self.e.now + self.e.t.gpuheal_s, lambda: self.requeue_and_confirm(inc))

    def requeue_and_confirm(self, inc: Incident) -> None:
        if not inc.requeued:
            inc.requeued = True
            self.e.requeue(inc.failure.node)
        answer, out = coordination.confirm(self.s, self.capacity_request(inc), self.e.clock())
        if answer.granted:
            self.e.repair(inc.failure, inc.action, after=0, done=lambda: self.repaired(inc), extra=inc.waited)
        else:  # taken back (breaker, domain): held again, the node stays out and counted
            self.hold(inc, f"granted, then taken back before the repair: {answer.reason}")
        self.apply(out)

    def repaired(self, inc: Incident) -> None:
        if inc.action == ActionClass.REPLACE_NODE:
            self.counts["replaced"] += 1
        self.release(inc)

    def hold(self, inc: Incident, why: str) -> None:
        inc.held_at = self.e.now
        self.counts["held"] += not inc.was_held  # incidents held, each once
        inc.was_held = True
        if not self.amend(inc, "held", why):
            self.decide(inc, "held", why)
        self.e.at(self.e.now + self.s.policy.policy.max_hold_s, partial(self.hold_ended, inc, self.e.now))

    def granted(self, incident_id: str) -> None:
        inc = self.incidents.get(incident_id)
        if inc is None or inc.done or inc.held_at is None:
            return
        self.note_wait(inc)
        inc.held_at = None
        if inc.requeued:  # taken back after its approval and requeue: straight on to the repair
            self.remediate(inc)
        else:
            self.approved(inc, lambda: self.remediate(inc))

    def hold_ended(self, inc: Incident, since: float) -> None:
        """Held to the policy's bound: the incident ends `not_granted`, a person takes over."""
        if inc.held_at != since or inc.done:
            return
        self.note_wait(inc)
        inc.held_at = None
        self.release(inc, left_drained=inc.requeued)  # drained (taken back): it stays counted
        self.by_person(inc)

    def by_person(self, inc: Incident) -> None:
        f = inc.failure
        if not inc.requeued:
            inc.requeued = True
            self.e.at(self.e.now + self.e.t.person_s, lambda: self.e.requeue(f.node))
        self.e.repair(f, policy.triage(self.e.report_of(f)).action, after=self.e.t.person_s)
        inc.done = True

    def release(self, inc: Incident, left_drained: bool = False) -> None:
        inc.done = True
        incident_id = ids.incident_id(self.e.fleet.cluster, inc.failure.node)
        out = coordination.release(self.s, incident_id, self.e.clock(), inc.run_id, left_drained=left_drained)[1]
        self.apply(out)

    # --- the coordinator's effects ---------------------------------------------------------------

    def apply(self, out: Effects) -> None:
        self.max_budget = max(self.max_budget, len(self.s.grants) + len(self.s.contained) + len(self.s.left))
        for incident_id, notice in out.signals:
            if notice.granted:
                self.e.at(self.e.now, partial(self.granted, incident_id))
            elif (inc := self.incidents.get(incident_id)) is not None and inc.held_at is not None:
                self.note_wait(inc)
                inc.held_at = None
                self.e.at(self.e.now, partial(self.by_person, inc))  # dismissed: the domain is handled as one
        for event, _, _ in out.notes:
            if event == "breaker_tripped":
                self.counts["breaker"] += 1
                self.e.at(self.e.now + self.e.t.person_s, self.resume)
        for d in out.domains:
            self.counts["domains"] += 1
            self.e.at(self.e.now + self.e.t.person_s, partial(self.decide_domain, d.domain))

    def resume(self) -> None:
        """A person looked at the storm and reset the breaker."""
        by = OperatorAction(operator=PERSON, reason="checked the storm")
        self.apply(steering.resume(self.s, by, self.e.clock())[1])

    def decide_domain(self, domain: str) -> None:
        """A person looked at the rack and released its node incidents (within the budget)."""
        d = DomainDecision(domain=domain, decision="release", operator=PERSON, reason="checked the rack")
        self.apply(steering.domain_decision(self.s, d, self.e.clock())[1])

    def schedule_wake(self) -> None:
        """The coordinator's own timer: a held incident freed by time alone (cooldown, rate)."""
        wake = coordination.next_wake(self.s, self.e.clock())
        if wake is None:
            return
        when = max(self.e.now, (wake - EPOCH).total_seconds())
        if self.wake_at is not None and self.e.now <= self.wake_at <= when:
            return
        self.wake_at = when

        def serve() -> None:
            self.wake_at = None
            self.apply(coordination.serve_queue(self.s, self.e.clock()))

        self.e.at(when, serve)

    # --- the record ---------------------------------------------------------------------------

    def amend(self, inc: Incident, decision: DecisionKind, reason: str) -> bool:
        """One decision per incident: a later turn (approval, a grant taken back) amends it."""
        for k in range(len(self.decisions) - 1, -1, -1):
            if self.decisions[k].failure == inc.index:
                self.decisions[k] = self.decisions[k].model_copy(update={"decision": decision, "reason": reason})
                return True
        return False

    def note_wait(self, inc: Incident) -> None:
        assert inc.held_at is not None
        inc.waited += self.e.now - inc.held_at
        for k in range(len(self.decisions) - 1, -1, -1):
            d = self.decisions[k]
            if d.failure == inc.index and d.decision == "held":
                self.decisions[k] = d.model_copy(update={"waited_s": d.waited_s + self.e.now - inc.held_at})
                return

    def decide(self, inc: Incident, decision: DecisionKind, reason: str) -> None:
        used = len(self.s.grants) + len(self.s.contained) + len(self.s.left)
        self.decisions.append(
            Decision(
                failure=inc.index,
                at_s=inc.reported_at,
                node=inc.failure.node,
                cause=inc.failure.cause,
                action=inc.action.value,
                decision=decision,
                reason=reason,
                budget_used=used,
            )
        )
