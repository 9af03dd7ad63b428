"""The visibility query builder: typed keys, values quoted so that none can add a clause."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from gpuheal.core import queries as q
from gpuheal.core import search_attributes as sa
from gpuheal.core.messages import INCIDENT, JOB_RECOVERY


def unquote(text: str) -> str:
    """A double-quoted literal read back as Temporal's parser (MySQL's rules) reads it."""
    assert text.startswith('"') and text.endswith('"'), text
    body = text[1:-1]
    assert not re.search(r'(?<!\\)(\\\\)*"', body), f"an unescaped quote ends the string early: {text}"
    return re.sub(r"\\(.)", r"\1", body)


@pytest.mark.parametrize("value", ["gpu01", 'gpu"01', "a\\b", '\\"', '" OR WorkflowType="x', "fp@2026-11-30T01:00:00Z"])
def test_a_string_value_reads_back_as_itself(value: str) -> None:
    assert unquote(q.literal(value)) == value


def test_a_quote_in_a_value_is_escaped() -> None:
    assert q.eq(sa.NODE, 'gpu"01') == 'NodeName="gpu\\"01"'
    assert q.eq(sa.NODE, "gpu\\") == 'NodeName="gpu\\\\"'  # a trailing backslash cannot escape the closing quote


def test_the_terms_are_anded_as_the_incidents_are_found() -> None:
    query = q.where(q.of_type(INCIDENT), q.eq(sa.CLUSTER, "prod"), q.eq(sa.NODE, "gpu01"), q.status("Running"))
    assert (
        query == 'WorkflowType="GpuRemediation" AND Cluster="prod" AND NodeName="gpu01" AND ExecutionStatus="Running"'
    )


def test_numbers_times_lists_and_the_execution_status() -> None:
    since = datetime(2026, 11, 30, 1, 0, tzinfo=UTC)
    query = q.where(q.of_type(JOB_RECOVERY), q.eq(sa.JOB_ID, 12), q.after(q.START_TIME, since))
    assert query == 'WorkflowType="JobRecovery" AND JobId=12 AND StartTime > "2026-11-30T01:00:00+00:00"'
    assert q.contains(sa.ALERT_KEYS, "fp1@t") == 'AlertKeys="fp1@t"'
    assert q.not_status("Running") == 'ExecutionStatus!="Running"'
    assert q.status("Completed") == 'ExecutionStatus="Completed"'
    assert q.eq(q.WORKFLOW_ID, "gpuheal-prod-fleet") == 'WorkflowId="gpuheal-prod-fleet"'


def test_what_a_query_cannot_hold() -> None:
    with pytest.raises(ValueError, match="naive"):
        q.after(q.START_TIME, datetime(2026, 11, 30))
    with pytest.raises(ValueError, match="at least one term"):
        q.where()
