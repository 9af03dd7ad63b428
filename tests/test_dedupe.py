"""The duplicate check (gpuheal.core.dedupe): one row per (last incident, node state, new report),
properties over any history of a node, and the start path's reading of Temporal (a fake client:
visibility that lags behind a close, a coordinator that is never asked)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast, get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from temporalio.client import Client, WorkflowContinuedAsNewError, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from gpuheal.core import dedupe, ids, policy
from gpuheal.core import search_attributes as sa
from gpuheal.core.dedupe import Duplicate, Failure, New, PastIncident
from gpuheal.core.fleet.policy import FleetPolicy
from gpuheal.core.models.base import ActionClass, NodeState, Outcome
from gpuheal.core.models.report import HealthReport
from gpuheal.core.models.result import RemediationResult
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import already_handled

A, S = ActionClass, NodeState
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
WINDOW = 600.0
INCIDENT = ids.incident_id("c1", "gpu01")


def report(
    xid: int | None = 79,
    gpu: int | None = 0,
    key: str | None = None,
    signal: str | None = None,
    uuid: str | None = None,
) -> HealthReport:
    return HealthReport(
        node="gpu01", cluster="c1", xid=xid, signal=signal, gpu=gpu, observed_at=NOW, alert_key=key, gpu_uuid=uuid
    )


def incident(
    xid: int | None,
    action: ActionClass | None,
    outcome: Outcome | None,
    state: NodeState,
    *,
    gpu: int | None = 0,
    keys: tuple[str, ...] = (),
    ago_s: float = 1,
    run: str = "r1",
    signal: str | None = None,
    uuid: str | None = None,
) -> PastIncident:
    return PastIncident(
        incident_id=INCIDENT,
        run_id=run,
        closed_at=NOW - timedelta(seconds=ago_s),
        alert_keys=frozenset(keys),
        failures=(Failure(xid=xid, signal=signal, gpu=gpu, gpu_uuid=uuid),) if xid or signal else (),
        action=action,
        outcome=outcome,
        node_state=state,
    )


IGNORED_63 = incident(63, A.IGNORE, "ignored", S.UNTOUCHED, keys=("xid63@1",))
ABORTED_79 = incident(79, A.REPLACE_NODE, "aborted", S.DRAINED, keys=("xid79@1",))
WAITING_79 = incident(79, A.REPLACE_NODE, "no_capacity", S.AWAITING_REPLACEMENT)
RESOLVED_48 = incident(48, A.RESET_GPU, "resolved", S.RETURNED, gpu=1, keys=("xid48@1",))
FAILED_RUN = PastIncident(
    incident_id=INCIDENT, run_id="r1", closed_at=NOW, alert_keys=frozenset({"xid79@1"}), completed=False
)

# (case, the node's closed incidents, what the scheduler says now, the new report, window)
#   -> ("duplicate", its kind, the run it names) or ("new", ...)
ROWS: list[tuple[str, list[PastIncident], bool | None, HealthReport, float, tuple[str, str | None, str | None]]] = [
    # the three: a different failure, a more severe one, a recurrence on a node back in service
    ("XID 63 ignored, then XID 31 a second later", [IGNORED_63], None, report(31), WINDOW, ("new", None, None)),
    ("XID 63 ignored, then XID 79 a second later", [IGNORED_63], None, report(79), WINDOW, ("new", None, None)),
    (
        "XID 79 aborted, the operator resumed the node, a new XID 79 alert",
        [ABORTED_79],
        True,
        report(79, key="xid79@2"),
        WINDOW,
        ("new", None, None),
    ),
    # the window's own case: the same failure delivered again while the node is out
    (
        "XID 79 aborted, node still drained, the same XID 79 from a second source",
        [ABORTED_79],
        None,
        report(79, key="xid79@2"),
        WINDOW,
        ("duplicate", "same_failure", "r1"),
    ),
    (
        "XID 79 aborted, the scheduler says still drained, the agent's XID 79",
        [ABORTED_79],
        False,
        report(79),
        WINDOW,
        ("duplicate", "same_failure", "r1"),
    ),
    (  # the soak's relapse (infra.soak.acts): its new run must find the node drained, not drain again
        "XID 79 aborted on GPU 0, node still drained, XID 79 on GPU 1",
        [ABORTED_79],
        False,
        report(79, gpu=1, key="xid79@2"),
        WINDOW,
        ("new", None, None),
    ),
    (
        "XID 79 aborted, the same alert re-sent",
        [ABORTED_79],
        True,
        report(79, key="xid79@1"),
        WINDOW,
        ("duplicate", "same_alert", "r1"),
    ),
    (
        "XID 48 repaired and returned, the same alert re-sent",
        [RESOLVED_48],
        None,
        report(48, gpu=1, key="xid48@1"),
        WINDOW,
        ("duplicate", "same_alert", "r1"),
    ),
    (
        "XID 48 repaired and returned, XID 48 on that GPU again: a repeat offender",
        [RESOLVED_48],
        None,
        report(48, gpu=1),
        WINDOW,
        ("new", None, None),
    ),
    (
        "XID 79 waiting for a replacement, the agent's XID 79",
        [WAITING_79],
        None,
        report(79),
        WINDOW,
        ("duplicate", "same_failure", "r1"),
    ),
    (
        "XID 79 waiting for a replacement, XID 79 on GPU 3",
        [WAITING_79],
        None,
        report(79, gpu=3),
        WINDOW,
        ("new", None, None),
    ),
    ("XID 79 waiting for a replacement, XID 48 on GPU 0", [WAITING_79], None, report(48), WINDOW, ("new", None, None)),
    (
        "XID 48 not granted, node drained, XID 79 on that GPU: more severe",
        [incident(48, A.RESET_GPU, "not_granted", S.DRAINED)],
        None,
        report(79),
        WINDOW,
        ("new", None, None),
    ),
    (
        "XID 48 aborted 700 s ago, node drained, XID 48 again",
        [incident(48, A.RESET_GPU, "aborted", S.DRAINED, ago_s=700)],
        None,
        report(48),
        WINDOW,
        ("new", None, None),
    ),
    ("no duplicate window, node drained, XID 79 again", [ABORTED_79], None, report(79), 0, ("new", None, None)),
    (
        "no duplicate window, the same alert 2 h after its incident closed",
        [incident(79, A.REPLACE_NODE, "resolved", S.REPLACED, keys=("xid79@1",), ago_s=7200)],
        None,
        report(79, key="xid79@1"),
        0,
        ("duplicate", "same_alert", "r1"),
    ),
    (
        "XID 79 replaced, a late XID 79 for the old node",
        [incident(79, A.REPLACE_NODE, "resolved", S.REPLACED)],
        None,
        report(79),
        WINDOW,
        ("duplicate", "same_failure", "r1"),
    ),
    (
        "XID 79 escalated to its domain, XID 79 again",
        [incident(79, A.REPLACE_NODE, "escalated", S.ESCALATED)],
        None,
        report(79),
        WINDOW,
        ("duplicate", "same_failure", "r1"),
    ),
    (
        "XID 48 blocked by a PDB, XID 48 again",
        [incident(48, A.RESET_GPU, "aborted", S.BLOCKED)],
        None,
        report(48),
        WINDOW,
        ("duplicate", "same_failure", "r1"),
    ),
    (
        "XID 48 repaired, left drained by someone else, XID 48 again",
        [incident(48, A.RESET_GPU, "resolved", S.LEFT_DRAINED)],
        None,
        report(48),
        WINDOW,
        ("new", None, None),
    ),
    (
        "XID 31 restart_app (never drained), XID 31 again",
        [incident(31, A.RESTART_APP, "resolved", S.IN_SERVICE)],
        None,
        report(31),
        WINDOW,
        ("new", None, None),
    ),
    ("a run that failed (no result), XID 79", [FAILED_RUN], None, report(79), WINDOW, ("new", None, None)),
    (
        "a run that failed (no result), its alert re-sent: it handled nothing",
        [FAILED_RUN],
        None,
        report(79, key="xid79@1"),
        WINDOW,
        ("new", None, None),
    ),
    (
        "XID 48 drained on GPU-a, XID 48 on GPU-b (by NVML UUID, same index)",
        [incident(48, A.RESET_GPU, "aborted", S.DRAINED, uuid="GPU-a")],
        None,
        report(48, uuid="GPU-b"),
        WINDOW,
        ("new", None, None),
    ),
    (
        "XID 79 drained on GPU 0, XID 79 naming no GPU (gpuheal report --xid 79)",
        [ABORTED_79],
        None,
        report(79, gpu=None),
        WINDOW,
        ("duplicate", "same_failure", "r1"),
    ),
    (
        "XID 154 node_reboot drained, XID 154 gpu_reset",
        [incident(154, A.REBOOT_NODE, "aborted", S.DRAINED, signal="node_reboot")],
        None,
        report(154, signal="gpu_reset"),
        WINDOW,
        ("new", None, None),
    ),
    (
        "recorded as less severe than the report's own triage (an earlier release's catalogue)",
        [incident(79, A.RESET_GPU, "aborted", S.DRAINED)],
        None,
        report(79),
        WINDOW,
        ("new", None, None),
    ),
    (
        "XID 79 aborted (drained) 300 s ago, XID 63 ignored since, XID 79 again",
        [
            ABORTED_79.model_copy(update={"closed_at": NOW - timedelta(seconds=300)}),
            IGNORED_63.model_copy(update={"run_id": "r2"}),
        ],
        None,
        report(79),
        WINDOW,
        ("duplicate", "same_failure", "r1"),
    ),
    (
        # (the restart says untouched, not drained: else its record would hide the aborted one, and the
        # XID 79 would be news again)
        "XID 79 aborted (drained) 300 s ago, an XID 31 restart on the node since, XID 79 again",
        [
            ABORTED_79.model_copy(update={"closed_at": NOW - timedelta(seconds=300)}),
            incident(31, A.RESTART_APP, "resolved", S.UNTOUCHED, run="r2"),
        ],
        None,
        report(79),
        WINDOW,
        ("duplicate", "same_failure", "r1"),
    ),
    (
        "XID 79 aborted 300 s ago, XID 48 repaired and returned since, XID 79 again",
        [
            ABORTED_79.model_copy(update={"closed_at": NOW - timedelta(seconds=300)}),
            RESOLVED_48.model_copy(update={"run_id": "r2"}),
        ],
        None,
        report(79),
        WINDOW,
        ("new", None, None),
    ),
    ("no earlier incident", [], None, report(79), WINDOW, ("new", None, None)),
]


@pytest.mark.parametrize(
    ("case", "incidents", "in_service", "new", "window", "expected"), ROWS, ids=[r[0] for r in ROWS]
)
def test_the_table(
    case: str,
    incidents: list[PastIncident],
    in_service: bool | None,
    new: HealthReport,
    window: float,
    expected: tuple[str, str | None, str | None],
) -> None:
    verdict = dedupe.decide(new, incidents, now=NOW, window_s=window, in_service_now=in_service)
    if expected[0] == "new":
        assert isinstance(verdict, New), verdict
    else:
        assert isinstance(verdict, Duplicate), verdict
        assert (verdict.kind, verdict.run_id, verdict.incident_id) == (expected[1], expected[2], INCIDENT)
    assert verdict.why


def test_the_answers_say_why() -> None:
    dup = dedupe.decide(report(79), [ABORTED_79], now=NOW, window_s=WINDOW)
    assert str(dup) == (
        f"{INCIDENT} (XID 79 on GPU 0 again while gpu01 is still drained from it, closed 1 s ago, "
        "within the 600 s duplicate window)"
    )
    other = dedupe.decide(report(31), [IGNORED_63], now=NOW, window_s=WINDOW)
    assert other == New(why="gpu01 is not out of service from an earlier incident")
    xid = dedupe.decide(report(48), [WAITING_79], now=NOW, window_s=WINDOW)
    assert xid == New(why=f"XID 48 on GPU 0 is not what {INCIDENT} handled (XID 79 on GPU 0)")


# --- properties over any history of a node ------------------------------------------------

KEYS = ["k1", "k2", "k3"]
failures = st.builds(
    Failure,
    xid=st.sampled_from([13, 31, 48, 63, 74, 79, 92, 154, 999]),
    signal=st.none(),
    gpu=st.one_of(st.none(), st.integers(0, 2)),
    gpu_uuid=st.one_of(st.none(), st.sampled_from(["GPU-a", "GPU-b"])),
)
keys = st.one_of(st.none(), st.sampled_from([*KEYS, "k-new"]))


@st.composite
def pasts(draw: st.DrawFn, run_id: str) -> PastIncident:
    state = draw(st.sampled_from(list(NodeState)))
    no_result = state == NodeState.UNKNOWN and draw(st.booleans())  # a failed run: nothing but its keys
    return PastIncident(
        incident_id=INCIDENT,
        run_id=run_id,
        closed_at=NOW - timedelta(seconds=draw(st.integers(0, 1200))),
        alert_keys=draw(st.frozensets(st.sampled_from(KEYS), max_size=2)),
        failures=() if no_result else tuple(draw(st.lists(failures, max_size=3))),
        action=None if no_result else draw(st.sampled_from(list(ActionClass))),
        outcome=None if no_result else draw(st.sampled_from(get_args(Outcome))),
        node_state=state,
        completed=not no_result,
    )


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[PastIncident], HealthReport]:
    """A node's history and a new report, which half the time repeats a failure it holds (the
    interesting half: only those can be dropped as the same failure)."""
    incidents = [draw(pasts(f"r{n}")) for n in range(draw(st.integers(0, 4)))]
    seen = [f for i in incidents for f in i.failures]
    f = draw(st.sampled_from(seen)) if seen and draw(st.booleans()) else draw(failures)
    return incidents, report(f.xid, f.gpu, draw(keys), uuid=f.gpu_uuid)


windows = st.sampled_from([0.0, 60.0, 600.0])
probes = st.sampled_from([None, True, False])


def fresh_key(r: HealthReport, incidents: list[PastIncident]) -> bool:
    """No incident that acted on this alert had it: one that ran to its close, granted, on a node
    in service."""
    return r.alert_key is None or all(
        r.alert_key not in i.alert_keys or not i.completed or i.outcome in ("not_granted", "not_in_service")
        for i in incidents
    )


def more_severe(a: ActionClass, b: ActionClass) -> bool:
    return a != b and policy.more_severe(a, b) == a


@settings(max_examples=400)
@given(cases(), windows, probes)
def test_a_more_severe_report_is_never_a_duplicate(
    case: tuple[list[PastIncident], HealthReport], window: float, probe: bool | None
) -> None:
    """Of any incident with a less severe action: the last one alone, or whichever it names."""
    incidents, r = case
    verdict = dedupe.decide(r, incidents, now=NOW, window_s=window, in_service_now=probe)
    if not fresh_key(r, incidents) or not isinstance(verdict, Duplicate):
        return
    named = next(i for i in incidents if i.run_id == verdict.run_id)
    assert named.action is None or not more_severe(policy.triage(r).action, named.action)
    if len(incidents) == 1 and incidents[0].action is not None:
        assert not more_severe(policy.triage(r).action, incidents[0].action)


@settings(max_examples=400)
@given(cases(), windows, probes)
def test_a_node_back_in_service_never_swallows_another_alert(
    case: tuple[list[PastIncident], HealthReport], window: float, probe: bool | None
) -> None:
    incidents, r = case
    back = probe is True or dedupe.out_of_service_from(incidents) is None
    verdict = dedupe.decide(r, incidents, now=NOW, window_s=window, in_service_now=probe)
    if back and fresh_key(r, incidents):
        assert isinstance(verdict, New), verdict


@settings(max_examples=400)
@given(cases(), windows, probes)
def test_the_same_alert_is_always_a_duplicate_of_an_incident_that_had_it(
    case: tuple[list[PastIncident], HealthReport], window: float, probe: bool | None
) -> None:
    incidents, r = case
    verdict = dedupe.decide(r, incidents, now=NOW, window_s=window, in_service_now=probe)
    if fresh_key(r, incidents):
        return
    assert isinstance(verdict, Duplicate) and verdict.kind == "same_alert"
    assert any(i.run_id == verdict.run_id and r.alert_key in i.alert_keys for i in incidents)


@settings(max_examples=400)
@given(cases(), windows, probes)
def test_a_failure_is_swallowed_only_by_the_incident_the_node_is_out_from_within_the_window(
    case: tuple[list[PastIncident], HealthReport], window: float, probe: bool | None
) -> None:
    incidents, r = case
    verdict = dedupe.decide(r, incidents, now=NOW, window_s=window, in_service_now=probe)
    if not isinstance(verdict, Duplicate) or verdict.kind != "same_failure":
        return
    out = dedupe.out_of_service_from(incidents)
    assert out is not None and out.run_id == verdict.run_id and probe is not True
    assert (NOW - out.closed_at).total_seconds() < window
    assert any(Failure.of(r).same_as(f) for f in out.failures)


# --- the start path reading Temporal ------------------------------------------------------


@dataclass
class Run:
    """One run of the node's incident as Temporal holds it."""

    run_id: str
    status: WorkflowExecutionStatus
    close_time: datetime | None = None
    keys: tuple[str, ...] = ()
    result: RemediationResult | None = None
    id: str = INCIDENT

    @property
    def typed_search_attributes(self) -> TypedSearchAttributes:
        return TypedSearchAttributes([SearchAttributePair(sa.ALERT_KEYS, list(self.keys))] if self.keys else [])


@dataclass
class FakeTemporal:
    """Describe is the truth (`runs`, newest last); visibility lists only `visible` (it lags)."""

    runs: list[Run]
    visible: list[Run] = field(default_factory=list)
    asked: list[str] = field(default_factory=list)
    listed: list[str] = field(default_factory=list)

    def get_workflow_handle(self, workflow_id: str, *, run_id: str | None = None, **_: Any) -> Any:
        self.asked.append(workflow_id)
        fake = self

        class Handle:
            async def describe(self) -> Run:
                if workflow_id != INCIDENT or not fake.runs:
                    raise RPCError("workflow not found", RPCStatusCode.NOT_FOUND, b"")
                return fake.runs[-1]

            async def result(self, follow_runs: bool = True) -> RemediationResult:
                run = next(r for r in [*fake.runs, *fake.visible] if r.run_id == run_id)
                if run.status == WorkflowExecutionStatus.CONTINUED_AS_NEW:
                    raise WorkflowContinuedAsNewError("next")
                if run.result is None:
                    raise WorkflowFailureError(cause=RuntimeError("terminated"))
                return run.result

        return Handle()

    async def list_workflows(self, query: str, limit: int | None = None) -> Any:
        self.listed.append(query)
        for run in self.visible:
            if 'ExecutionStatus!="Running"' in query and run.status == WorkflowExecutionStatus.RUNNING:
                continue
            if "AlertKeys=" in query and not any(f'AlertKeys="{k}"' in query for k in run.keys):
                continue
            since = re.search(r'CloseTime > "([^"]+)"', query)
            if since and (run.close_time is None or run.close_time <= datetime.fromisoformat(since[1])):
                continue
            yield run


def result(r: HealthReport, state: NodeState, action: ActionClass, outcome: Outcome) -> RemediationResult:
    return RemediationResult(
        incident_id=INCIDENT,
        cluster="c1",
        node="gpu01",
        action=action,
        outcome=outcome,
        reason="",
        node_state=state,
        node_detail="",
        failure_observed_at=NOW,
        closed_at=NOW,
        stages=[],
        reports=[r],
    )


def just_closed(r: HealthReport, state: NodeState, action: ActionClass, outcome: Outcome, run: str = "r1") -> Run:
    at = datetime.now(UTC) - timedelta(seconds=1)
    return Run(
        run,
        WorkflowExecutionStatus.COMPLETED,
        at,
        (r.alert_key,) if r.alert_key else (),
        result(r, state, action, outcome),
    )


def with_window(window: float) -> Settings:
    return Settings(cluster="c1", fleet=FleetPolicy(duplicate_window_s=window))


async def handled(fake: FakeTemporal, r: HealthReport, window: float = WINDOW, **kw: Any) -> Duplicate | None:
    return await already_handled(cast(Client, fake), with_window(window), r, **kw)


async def test_a_new_failure_after_an_ignored_one_starts_and_the_coordinator_is_never_asked() -> None:
    fake = FakeTemporal(runs=[just_closed(report(63), S.UNTOUCHED, A.IGNORE, "ignored")])
    fake.visible = list(fake.runs)
    assert await handled(fake, report(79)) is None
    assert await handled(fake, report(31)) is None
    assert set(fake.asked) == {INCIDENT}  # never gpuheal-c1-fleet: a busy coordinator cannot block a report


async def test_visibility_that_has_not_seen_the_close_cannot_hide_the_same_alert() -> None:
    sent = report(79, key="fp@20261130T120000")
    closed = just_closed(sent, S.DRAINED, A.REPLACE_NODE, "aborted")
    closed.keys = ()  # its alert keys not indexed yet either: the result has them
    fake = FakeTemporal(runs=[closed], visible=[Run("r1", WorkflowExecutionStatus.RUNNING)])
    by = await handled(fake, sent)
    assert by is not None and (by.kind, by.run_id) == ("same_alert", "r1")
    by = await handled(fake, report(79))  # the same failure from the agent, node still drained
    assert by is not None and (by.kind, by.run_id) == ("same_failure", "r1")


async def test_a_run_still_going_is_joined_whatever_visibility_says() -> None:
    sent = report(79, key="fp@1")
    old = just_closed(sent, S.DRAINED, A.REPLACE_NODE, "aborted")
    fake = FakeTemporal(runs=[old, Run("r2", WorkflowExecutionStatus.RUNNING)], visible=[old])
    assert await handled(fake, sent) is None and fake.listed == []


async def test_a_node_never_seen_costs_one_describe() -> None:
    fake = FakeTemporal(runs=[])
    assert await handled(fake, report(79, key="fp@1")) is None
    assert fake.listed == [] and fake.asked == [INCIDENT]


async def test_the_window_is_the_callers_and_the_same_alert_ignores_it() -> None:
    sent = report(79, key="fp@1")
    old = just_closed(sent, S.DRAINED, A.REPLACE_NODE, "aborted")
    old.close_time = datetime.now(UTC) - timedelta(hours=3)
    fake = FakeTemporal(runs=[old], visible=[old])
    assert await handled(fake, report(79), window=600) is None  # past the window
    assert await handled(fake, report(79), window=4 * 3600) is not None
    assert await handled(fake, report(79), window=0) is None
    by = await handled(fake, sent, window=0)
    assert by is not None and by.kind == "same_alert"


async def test_an_older_run_found_by_its_alert_key() -> None:
    sent = report(48, key="fp@1")
    older = just_closed(sent, S.RETURNED, A.RESET_GPU, "resolved", run="r1")
    older.close_time = datetime.now(UTC) - timedelta(days=2)
    latest = just_closed(report(63), S.UNTOUCHED, A.IGNORE, "ignored", run="r2")
    fake = FakeTemporal(runs=[older, latest], visible=[latest, older])
    by = await handled(fake, sent)
    assert by is not None and (by.kind, by.run_id) == ("same_alert", "r1")
    assert [q for q in fake.listed if 'AlertKeys="fp@1"' in q]  # beyond the window: asked by its key


async def test_the_scheduler_saying_the_node_is_back_makes_the_same_failure_news() -> None:
    fake = FakeTemporal(runs=[just_closed(report(79), S.DRAINED, A.REPLACE_NODE, "aborted")])
    asked: list[str] = []

    async def back(node: str) -> bool:
        asked.append(node)
        return True

    async def still_drained(node: str) -> bool:
        return False

    async def broken(node: str) -> bool:
        raise OSError("scontrol: not found")

    assert await handled(fake, report(79, key="new@2"), node_in_service=back) is None and asked == ["gpu01"]
    assert await handled(fake, report(79), node_in_service=still_drained) is not None
    assert await handled(fake, report(79), node_in_service=broken) is not None  # the record stands
    asked.clear()
    fake.runs[0].keys = ("fp@1",)
    assert await handled(fake, report(79, key="fp@1"), node_in_service=back) is not None and asked == []


async def test_a_terminated_run_swallows_nothing_not_even_its_own_alert() -> None:
    """It handled nothing: Alertmanager's re-send of its alert is news again (else a run that
    failed at triage, in a Slurm outage, would swallow the alert for ever)."""
    fake = FakeTemporal(runs=[Run("r1", WorkflowExecutionStatus.TERMINATED, datetime.now(UTC), ("fp@1",))])
    assert await handled(fake, report(79)) is None
    assert await handled(fake, report(79, key="fp@1")) is None


async def test_a_run_never_granted_swallows_no_resend_of_its_alert() -> None:
    """Held past its bound (`not_granted`), it did nothing: Alertmanager's re-send of the alert
    that still fires is news, within the window and past it."""
    sent = report(79, key="fp@1")
    never = just_closed(sent, S.UNTOUCHED, A.REPLACE_NODE, "not_granted")
    fake = FakeTemporal(runs=[never], visible=[never])
    assert await handled(fake, sent) is None
    assert await handled(fake, sent, window=0) is None
    never.close_time = datetime.now(UTC) - timedelta(days=2)
    fake.runs = [just_closed(report(63), S.UNTOUCHED, A.IGNORE, "ignored", run="r2")]
    fake.visible = [never, *fake.runs]
    assert await handled(fake, sent) is None  # found by its key beyond the window: still nothing done
    never.result = result(sent, S.RETURNED, A.REPLACE_NODE, "resolved")
    assert await handled(fake, sent) is not None  # (one that acted does swallow it)


async def test_a_run_that_passed_an_alert_to_its_follow_up_keeps_only_what_it_acted_on() -> None:
    """XID 13 restarted the job; XID 79 came once that plan was set, and a follow-up run (the
    same incident, continued as new) acted on it. The first run keeps its own alert; the second
    has the XID 79's: if the follow-up failed, the re-send of the XID 79 alert is news again."""
    first = Run("r1", WorkflowExecutionStatus.CONTINUED_AS_NEW, datetime.now(UTC), ("app@1",))
    failed = Run("r2", WorkflowExecutionStatus.FAILED, datetime.now(UTC), ("gone@1",))
    fake = FakeTemporal(runs=[first, failed], visible=[first, failed])
    by = await handled(fake, report(13, key="app@1"))
    assert by is not None and (by.kind, by.run_id) == ("same_alert", "r1")
    assert await handled(fake, report(79, key="gone@1")) is None
