"""When a more severe report after an incident's plan starts a follow-up run (pure:
gpuheal.workflows.incident.follow_up), and that a start's input reads the same to a worker of
the release before (its models forbid unknown fields: a rolling upgrade, a rollback)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from temporalio.contrib.pydantic import pydantic_data_converter

from gpuheal.core import policy
from gpuheal.core.models.base import ActionClass, Stage
from gpuheal.core.models.incident import RemediationInput
from gpuheal.core.models.replacement import ReplacementResult
from gpuheal.core.models.report import HealthReport
from gpuheal.core.models.slurm import NodeRef
from gpuheal.workflows.incident import follow_up
from gpuheal.workflows.incident.state import IncidentState

XIDS = [13, 31, 43, 48, 63, 74, 79, 94, 95, 119]


def rep(xid: int) -> HealthReport:
    return HealthReport(node="gpu02", cluster="c1", xid=xid, gpu=0, observed_at=datetime.now(UTC))


def state(first: int, *, planned: bool = True) -> IncidentState:
    s = IncidentState(ref=NodeRef(cluster="c1", node="gpu02", incident_id="i"), reports=[rep(first)])
    s.action, s.planned, s.stage = policy.triage(rep(first)).action, planned, Stage.VERIFY
    return s


def joined(s: IncidentState, xid: int) -> bool:
    """What the report signal does after the plan: note the report when it outgrows it."""
    s.reports.append(rep(xid))
    if follow_up.outgrows(s):
        s.follow_up = s.reports[-1]  # (as the report signal does)
        return True
    return False


@given(st.sampled_from(XIDS), st.lists(st.sampled_from(XIDS), min_size=1, max_size=4))
def test_a_report_that_asks_for_more_than_the_plan_is_never_swallowed(first: int, later: list[int]) -> None:
    s = state(first)
    for xid in later:
        joined(s, xid)
    wanted = policy.triage_all(s.reports).action
    assert s.action is not None
    more = wanted != s.action and policy.more_severe(wanted, s.action) == wanted
    assert follow_up.due(s) == more  # a follow-up exactly when the reports ask for more
    if more:
        assert s.follow_up is not None and policy.triage(s.follow_up).action != ActionClass.IGNORE


def test_before_the_plan_is_set_the_run_itself_escalates() -> None:
    s = state(13, planned=False)
    assert not joined(s, 79) and not follow_up.due(s)


def test_no_follow_up_once_this_run_replaced_the_node() -> None:
    """A reset whose health check failed replaced the node: a report for it is late, not news."""
    s = state(48)
    assert joined(s, 79)
    s.replacement = ReplacementResult(failed_node="gpu02", new_node="gpu09")
    assert not follow_up.due(s)


def test_only_the_first_report_that_outgrew_the_plan_starts_the_follow_up() -> None:
    s = state(13)
    assert joined(s, 48) and not joined(s, 79)
    assert s.follow_up is not None and s.follow_up.xid == 48  # the 79 goes with it (input.also)


@pytest.mark.parametrize("also", [(), (rep(79),)])
def test_a_start_reads_the_same_to_the_release_before(also: tuple[HealthReport, ...]) -> None:
    conv = pydantic_data_converter.payload_converter
    (payload,) = conv.to_payloads([RemediationInput(report=rep(13), also=also, follows="r1" if also else None)])
    fields = set(json.loads(payload.data))
    assert fields == ({"report", "also", "follows"} if also else {"report"})
    (back,) = conv.from_payloads([payload], [RemediationInput])
    assert back.also == also
