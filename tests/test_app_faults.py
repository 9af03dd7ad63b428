"""Application faults never condemn hardware (issue 34, items 1 and 2): an incident whose action
is an application restart (XID 13, 31, 43) moves no breaker, no domain escalation and no
repeat-offender count, and is told no repeat verdict; hardware incidents count as before, as if
the application faults had never come. Pure decisions (gpuheal.core.fleet.coordination.admit),
over random interleavings (Hypothesis), beside the cases a new user tried."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from hypothesis import event, given, settings
from hypothesis import strategies as st
from temporalio.testing import WorkflowEnvironment

from gpuheal.core import messages as m
from gpuheal.core import policy
from gpuheal.core.fleet import coordination, windows
from gpuheal.core.fleet.models import Admission, AdmitRequest, FleetState, Placement
from gpuheal.core.fleet.policy import BreakerPolicy, EscalationPolicy, FleetPolicy, RepeatPolicy, VersionedPolicy
from gpuheal.core.models.base import ActionClass
from gpuheal.core.models.report import HealthReport
from tests.test_coordinator_faults import Receiver, coordinator, env, worker

__all__ = ["env"]  # the fixture, shared with tests/test_coordinator_faults.py

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
NODES = ("gpu01", "gpu02", "gpu03", "gpu04")
SERIALS = ("", "S1", "S2")
APP, HARDWARE = ActionClass.RESTART_APP, (ActionClass.RESET_GPU, ActionClass.REBOOT_NODE, ActionClass.REPLACE_NODE)
# Tight enough that a handful of reports trips the breaker, escalates a rack or makes an offender.
POLICY = FleetPolicy(
    breaker=BreakerPolicy(max_incidents=3, window_s=600),
    escalation=EscalationPolicy(domain_share=0.5, min_nodes=2, window_s=600),
    repeat=RepeatPolicy(incidents=2),
)


def fresh() -> FleetState:
    return FleetState(cluster="c", policy=VersionedPolicy(version=1, policy=POLICY, changed_by="t", reason="t", at=T0))


def admission(node: str, action: ActionClass, n: int, serial: str = "", app: bool | None = None) -> AdmitRequest:
    """`app`: an application fault (default: a restart is one; XID 94's restart is not)."""
    return AdmitRequest(
        incident_id=f"gpuheal-c-{node}",
        run_id=f"run-{n}",
        cluster="c",
        placement=Placement(node=node, cluster_size=len(NODES), pool="h100", pool_size=4, domains={"rack=r1": 4}),
        action=action,
        what=f"report {n}",
        gpu_serials=(serial,) if serial else (),
        seed=POLICY,
        application_fault=action == APP if app is None else app,
    )


def admit(s: FleetState, req: AdmitRequest, at: datetime, compact: bool) -> Admission:
    answer, _ = coordination.admit(s, req, at, serve_when_freed=True, compact=compact, app_faults_apart=True)
    return answer


def xid_report(xid: int) -> HealthReport:
    return HealthReport(cluster="c", node="gpu02", xid=xid, source="test", observed_at=T0)


def xid_action(xid: int) -> ActionClass:
    return policy.triage(xid_report(xid)).action


def test_only_the_application_xids_are_application_faults() -> None:
    """13, 31 and 43 say the application; 94 (a contained ECC error) restarts it too but is the
    board's memory; an informational report beside them changes nothing, a hardware one does."""
    assert all(policy.is_application_fault([xid_report(x)]) for x in (13, 31, 43))
    assert xid_action(94) == ActionClass.RESTART_APP and not policy.is_application_fault([xid_report(94)])
    assert policy.is_application_fault([xid_report(13), xid_report(63)])
    assert not policy.is_application_fault([xid_report(13), xid_report(94)])
    assert not policy.is_application_fault([xid_report(13), xid_report(79)])


def test_xids_31_43_13_on_one_node_within_a_minute_condemn_nothing() -> None:
    """What a new user tried: three application faults on gpu02 within a minute. Before, the
    third was a repeat offender (replace_node); now none is, and the breaker and rack are unmoved."""
    s = fresh()
    for n, xid in enumerate((31, 43, 13)):
        assert policy.is_application_fault([xid_report(xid)])
        answer = admit(s, admission("gpu02", xid_action(xid), n, serial="S1"), T0 + timedelta(seconds=20 * n), True)
        assert answer.repeat_offender is None and answer.domain_incident is None and answer.breaker is None
    assert not s.breaker.tripped and not s.domain_incidents and not s.arrivals


def test_hardware_incidents_keep_the_repeat_offender_rule() -> None:
    s = fresh()
    admit(s, admission("gpu02", ActionClass.RESET_GPU, 0, serial="S1"), T0, True)
    answer = admit(s, admission("gpu02", ActionClass.RESET_GPU, 1, serial="S1"), T0 + timedelta(minutes=1), True)
    assert answer.repeat_offender == "repeat offender: 2 incidents on GPU serial S1 within 7 days"


def test_before_the_change_application_faults_counted_as_coordinators_of_earlier_releases_do() -> None:
    """Without app_faults_apart (a coordinator started before APP_FAULTS_APART replays so):
    the second application fault of a GPU is a repeat offender, as it was."""
    s = fresh()
    for n in range(2):
        answer, _ = coordination.admit(s, admission("gpu02", APP, n, serial="S1"), T0, compact=True)
    assert answer.repeat_offender is not None


step = st.tuples(
    st.sampled_from(NODES),
    st.sampled_from([APP, *HARDWARE]),
    st.sampled_from(SERIALS),
    st.integers(min_value=0, max_value=900),  # seconds after the step before
    st.booleans(),  # a restart that is an application fault (XID 13), or not (XID 94)
)


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(step, min_size=1, max_size=25), compact=st.booleans())
def test_application_faults_change_nothing_that_hardware_incidents_are_told(
    steps: list[tuple[str, ActionClass, str, int, bool]], compact: bool
) -> None:
    """Any interleaving: every application fault is told no repeat verdict, and the hardware
    incidents' answers and the breaker, domains and repeat books end exactly as they would had
    the application faults never come (the same time passing)."""
    mixed, alone = fresh(), fresh()
    at = T0
    for n, (node, action, serial, gap, app) in enumerate(steps):
        at += timedelta(seconds=gap)
        req = admission(node, action, n, serial, app=action == APP and app)
        told = admit(mixed, req, at, compact)
        if req.application_fault:
            assert told.repeat_offender is None, "an application fault condemned hardware"
            windows.forget_before(alone, at, compact=compact)  # the same time passed there too
            continue
        assert told == admit(alone, req, at, compact), "an application fault moved a hardware verdict"
    assert mixed.breaker == alone.breaker
    event(f"breaker tripped: {mixed.breaker.tripped}; domains: {len(mixed.domain_incidents)}")
    assert mixed.domain_incidents == alone.domain_incidents
    assert mixed.arrivals == alone.arrivals and mixed.past == alone.past


async def test_the_coordinator_tells_application_faults_no_verdict_and_counts_them_nowhere(
    env: WorkflowEnvironment,
) -> None:
    """The real coordinator (time-skipping server): XID 31, 43 and 13 on gpu02's board S1 within a
    minute, with a breaker of 2 and a repeat rule of 2. None is a repeat offender, the breaker
    stays closed, and the board's first hardware incident after them is its first."""
    receiver, queue = Receiver(up=True), f"tq-{uuid.uuid4()}"
    async with worker(env, queue, receiver):
        handle = await coordinator(env, queue, POLICY)
        for n, xid in enumerate((31, 43, 13)):
            answer = await m.FLEET_ADMIT.execute(handle, admission("gpu02", xid_action(xid), n, serial="S1"))
            assert answer.repeat_offender is None and answer.breaker is None
        first = await m.FLEET_ADMIT.execute(handle, admission("gpu02", ActionClass.RESET_GPU, 3, serial="S1"))
        assert first.repeat_offender is None, "application faults counted towards the board's repeats"
        status = await m.FLEET_STATUS.ask(handle)
        assert not status.breaker.tripped and status.domain_incidents == ()
        await handle.terminate("test over")
