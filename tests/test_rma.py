"""A board's record follows its serial: the repeat-offender count (Hypothesis over the pure
decision) and what goes to the vendor, which never fails the incident."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from temporalio.testing import WorkflowEnvironment

from gpuheal.core import rma, rma_policy
from gpuheal.core.fleet.breaker import repeat_offender
from gpuheal.core.fleet.models import Arrival
from gpuheal.core.fleet.policy import RepeatPolicy
from gpuheal.core.models.base import NodeState
from gpuheal.core.models.report import HealthReport
from gpuheal.workflows.incident.evidence import GATHER_ATTEMPTS
from tests.conftest import start_time_skipping
from tests.fakes import FakeCluster
from tests.test_workflow import report as xid_report
from tests.test_workflow import settings, start_or_join, worker

NOW = datetime(2026, 12, 1, tzinfo=UTC)
POLICY = RepeatPolicy(incidents=3, window_s=7 * 86400)
nodes = st.sampled_from(["gpu01", "gpu02", "gpu03"])
serials = st.sampled_from(["S1", "S2", "S3"])
hours = st.floats(0, 24 * 14).filter(lambda h: abs(h * 3600 - POLICY.window_s) > 1)  # not on the edge


def arrival(i: int, node: str, serial: str, hours_ago: float) -> Arrival:
    at = NOW - timedelta(hours=hours_ago)
    return Arrival(at=at, incident_id=f"gpuheal-c-{node}", run_id=f"r{i}", node=node, domains=(), gpu_serials=(serial,))


@given(st.lists(st.tuples(nodes, serials, hours), max_size=12), nodes, serials)
def test_the_count_follows_the_board_not_the_node(
    history: list[tuple[str, str, float]], node: str, serial: str
) -> None:
    arrivals = [arrival(i, n, s, h) for i, (n, s, h) in enumerate(history)]
    said = repeat_offender(arrivals, node, (), NOW, POLICY, (serial,))
    on_board = sum(1 for _, s, h in history if s == serial and h * 3600 <= POLICY.window_s)
    assert (said is not None) == (on_board >= POLICY.incidents)  # wherever the board was
    if said is not None:
        assert f"GPU serial {serial}" in said


@given(st.lists(st.tuples(serials, st.floats(0, 24 * 6)), min_size=3, max_size=8))
def test_a_swapped_board_starts_the_node_afresh(history: list[tuple[str, float]]) -> None:
    """Every earlier incident on gpu01 was another board's: the new board (S9) is no repeat offender."""
    arrivals = [arrival(i, "gpu01", s, h) for i, (s, h) in enumerate(history)]
    assert repeat_offender(arrivals, "gpu01", (), NOW, POLICY, ("S9",)) is None
    assert repeat_offender(arrivals, "gpu01", (), NOW, POLICY) is not None  # no serial known: the node's count


def report(**kw: object) -> HealthReport:
    return HealthReport.model_validate({"node": "gpu01", "cluster": "c", "xid": 79, "observed_at": NOW, **kw})


def test_each_board_once_with_what_every_report_knew() -> None:
    boards = rma_policy.boards_of(
        [
            report(gpu=3, gpu_serial="S1"),
            report(gpu=3, gpu_serial="S1", gpu_uuid="GPU-1", pci_bus_id="0000:3b:00", kernel_log="NVRM: Xid 79"),
            report(gpu=5, gpu_uuid="GPU-5"),
            report(),  # the node as a whole: no board
        ]
    )
    assert boards == (
        rma.Board(gpu=3, uuid="GPU-1", serial="S1", pci_bus_id="0000:3b:00"),
        rma.Board(gpu=5, uuid="GPU-5"),
    )


def test_what_goes_to_the_vendor() -> None:
    assert rma_policy.needed(NodeState.REPLACED, None) == "replaced"
    assert rma_policy.needed(NodeState.FAILED_VALIDATION, None) == "failed validation after repair"
    assert rma_policy.needed(NodeState.RETURNED, "repeat offender: 3 incidents on GPU serial S1") is not None
    assert rma_policy.needed(NodeState.RETURNED, None) is None and rma_policy.needed(NodeState.DRAINED, None) is None


@pytest.fixture
async def env() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_time_skipping()
    yield env
    await env.shutdown()


async def test_a_history_that_cannot_be_read_never_fails_the_incident(env: WorkflowEnvironment) -> None:
    """Visibility down at the close: the evidence goes to the vendor without the board's history
    (said in it), and the incident still resolves and gives its capacity back."""
    fake, s = FakeCluster(), settings()
    fake.history_down = True
    async with worker(env, s, fake):
        result = await (await start_or_join(env.client, s, xid_report(79))).result()
    assert result.outcome == "resolved" and result.replacement_node == "gpu09"
    assert fake.calls.count("gather_rma") == GATHER_ATTEMPTS  # a few tries, not thirty
    assert result.rma is not None and result.rma.history == ()
    assert result.rma.ticket.startswith("RMA-1") and "history could not be read" in result.rma.ticket
    assert [r.left_drained for r in fake.releases] == [False]  # released as on any close
    assert fake.calls[-2:] == ["release_capacity", "metrics"]
