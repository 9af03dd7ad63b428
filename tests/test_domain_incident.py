"""A domain incident never holds its domain for good (issue 32, item 6).

- Pure (gpuheal.core.fleet.domain_reaping): an undecided domain incident whose workflow closed,
  or that is past its bound plus the margin, is released by default, and its held node
  incidents are served within the budget; a decided one is left as it is.
- The workflow, on the time-skipping server: a notice receiver refusing for minutes and a
  coordinator failing its calls for hours; it still ends with its decision delivered. A
  history recorded before the fix (its notice lost: the workflow failed) still replays.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker

from gpuheal.activities import interface as act
from gpuheal.activities.interface import implements
from gpuheal.clients.temporal import DATA_CONVERTER
from gpuheal.core import messages as m
from gpuheal.core.fleet import coordination, domain_reaping, steering
from gpuheal.core.fleet.models import (
    AdmitRequest,
    CapacityRequest,
    DomainDecision,
    DomainDecisionFor,
    DomainIncident,
    DomainIncidentInput,
    FleetState,
    Placement,
    RunRef,
)
from gpuheal.core.fleet.policy import BudgetPolicy, EscalationPolicy, FleetPolicy, VersionedPolicy
from gpuheal.core.models.base import ActionClass
from gpuheal.core.models.incident import POLICY_OPERATOR
from gpuheal.core.models.result import Notification
from gpuheal.workflows.domain import DomainIncidentWorkflow

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
RACK = {"rack=r1": 4}
NODES = ("gpu01", "gpu02", "gpu03")

# --- the coordinator's side, pure ---------------------------------------------------------------


def rack_held() -> tuple[FleetState, DomainIncident]:
    """Three nodes of a rack of four failed within minutes: a domain incident holds them all,
    with a budget of one."""
    policy = FleetPolicy(
        budget=BudgetPolicy(cluster="1", rate=100, node_cooldown_s=0),
        escalation=EscalationPolicy(domain_share=0.5, window_s=300, min_nodes=2),
    )
    s = FleetState(cluster="c", policy=VersionedPolicy(version=1, policy=policy, changed_by="t", reason="t", at=T0))
    places = [Placement(node=n, cluster_size=100, pool="h100", pool_size=20, domains=RACK) for n in NODES]
    for p in places:
        admit = AdmitRequest(
            incident_id=f"i-{p.node}",
            cluster="c",
            placement=p,
            action=ActionClass.REPLACE_NODE,
            what="XID 79",
            seed=policy,
        )
        coordination.admit(s, admit, T0)
    for p in places:
        ask = CapacityRequest(cluster="c", incident_id=f"i-{p.node}", placement=p, action=ActionClass.REPLACE_NODE)
        assert not coordination.request(s, ask, T0)[0].granted
    d = s.domain_incidents["rack=r1"]
    assert not d.decided and all("held by domain incident" in h.reason for h in s.queue)
    return s, d


def released_by_default(s: FleetState, d: DomainIncident, out: coordination.Effects, why: str) -> None:
    assert s.domain_incidents["rack=r1"].decided == "release"
    assert [i for i, n in out.signals if n.granted] == ["i-gpu01"]  # within the budget of one
    assert [h.incident_id for h in s.queue] == ["i-gpu02", "i-gpu03"]
    assert all("disruption budget" in h.reason for h in s.queue)
    [(event, severity, text)] = out.notes
    assert (event, severity) == ("domain_incident_defaulted", "warning")
    assert d.incident_id in text and why in text and "released by default" in text


def test_a_domain_incident_whose_workflow_closed_undecided_is_released_by_default() -> None:
    s, d = rack_held()
    refs = domain_reaping.undecided_refs(s)
    assert refs == [RunRef(incident_id=d.incident_id, run_id="", node="")]
    assert domain_reaping.undecided_refs(s, opening=[d.incident_id]) == []  # not started yet is not closed
    # A node incident's closed run in the same look is not a domain incident's.
    later = T0 + timedelta(minutes=20)
    assert domain_reaping.reap_domains(s, [RunRef(incident_id="i-other", run_id="r1")], later).notes == []
    out = domain_reaping.reap_domains(s, refs, later)
    released_by_default(s, d, out, "ended without a decision")
    assert domain_reaping.undecided_refs(s) == []


def test_an_undecided_domain_incident_past_its_bound_and_margin_is_released_by_default() -> None:
    s, d = rack_held()
    bound = domain_reaping.DEFAULT_BOUND_S + domain_reaping.OVERDUE_MARGIN_S
    almost = T0 + timedelta(seconds=bound - 1)
    assert domain_reaping.overdue(s, almost) == [] and domain_reaping.release_overdue(s, almost).notes == []
    assert s.domain_incidents["rack=r1"].decided == ""
    due = T0 + timedelta(seconds=bound)
    assert domain_reaping.overdue(s, due) == [d]
    out = domain_reaping.release_overdue(s, due)
    released_by_default(s, d, out, "no decision 90 min after it opened")
    assert domain_reaping.overdue(s, due + timedelta(hours=1)) == []  # decided now


def test_a_decided_domain_incident_is_left_as_it_is() -> None:
    s, d = rack_held()
    dismiss = DomainDecision(domain="rack=r1", decision="dismiss", operator="alice", reason="switch replaced")
    _, out = steering.domain_decision(s, dismiss, T0 + timedelta(minutes=5))
    assert len(out.signals) == 3 and not s.queue  # the rack's incidents end
    before = s.model_copy(deep=True)
    much_later = T0 + timedelta(days=1)
    ref = RunRef(incident_id=d.incident_id)
    assert domain_reaping.undecided_refs(s) == [] and domain_reaping.overdue(s, much_later) == []
    assert domain_reaping.reap_domains(s, [ref], much_later) == coordination.Effects()
    assert domain_reaping.release_overdue(s, much_later) == coordination.Effects()
    assert s == before and s.domain_incidents["rack=r1"].decided == "dismiss"


# --- the workflow, on the time-skipping server --------------------------------------------------


class Outage:
    """The notice receiver refuses for its first `notice_down`, the coordinator's decision call
    fails for its first `coordinator_down` (each counted from the workflow's start, server time)."""

    def __init__(self, notice_down: timedelta, coordinator_down: timedelta) -> None:
        self.notice_down, self.coordinator_down = notice_down, coordinator_down
        self.start: datetime | None = None  # the first notice is scheduled as the workflow starts
        self.notices: list[datetime] = []
        self.decisions: list[tuple[datetime, str]] = []

    def activities(self) -> list[Callable[..., Any]]:
        @implements(act.NOTIFY_OPERATORS)
        async def notify(note: Notification) -> None:
            at = self._since_start()
            self.notices.append(activity.info().current_attempt_scheduled_time)
            if at < self.notice_down:
                raise ApplicationError(f"connection refused ({at} after the start)")

        @implements(act.DECIDE_DOMAIN)
        async def decide(d: DomainDecisionFor) -> str:
            at = self._since_start()
            self.decisions.append((activity.info().current_attempt_scheduled_time, d.decision.decision))
            if at < self.coordinator_down:
                raise ApplicationError("timed out waiting for the coordinator's update (a storm's batches ahead)")
            return f"{d.decision.domain}: {d.decision.decision} by {d.decision.operator}"

        return [notify, decide]

    def _since_start(self) -> timedelta:
        at = activity.info().current_attempt_scheduled_time
        self.start = self.start or at
        return at - self.start


def domain_input(within_s: float = 600.0) -> DomainIncidentInput:
    d = DomainIncident(
        cluster="c",
        domain="rack=r1",
        incident_id=f"gpuheal-c-domain-{uuid.uuid4().hex[:8]}",
        nodes=NODES,
        opened_at=T0,
    )
    return DomainIncidentInput(cluster="c", incident=d, decide_within_s=within_s)


async def test_the_domain_workflow_outlasts_a_notice_outage_and_a_busy_coordinator(env: WorkflowEnvironment) -> None:
    """The notice receiver refuses for 10 minutes (its retries give up within ~5), the
    coordinator's decision call fails for 15 minutes (within DELIVER_WITHIN): the workflow ends
    with the operator's decision delivered, and says the notice was lost."""
    outage, queue = Outage(timedelta(minutes=10), timedelta(minutes=15)), f"tq-{uuid.uuid4()}"
    inp = domain_input()
    async with Worker(env.client, task_queue=queue, workflows=[DomainIncidentWorkflow], activities=outage.activities()):
        handle = await env.client.start_workflow(
            m.DOMAIN_INCIDENT.name,
            inp,
            id=inp.incident.incident_id,
            task_queue=queue,
            result_type=m.DOMAIN_INCIDENT.output,
        )
        alice = DomainDecision(domain="rack=r1", decision="dismiss", operator="alice", reason="switch replaced")
        assert await m.DOMAIN_DECIDE.execute(handle, alice) == "dismiss recorded by alice"
        result = await handle.result()
        details = (await handle.query("__temporal_workflow_metadata")).current_details
    assert result.decision == alice and result.coordinator == "rack=r1: dismiss by alice"
    assert len(outage.notices) > 1  # retried, then given up on, without failing the workflow
    assert "notice domain_incident undelivered: connection refused" in details
    first, last = outage.decisions[0][0], outage.decisions[-1][0]
    assert last - first >= timedelta(minutes=5) and {x for _, x in outage.decisions} == {"dismiss"}


async def test_without_a_decision_the_default_is_delivered_through_the_outage(env: WorkflowEnvironment) -> None:
    outage, queue = Outage(timedelta(minutes=10), timedelta(minutes=15)), f"tq-{uuid.uuid4()}"
    inp = domain_input(within_s=60)
    async with Worker(env.client, task_queue=queue, workflows=[DomainIncidentWorkflow], activities=outage.activities()):
        result = await env.client.execute_workflow(
            m.DOMAIN_INCIDENT.name,
            inp,
            id=inp.incident.incident_id,
            task_queue=queue,
            result_type=m.DOMAIN_INCIDENT.output,
        )
    assert (result.decision.decision, result.decision.operator) == ("release", POLICY_OPERATOR)
    assert result.coordinator == f"rack=r1: release by {POLICY_OPERATOR}"


async def test_a_history_from_before_the_fix_replays(env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recorded as the release before ran (no patch marker: workflow.patched answers False, so the
    notice's failure fails the workflow), then replayed through the code as it is."""
    outage, queue = Outage(timedelta(hours=1), timedelta(0)), f"tq-{uuid.uuid4()}"
    inp = domain_input()
    with monkeypatch.context() as before:
        before.setattr(workflow, "patched", lambda _id: False)
        async with Worker(
            env.client,
            task_queue=queue,
            workflows=[DomainIncidentWorkflow],
            activities=outage.activities(),
            workflow_runner=UnsandboxedWorkflowRunner(),
        ):
            handle = await env.client.start_workflow(
                m.DOMAIN_INCIDENT.name, inp, id=inp.incident.incident_id, task_queue=queue
            )
            with pytest.raises(WorkflowFailureError):
                await handle.result()
    history = await handle.fetch_history()
    await Replayer(workflows=[DomainIncidentWorkflow], data_converter=DATA_CONVERTER).replay_workflow(history)
