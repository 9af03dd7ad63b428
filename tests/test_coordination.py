"""The coordinator's state changes (gpuheal.core.fleet.coordination), driven by Hypothesis through
arrivals, capacity requests, confirmations, releases, pauses and resumes, overrides, policy
changes, clock steps and continue-as-new; after every step the invariants an SRE relies on are
checked:

- never more nodes out of service than the budget allows (cluster and pool), except those an
  operator overrode, and nothing granted while the breaker is tripped unless overridden;
- a tripped breaker resets only when a person resumes it;
- a held incident is granted as soon as its limit frees (nothing left in line could go now),
  including when only time frees it (the coordinator wakes at `next_wake`);
- held nodes are contained (drained while held) only within the containment bound, and never
  while the breaker is tripped;
- every grant, containment and place in line belongs to a live incident run, or to a run that
  closed without giving it back (terminated) and is looked for within REAP_EVERY_S; a look gives
  back everything closed runs held; keys are per run: a later run of the same node's incident
  is never "granted already" by an earlier run's grant;
- the state survives continue-as-new (its JSON round trip) unchanged;
- every node gpuheal drained (what Slurm shows, read through gpuheal's own drain-reason
  predicate) is counted exactly once until Slurm shows it back, whatever the world does
  meanwhile: an operator resumes a node (with a bare scontrol, or `gpuheal return`), someone
  else drains one with their own reason, a burn-in fails and drains in the incident's name, a
  look for closed runs runs while releases arrive (its activities as separate steps), and the
  coordinator is terminated and recreated at any step, rebuilding from what visibility shows
  (its earlier run and a just-started held incident may not show yet: that one asks again).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpuheal.activities import validation
from gpuheal.core import policy
from gpuheal.core.fleet import admitting, containment, coordination, packing, reaping, steering
from gpuheal.core.fleet.models import (
    AdmitItem,
    AdmitRequest,
    Admitted,
    Admitting,
    CapacityDecision,
    CapacityRequest,
    DomainDecision,
    FleetState,
    NodeReturn,
    OpenIncident,
    OpenIncidents,
    OperatorAction,
    Override,
    Placement,
    RunRef,
)
from gpuheal.core.fleet.policy import BreakerPolicy, BudgetPolicy, FleetPolicy, VersionedPolicy, limit_of
from gpuheal.core.models.base import ActionClass, Stage
from tests.test_fleet_index import assert_index_true

T0 = datetime(2026, 12, 1, tzinfo=UTC)
NODES = [f"gpu{i:02d}" for i in range(12)]
POOLS = {n: ("train" if i < 8 else "infer") for i, n in enumerate(NODES)}
ACTIONS = [ActionClass.REPLACE_NODE, ActionClass.REBOOT_NODE, ActionClass.RESET_GPU, ActionClass.RESTART_APP]
BUDGETS = st.sampled_from(["0", "1", "2", "3", "10%", "25%", "50%"])
BY = OperatorAction(operator="alice", reason="test")


def placement(node: str) -> Placement:
    pool = POOLS[node]
    return Placement(
        node=node,
        cluster_size=len(NODES),
        pool=pool,
        pool_size=sum(1 for p in POOLS.values() if p == pool),
        domains={f"rack=r{NODES.index(node) // 4}": 4},
    )


class Coordinator(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        seed = FleetPolicy(
            budget=BudgetPolicy(cluster="3", per_pool="2", rate=6, rate_window_s=600, node_cooldown_s=300),
            breaker=BreakerPolicy(max_incidents=6, window_s=120),
            containment_limit="2",
        )
        self.now = T0
        self.s = FleetState(
            cluster="c", policy=VersionedPolicy(version=1, policy=seed, changed_by="t", reason="t", at=T0)
        )
        self.runs = 0
        self.live: dict[str, tuple[str, str]] = {}  # node -> its incident run (asked, not yet released)
        self.dead: dict[tuple[str, str], datetime] = {}  # runs terminated (nothing given back) -> when
        # What Slurm shows drained by gpuheal (node -> the drain reason it wrote), whatever the
        # coordinator's books say: the truth they must count (a node is drained when granted or
        # contained; it comes back when its incident returns or replaces it, or an operator
        # resumes it). The looks and the rebuild read it through gpuheal's own predicate.
        self.slurm: dict[str, str] = {}
        self.foreign: set[str] = set()  # drained by someone else (their reason): not gpuheal's
        self.look_on_way: tuple[list[RunRef], list[RunRef] | None, list[RunRef]] | None = None
        self.resumed = False
        # `gpuheal return`s told the coordinator whose command has not resumed yet: node -> (when,
        # whether its resume will land, the drain it read before). The command ends within
        # reaping.RETURN_GRACE_S (its two Slurm calls' timeouts): time passes no further meanwhile.
        self.resuming: dict[str, tuple[datetime, bool, str]] = {}
        self.told: set[str] = set()  # of those, the ones this coordinator (not a recreated one) was told
        self.granted_ever: set[tuple[str, str]] = set()  # incident runs
        self.recreated = False
        self.looks_again = False  # a recreated coordinator that found nothing looks again

    # --- what happens ---------------------------------------------------------------------

    @rule(node=st.sampled_from(NODES), contain=st.booleans())
    def an_incident_asks(self, node: str, contain: bool = False) -> None:
        if node in self.live:
            return
        self.runs += 1
        incident, run = f"gpuheal-c-{node}", str(self.runs)  # the node's workflow id, a new run of it
        self.live[node] = (incident, run)
        req = AdmitRequest(
            incident_id=incident,
            run_id=run,
            cluster="c",
            placement=placement(node),
            action=ActionClass.REPLACE_NODE,
            what="XID 79",
            seed=self.s.policy.policy,
        )
        self.step(lambda: coordination.admit(self.s, req, self.now, serve_when_freed=True, compact=True))
        answer: list[object] = []
        req = self.capacity(node, contain)

        def ask() -> None:  # as the coordinator's handler decides it: the request, then containment
            decided, _ = coordination.request(self.s, req, self.now, serve_when_freed=True)
            answer.append(containment.with_containment(self.s, [req], [decided], self.now)[0])

        self.step(ask)
        decision = answer[0][0]  # type: ignore[index]
        assert (decision.contained is not None) == (contain and not decision.granted)
        if decision.granted or decision.contained:
            assert not self.being_returned(node), f"{node} given while its return's resume is on its way"
        if decision.already and decision.granted:
            assert self.s.grants[incident].run_id == run, "granted already by an earlier run's grant"

    @rule(
        nodes_asking=st.lists(st.tuples(st.sampled_from(NODES), st.booleans()), min_size=1, max_size=6),
        when_freed=st.booleans(),
    )
    def a_batch_of_incidents_asks(self, nodes_asking: list[tuple[str, bool]], when_freed: bool) -> None:
        """Requests that queued in one worker go as one (request_many), new incidents and ones
        asking again, a node even twice; the line is served once for the batch. Each answer is
        its own run's, and the batch decides as those requests one at a time would, in a
        coordinator from SERVE_WHEN_FREED on (`when_freed`) or one from before it, which serves
        neither time's frees at admission nor when its loop comes back. Requests asking their
        containment with them (CONTAIN_WITH_REQUEST) are decided as the same requests followed by
        each held one's `contain`, in order."""
        nodes = [n for n, _ in nodes_asking]
        for node in dict.fromkeys(nodes):
            if node not in self.live:
                self.runs += 1
                self.live[node] = (f"gpuheal-c-{node}", str(self.runs))
                req = AdmitRequest(
                    incident_id=self.live[node][0],
                    run_id=self.live[node][1],
                    cluster="c",
                    placement=placement(node),
                    action=ActionClass.REPLACE_NODE,
                    what="XID 79",
                    seed=self.s.policy.policy,
                )
                self.step(
                    lambda req=req: coordination.admit(
                        self.s, req, self.now, serve_when_freed=when_freed, compact=when_freed
                    )
                )  # type: ignore[misc]
        reqs = [self.capacity(n, contain) for n, contain in nodes_asking]
        one_at_a_time = FleetState.model_validate_json(self.s.model_dump_json())
        for r in reqs:
            coordination.request(one_at_a_time, r, self.now, serve_when_freed=when_freed)
        answers: list[CapacityDecision] = []

        def ask() -> None:  # as request_capacity_many decides: the batch, then the containment asked
            decided, _ = coordination.request_many(self.s, reqs, self.now, serve_when_freed=when_freed)
            answers.extend(containment.with_containment(self.s, reqs, decided, self.now)[0])

        self.step(ask)
        contained_alone = {  # each one not granted asks its own contain update after, in their order
            i: coordination.contain(one_at_a_time, r, self.now)[0].granted
            for i, (r, a) in enumerate(zip(reqs, answers, strict=True))
            if r.contain_if_held and not a.granted
        }
        assert {i: a.contained for i, a in enumerate(answers) if a.contained is not None} == contained_alone

        # The same grants, line and books; a held incident's reason is the one of the last serve
        # that looked at it, which one at a time comes at other moments.
        def decided(s: FleetState) -> FleetState:
            return s.model_copy(update={"queue": [h.model_copy(update={"reason": ""}) for h in s.queue]})

        assert decided(self.s) == decided(one_at_a_time), "a batch decided otherwise than its requests one at a time"
        for r, a in zip(reqs, answers, strict=True):
            assert isinstance(a, CapacityDecision)
            if a.granted:
                assert self.s.grants[r.incident_id].run_id == r.run_id, f"{r.incident_id} told granted, not"
            else:
                held = self.s.queue[a.position - 1] if a.position else None
                assert held is not None and held.incident_id == r.incident_id, f"{r.incident_id}: wrong place"

    @rule(
        items=st.lists(
            st.tuples(st.sampled_from(NODES), st.sampled_from(ACTIONS), st.booleans(), st.booleans()),
            min_size=1,
            max_size=6,
        ),
        decide_capacity=st.booleans(),
    )
    def a_batch_is_admitted_with_its_requests(
        self, items: list[tuple[str, ActionClass, bool, bool]], decide_capacity: bool
    ) -> None:
        """One decision per incident (admit_and_request_many): a worker's batch of admissions, each
        asking its capacity request too (or not), new incidents and ones asking again, decides as
        the same admissions one at a time, then the requests each incident would send once
        admitted (its action as admitted takes capacity, not in observe mode), one at a time, each
        held one then asking its `contain`. A coordinator still rebuilding (`decide_capacity`
        False) admits alone."""
        batch = []
        for node, action, asks, contain in items:
            if node not in self.live:
                self.runs += 1
                self.live[node] = (f"gpuheal-c-{node}", str(self.runs))
            incident, run = self.live[node]
            admit = Admitting(
                incident_id=incident, run_id=run, cluster="c", placement=placement(node), action=action, what="XID"
            )
            batch.append(AdmitItem(admit=admit, ask_capacity=asks, contain_if_held=contain))
        one = FleetState.model_validate_json(self.s.model_dump_json())
        admissions = [coordination.admit(one, i.admit, self.now, serve_when_freed=True, compact=True)[0] for i in batch]
        expected: dict[int, CapacityDecision] = {}
        for k, (i, a) in enumerate(zip(batch, admissions, strict=True)):
            # What the incident sends once admitted (workflows/incident/capacity.request), modelled here.
            action = i.admit.action
            if a.repeat_offender and action in policy.REPLACED_WHEN_REPEATED:
                action = ActionClass.REPLACE_NODE
            plan = policy.plan_for(action)
            asks = decide_capacity and i.ask_capacity and a.policy.policy.mode != "observe"
            if not (asks and (plan.drain or plan.repair is not None)):
                continue
            drains = i.contain_if_held and a.policy.policy.containment_while_held == "drain"
            req = self.capacity(i.admit.placement.node, drains).model_copy(update={"action": action})
            d, _ = coordination.request(one, req, self.now, serve_when_freed=True)
            if drains and not d.granted:
                c, _ = coordination.contain(one, req, self.now)
                d = d.model_copy(update={"contained": c.granted, "containment": c.reason})
            expected[k] = d
        answers: list[Admitted] = []
        self.step(
            lambda: answers.extend(
                admitting.admit_and_request_many(self.s, batch, self.now, decide_capacity=decide_capacity)[0]
            )
        )

        def decided(s: FleetState) -> FleetState:  # (a held one's reason: the last serve that looked)
            return s.model_copy(update={"queue": [h.model_copy(update={"reason": ""}) for h in s.queue]})

        assert decided(self.s) == decided(one), "a batch decided otherwise than its incidents one at a time"
        for k, (a, alone) in enumerate(zip(answers, admissions, strict=True)):
            assert (a.policy, a.repeat_offender, a.breaker, a.domain_incident) == (
                alone.policy,
                alone.repeat_offender,
                alone.breaker,
                alone.domain_incident,
            )
            assert (a.decision is None) == (k not in expected), "capacity decided unasked, or asked and not decided"
            if a.decision is not None:
                e = expected[k]
                said = (a.decision.granted, a.decision.contained)
                assert said == (e.granted, e.contained), f"{batch[k].admit.incident_id}: {said}, alone {e}"

    @precondition(lambda self: any(self.live.get(h.node) == (h.incident_id, h.run_id) for h in self.s.queue))
    @rule(data=st.data())
    def a_held_incident_asks_to_contain_its_node(self, data: st.DataObject) -> None:
        held = [h.node for h in self.s.queue if self.live.get(h.node) == (h.incident_id, h.run_id)]
        node = data.draw(st.sampled_from(held))
        answer: list[bool] = []
        self.step(lambda: answer.append(coordination.contain(self.s, self.capacity(node), self.now)[0].granted))
        if answer[0]:  # (an answer "drained already" records nothing: its drain would adopt the left one)
            assert not self.being_returned(node), f"{node} contained while its return's resume is on its way"

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def an_incident_is_terminated(self, data: st.DataObject) -> None:
        """Terminated by hand: it runs no code, gives nothing back."""
        node = data.draw(st.sampled_from(sorted(self.live)))
        self.dead[self.live.pop(node)] = self.now

    @property
    def drained(self) -> set[str]:
        return set(self.slurm)

    @precondition(lambda self: bool(self.s.left))
    @rule(data=st.data())
    def an_operator_returns_a_node_a_closed_run_left_drained(self, data: st.DataObject) -> None:
        """With a bare `scontrol update state=resume`: the books learn it at the next look."""
        self.slurm.pop(data.draw(st.sampled_from(sorted(self.s.left))), None)

    @precondition(lambda self: bool(self.s.left))
    @rule(data=st.data())
    def an_operator_returns_a_node_with_gpuheal_return(self, data: st.DataObject) -> None:
        """`gpuheal return`: the coordinator is told first (its cooldown starts), then the
        command resumes the node in Slurm, and that resume may fail (slurmctld stopped): the
        node stays counted until a look sees Slurm show it back."""
        node = data.draw(st.sampled_from(sorted(self.s.left)))
        if steering.holder_of(self.s, node) is not None:
            return  # refused (the update's validator): an open incident holds it
        self.step(lambda: steering.return_node(self.s, NodeReturn(node=node, operator="olga", reason="ok"), self.now))
        if node in self.slurm:
            lands = data.draw(st.booleans(), label="the resume in Slurm succeeds")
            self.resuming[node] = (self.now, lands, self.slurm[node])
            self.told.add(node)

    @precondition(lambda self: bool(self.resuming))
    @rule(data=st.data())
    def the_command_resumes_the_node_it_returned(self, data: st.DataObject) -> None:
        """Its resume (or its failure), whatever happened since: it resumes only the drain it read."""
        node = data.draw(st.sampled_from(sorted(self.resuming)))
        self.command_ends(node)

    def command_ends(self, node: str) -> None:
        _, lands, read = self.resuming.pop(node)
        self.told.discard(node)
        if lands and self.slurm.get(node) == read:
            self.slurm.pop(node)

    def commands_end_before(self, end: datetime) -> None:
        """Every return whose command would still run at `end`, past its grace, ends first."""
        grace = timedelta(seconds=reaping.RETURN_GRACE_S)
        for node in [n for n, (at, _, _) in self.resuming.items() if at + grace <= end]:
            self.command_ends(node)

    @precondition(lambda self: bool(self.slurm or self.foreign))
    @rule(data=st.data())
    def an_operator_resumes_any_drained_node(self, data: st.DataObject) -> None:
        """A person resumes a node in Slurm, whoever drained it and whatever holds it."""
        node = data.draw(st.sampled_from(sorted(self.drained | self.foreign)))
        self.slurm.pop(node, None)
        self.foreign.discard(node)

    @rule(node=st.sampled_from(NODES))
    def someone_else_drains_a_node(self, node: str) -> None:
        """An admin drains a node with their own reason (over gpuheal's, if it had one): from
        then on it is theirs, and gpuheal's looks must not take it for their incident's."""
        self.slurm.pop(node, None)
        self.foreign.add(node)

    @precondition(lambda self: self.look_on_way is None)
    @precondition(lambda self: (due := reaping.reap_due(self.s, self.now)) is not None and due <= self.now)
    @rule()
    def the_coordinator_looks_for_closed_runs(self) -> None:
        self.look()

    @precondition(lambda self: self.look_on_way is None)
    @precondition(lambda self: (due := reaping.reap_due(self.s, self.now)) is not None and due <= self.now)
    @rule()
    def a_look_for_closed_runs_starts(self) -> None:
        """Beside the loop: its activities take a while, and everything else goes on meanwhile."""
        runs = reaping.start_reap(self.s, self.now)
        self.look_on_way = ([r for r in runs if (r.incident_id, r.run_id) in self.dead], None, [])

    @precondition(lambda self: self.look_on_way is not None and self.look_on_way[1] is None)
    @rule()
    def slurm_answers_the_look(self) -> None:
        """Its second activity: the left nodes as the books hold them now, asked of Slurm."""
        assert self.look_on_way is not None
        closed = self.look_on_way[0]
        asked = [*closed, *reaping.left_refs(self.s)]
        self.look_on_way = (closed, asked, self.answer(asked))

    @precondition(lambda self: self.look_on_way is not None and self.look_on_way[1] is not None)
    @rule()
    def the_look_ends(self) -> None:
        assert self.look_on_way is not None
        closed, asked, drained = self.look_on_way
        self.look_on_way = None
        self.step(lambda: coordination.reap(self.s, closed, asked or [], drained, self.now))

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def an_incident_asks_again(self, data: st.DataObject) -> None:
        """A held incident asks again (every REASK_S): one a rebuilt coordinator could not see is
        decided afresh; one it knows gets the same answer."""
        node = data.draw(st.sampled_from(sorted(self.live)))
        self.step(lambda: coordination.request(self.s, self.capacity(node), self.now, serve_when_freed=True))

    def answer(self, asked: list[RunRef]) -> list[RunRef]:
        """What Slurm shows of these nodes, read as find_nodes_left_drained reads it: drained by
        the incident, by its drain reason (gpuheal.core.policy.is_our_drain)."""
        return [r for r in asked if r.node in self.slurm and policy.is_our_drain(self.slurm[r.node], r.incident_id)]

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def an_incident_confirms(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from(sorted(self.live)))
        self.step(lambda: coordination.confirm(self.s, self.capacity(node), self.now))

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def an_incident_closes(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from(sorted(self.live)))
        self.close(node, returned=data.draw(st.booleans()), burn_in_failed=data.draw(st.booleans()))

    def close(self, node: str, returned: bool, burn_in_failed: bool = False) -> None:
        """An incident ends and releases. One that drained its node (granted, taken back, or
        contained while held) either gave it back (returned or replaced) or ends with it still
        drained (not granted, no capacity, aborted after the drain, or its burn-in failed: then
        the drain's reason is the burn-in's) and says so."""
        incident, run = self.live.pop(node)
        drained_it = node in self.slurm and any(incident in b and b[incident].run_id == run for b in self.s.books())
        if drained_it and returned:
            self.slurm.pop(node, None)
        elif drained_it and burn_in_failed:
            self.slurm[node] = validation.failed_reason(incident, "burn-in failed: XID 79 under load")
        left = drained_it and not returned
        self.step(
            lambda: coordination.release(self.s, incident, self.now, run, left_drained=left, placement=placement(node))
        )

    @precondition(lambda self: bool(self.dead))
    @rule(data=st.data())
    def a_terminated_runs_release_arrives_late(self, data: st.DataObject) -> None:
        """Its activity was on its way when the run was terminated: it must not free a later
        run's grant of the same node (releases are per run)."""
        incident, run = data.draw(st.sampled_from(sorted(self.dead)))
        node = incident.removeprefix("gpuheal-c-")
        live = set(self.live.values())
        before = {(r.incident_id, r.run_id) for r in reaping.holders(self.s)} & live
        left = node in self.slurm and policy.is_our_drain(self.slurm[node], incident)
        self.step(
            lambda: coordination.release(self.s, incident, self.now, run, left_drained=left, placement=placement(node))
        )
        after = {(r.incident_id, r.run_id) for r in reaping.holders(self.s)} & live
        assert before <= after, f"a late release freed a live run's hold: {before - after}"

    @precondition(lambda self: not self.s.breaker.tripped)
    @rule()
    def an_operator_pauses(self) -> None:
        self.step(lambda: steering.pause(self.s, BY, self.now))

    @precondition(lambda self: self.s.breaker.tripped)
    @rule()
    def an_operator_resumes(self) -> None:
        self.resumed = True
        self.step(lambda: steering.resume(self.s, BY, self.now))

    @precondition(lambda self: bool(self.s.queue))
    @rule(data=st.data())
    def an_operator_overrides(self, data: st.DataObject) -> None:
        held = data.draw(st.sampled_from(self.s.queue))
        o = Override(incident_id=held.incident_id, operator="bob", reason="needs it")
        self.step(lambda: steering.override(self.s, o, self.now))

    @precondition(lambda self: any(not d.decided for d in self.s.domain_incidents.values()))
    @rule(data=st.data(), decision=st.sampled_from(["release", "dismiss"]))
    def an_operator_decides_a_domain(self, data: st.DataObject, decision: str) -> None:
        domain = data.draw(st.sampled_from([d for d, i in self.s.domain_incidents.items() if not i.decided]))
        d = DomainDecision(domain=domain, decision=decision, operator="dan", reason="looked")  # type: ignore[arg-type]
        dismissed = (
            {h.incident_id for h in self.s.queue if domain in h.placement.domains} if decision == "dismiss" else set()
        )
        self.step(lambda: steering.domain_decision(self.s, d, self.now))
        for node, (incident, _) in list(self.live.items()):  # a dismissed incident ends: it releases
            if incident in dismissed:
                self.close(node, returned=False)

    @rule(cluster=BUDGETS, pool=BUDGETS, cooldown=st.sampled_from([0, 300]))
    def the_policy_changes(self, cluster: str, pool: str, cooldown: int = 300) -> None:
        """(No cooldown too: then nothing but the return holds a returned node's next incident.)"""
        update = {"cluster": cluster, "per_pool": pool, "node_cooldown_s": cooldown}
        budget = self.s.policy.policy.budget.model_copy(update=update)
        new = self.s.policy.policy.model_copy(update={"budget": budget})
        self.step(lambda: steering.set_policy(self.s, new, "carol", "tune", self.now))

    @rule(limit=BUDGETS, contains=st.sampled_from(["drain", "none"]))
    def the_containment_bound_changes(self, limit: str, contains: str = "drain") -> None:
        update = {"containment_limit": limit, "containment_while_held": contains}
        new = self.s.policy.policy.model_copy(update=update)
        self.step(lambda: steering.set_policy(self.s, new, "carol", "tune", self.now))

    @rule(mode=st.sampled_from(["observe", "approve", "auto"]))
    def the_mode_changes(self, mode: str) -> None:
        """Observe mode (a trial): incidents ask for nothing, so none is decided with an admission."""
        new = self.s.policy.policy.model_copy(update={"mode": mode})
        self.step(lambda: steering.set_policy(self.s, new, "carol", "trial", self.now))

    @rule(seconds=st.sampled_from([1, 30, 119, 121, 299, 301, 601, 3600]))
    def time_passes(self, seconds: int) -> None:
        """The coordinator's loop: at each wake time on the way, it serves its line, or looks for
        closed runs (and gives back what they held)."""
        end = self.now + timedelta(seconds=seconds)
        self.commands_end_before(end)
        while True:
            serve = coordination.next_wake(self.s, self.now)
            reap = reaping.reap_due(self.s, self.now) if self.look_on_way is None else None
            left = reaping.left_check_due(self.s, self.now) if self.look_on_way is None else None
            wake = min((t for t in (serve, reap, left) if t is not None), default=None)
            if wake is None or wake > end:
                break
            self.now = max(self.now, wake)
            if serve is not None and self.now >= serve:
                self.step(lambda: ((), coordination.serve_queue(self.s, self.now)))
            if reap is not None and self.now >= reap:
                self.look()
            elif left is not None and self.now >= left:  # a held incident: are the left nodes back?
                self.check_left()
        self.now = end

    @rule(seconds=st.sampled_from([1, 30, 121, 301, 601, 3600]), then=st.sampled_from([*NODES, "loop"]))
    def time_passes_while_the_loop_is_away(self, seconds: int, then: str) -> None:
        """The loop is away (sending notices, continuing as new) past its wake times; what comes
        first after is an incident asking (admit and request), or the loop back at its wait."""
        self.commands_end_before(self.now + timedelta(seconds=seconds))
        self.now += timedelta(seconds=seconds)
        if then != "loop" and then not in self.live:
            self.an_incident_asks(then)  # its admit and request serve what time freed
        elif coordination.frees_due(self.s, self.now):  # the loop back at its wait (workflows/fleet.py)
            self.step(lambda: ((), coordination.serve_freed(self.s, self.now)))
        reap = reaping.reap_due(self.s, self.now)
        if reap is not None and self.now >= reap and self.look_on_way is None:  # and its look, late
            self.look()

    def look(self) -> None:
        """A look for closed runs: the runs it asks about, answered from what has closed, and
        which of their nodes Slurm still shows drained by them (those an operator has not
        returned yet)."""
        runs = reaping.start_reap(self.s, self.now)
        closed = [r for r in runs if (r.incident_id, r.run_id) in self.dead]
        asked = [*closed, *reaping.left_refs(self.s)]
        self.step(lambda: coordination.reap(self.s, closed, asked, self.answer(asked), self.now))
        assert set(self.s.left) <= self.drained, "a node back in service still counted"
        still = {(r.incident_id, r.run_id) for r in reaping.holders(self.s)} & set(self.dead)
        assert not still, f"closed runs still hold something after a look: {still}"

    def check_left(self) -> None:
        """A held incident's check of the left nodes (no look for closed runs)."""
        asked = reaping.start_left_check(self.s, self.now)
        self.step(lambda: coordination.reap(self.s, [], asked, self.answer(asked), self.now))

    @rule(data=st.data())
    def the_coordinator_is_terminated_and_recreated(self, data: st.DataObject) -> None:
        """By hand, at any step; the next incident starts a fresh one within a second, which
        rebuilds from the open incidents as visibility shows them (a closed run is not among
        them; the earlier run's close may not show yet, nor a held incident that just started:
        it asks again later) and from gpuheal's drains that Slurm shows."""
        self.look_on_way = None  # the terminated run's look went with it
        self.told.clear()  # (the returns on their way: unknown to the fresh one)
        live = set(self.live.values())
        seen = {run for run in sorted(live) if data.draw(st.booleans(), label=f"visible {run}")}
        before = {(r.incident_id, r.run_id) for r in reaping.holders(self.s)} & live
        granted_before = {(g.incident_id, g.run_id) for g in self.s.grants.values()} & live
        found = []
        for node, (incident, run) in self.live.items():
            if incident in self.s.grants:
                stage = Stage.REPAIR  # granted long since: visible, and its status answers
            elif any(h.incident_id == incident for h in self.s.queue) and (incident, run) in seen:
                stage = Stage.HELD
            else:
                continue  # closed, or it has not asked yet
            drained = incident in self.s.containing or incident in self.s.contained
            found.append(
                OpenIncident(
                    incident_id=incident, run_id=run, placement=placement(node), stage=stage, contained=drained
                )
            )
        # Slurm shows every node drained by its incident, read as find_open_incidents reads it.
        left = tuple(
            OpenIncident(incident_id=f"gpuheal-c-{n}", run_id="", placement=placement(n), stage=Stage.DONE)
            for n, reason in sorted(self.slurm.items())
            if policy.is_our_drain(reason, f"gpuheal-c-{n}")
        )
        earlier = "Terminated at 2026-12-01 12:00:00" if data.draw(st.booleans(), label="earlier run visible") else ""
        self.recreated = True
        self.s = FleetState(cluster="c", policy=self.s.policy)
        found_all = OpenIncidents(incidents=tuple(found), earlier_run=earlier, left=left)
        reaping.rebuild(self.s, found_all, self.now)
        after = {(r.incident_id, r.run_id) for r in reaping.holders(self.s)}
        assert granted_before <= after, "a grant forgotten"
        assert {run for run in before if run in seen} <= after, "a visible hold forgotten"
        if earlier or found or left:
            assert self.s.breaker.tripped, "a recreated coordinator must start tripped"
        else:  # it said nothing and saw no earlier run: it looks again once visibility has caught
            self.looks_again = True  # up (reconcile.VISIBILITY_LAG_S)
        self.dead.clear()  # what closed runs held went with the terminated coordinator (their nodes: left)

    @precondition(lambda self: self.looks_again)
    @rule()
    def the_rebuild_looks_again(self) -> None:
        """Its second look: the earlier run shows now, and what else is open or drained."""
        self.looks_again = False
        found = [
            OpenIncident(incident_id=i, run_id=r, placement=placement(n), stage=Stage.REPAIR)
            for n, (i, r) in self.live.items()
            if i in self.s.grants
        ]
        left = tuple(
            OpenIncident(incident_id=f"gpuheal-c-{n}", run_id="", placement=placement(n), stage=Stage.DONE)
            for n, reason in sorted(self.slurm.items())
            if policy.is_our_drain(reason, f"gpuheal-c-{n}")
        )
        found_all = OpenIncidents(incidents=tuple(found), earlier_run="Terminated at 2026-12-01 12:00:00", left=left)
        self.step(lambda: ((), coordination.Effects(notes=reaping.rebuild(self.s, found_all, self.now))))
        assert self.s.breaker.tripped, "a recreated coordinator must be tripped once its earlier run shows"

    @rule(packed=st.booleans())
    def it_continues_as_new(self, packed: bool) -> None:
        """Carried whole (coordinators before PACKED) or packed (gpuheal.core.fleet.packing)."""
        if packed:
            carried = packing.unpack(packing.pack(self.s, self.now).data)
        else:
            carried = FleetState.model_validate_json(self.s.model_dump_json())
        assert carried == self.s
        self.s = carried

    # --- the checks -----------------------------------------------------------------------

    def step(self, change: object) -> None:
        """Run one state change; check what it granted against the limits before it."""
        tripped_before = self.s.breaker.tripped
        before = set(self.s.grants) | set(self.s.contained)  # a contained node is out already
        containing_before = set(self.s.containing)
        left_before = set(self.s.left)  # a node a closed run left drained: out already
        # Nodes the books count as out: a grant of one is its node's next incident taking it over
        # (the coordinator cannot tell one an operator returned before its next look, so it
        # counts it out until then; taking it over never puts more out than the books count).
        out_before = left_before | {g.node for b in self.s.books() for g in b.values()}
        drained_before = set(self.drained)
        change()  # type: ignore[operator]
        live = set(self.live.values())
        for b in self.s.books():  # granted or contained: drained by its live run, with its reason
            for g in b.values():  # (a terminated run drains nothing more: it runs no code)
                if (g.incident_id, g.run_id) in live and g.node not in self.foreign and g.node not in self.slurm:
                    self.slurm[g.node] = policy.drain_reason(g.incident_id, "XID 79")
        by_operator = {g.node for g in self.s.grants.values() if g.override is not None}
        if self.drained - drained_before - by_operator - out_before:  # gpuheal drained more (an override: a person's)
            p = self.s.policy.policy
            bound = limit_of(p.budget.cluster, len(NODES)) + limit_of(p.containment_limit, len(NODES))
            out = len(self.drained - by_operator)
            assert out <= bound, f"{out} drained by gpuheal's decisions, bound {bound} (+{len(by_operator)} overrides)"
        if set(self.s.containing) - containing_before:
            assert not tripped_before, "a held node contained while the breaker was tripped"
            limit = limit_of(self.s.policy.policy.containment_limit, len(NODES))
            assert len(self.s.containing) <= limit, "over the containment bound"
        self.granted_ever |= {(g.incident_id, g.run_id) for g in self.s.grants.values()}
        new = [
            g for i, g in self.s.grants.items() if i not in before and g.override is None and g.node not in out_before
        ]
        if new:
            assert not self.s.breaker.tripped or not tripped_before, "granted while the breaker was tripped"
            b = self.s.policy.policy.budget
            # A contained node is out too, as is one a closed run left drained (until it is back).
            out = [*self.s.grants.values(), *self.s.contained.values(), *self.s.left.values()]
            assert len(out) <= limit_of(b.cluster, len(NODES)), "over the cluster budget"
            if b.per_pool is not None:
                for g in new:
                    in_pool = [x for x in out if x.pool == g.pool]
                    size = placement(g.node).pool_size
                    assert len(in_pool) <= limit_of(b.per_pool, size), f"over the budget of pool {g.pool}"

    def capacity(self, node: str, contain_if_held: bool = False) -> CapacityRequest:
        incident, run = self.live[node]
        return CapacityRequest(
            cluster="c",
            incident_id=incident,
            run_id=run,
            placement=placement(node),
            action=ActionClass.REPLACE_NODE,
            contain_if_held=contain_if_held,
        )

    @invariant()
    def the_breaker_resets_only_by_a_person(self) -> None:
        """(Save while a coordinator that found nothing at all waits for its second look: a pause
        is all it could have forgotten, and the second look trips it again.)"""
        if getattr(self, "_was_tripped", False) and not self.s.breaker.tripped and not self.looks_again:
            assert self.resumed, "the breaker reset itself"
        self._was_tripped = self.s.breaker.tripped
        self.resumed = False

    @invariant()
    def nothing_in_line_could_go_now(self) -> None:
        copy = self.s.model_copy(deep=True)
        assert coordination.serve_queue(copy, self.now).signals == [], "a held incident could go but waits"

    @invariant()
    def a_node_out_already_is_never_held_by_the_budget(self) -> None:
        """Granting a contained incident again takes no more capacity: only the breaker, its
        domain, a cooldown or the rate may hold it (else contained ones can block each other)."""
        for h in self.s.queue:
            if h.incident_id in self.s.contained:
                assert not h.reason.startswith("disruption budget"), h.reason

    @invariant()
    def every_node_gpuheal_drained_is_counted_once(self) -> None:
        counted = {g.node for b in self.s.books() for g in b.values()} | set(self.s.left)
        assert self.drained <= counted, f"drained, not counted: {self.drained - counted}"
        books = [g.node for b in self.s.books() for g in b.values()] + list(self.s.left)
        twice = {n for n in books if books.count(n) > 1}
        assert not twice, f"counted twice: {twice}"

    def being_returned(self, node: str) -> bool:
        """An operator's command will resume it, and the coordinator knows (a recreated one does
        not: its tripped breaker holds everything instead)."""
        return node in self.told

    @invariant()
    def no_live_run_is_given_a_node_its_return_will_resume(self) -> None:
        live = set(self.live.values())
        for book in (self.s.grants, self.s.containing):
            for g in book.values():
                assert not ((g.incident_id, g.run_id) in live and self.being_returned(g.node)), g

    @invariant()
    def a_node_being_returned_is_a_left_node(self) -> None:
        """(So `returning` never outgrows the books, and a stale entry never refuses a containment.)"""
        assert set(self.s.returning) <= set(self.s.left), (
            f"returning, not left: {set(self.s.returning) - set(self.s.left)}"
        )

    @invariant()
    def each_grant_counts_once_against_the_rate(self) -> None:
        assert len(self.s.remediations) <= len(self.granted_ever), "an incident counted twice against the rate"

    @invariant()
    def every_grant_and_hold_belongs_to_a_live_run_or_is_looked_for_within_the_bound(self) -> None:
        live = set(self.live.values())
        for ref in reaping.holders(self.s):
            run = (ref.incident_id, ref.run_id)
            assert run in live or run in self.dead, f"{run} holds something but never asked"
            if run in self.dead and self.look_on_way is None:  # (one on its way ends first: then due)
                due = reaping.reap_due(self.s, self.now)
                bound = self.dead[run] + timedelta(seconds=reaping.REAP_EVERY_S)
                assert due is not None and due <= bound, f"{run} closed at {self.dead[run]}, next look {due}"
        assert not set(self.s.grants) & {h.incident_id for h in self.s.queue}
        # Taken back: in line again (unless its run closed and the entry waits for the reaper).
        dead = {incident for incident, _ in self.dead}
        assert set(self.s.contained) - dead <= {h.incident_id for h in self.s.queue}
        assert not set(self.s.contained) & set(self.s.grants)

    @invariant()
    def the_indexes_read_the_books_as_they_are(self) -> None:
        """The arrivals' and the line's indexes, kept in step across every step (never rebuilt
        here unless a step changed a list otherwise), answer as the lists themselves do."""
        assert_index_true(self.s)


Coordinator.TestCase.settings = settings(max_examples=500, stateful_step_count=40, deadline=None)
TestCoordinator = Coordinator.TestCase
