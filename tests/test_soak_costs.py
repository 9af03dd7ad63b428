"""What each fault met, in the soak's report: the incidents and the training waits open while it
lasted, and their seconds under it; and when the soak records a fault as begun and over."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from infra.soak import costs
from infra.soak.acts import Acts
from infra.soak.faults import Fault
from infra.soak.records import Run


def run(cluster: str, started: float, closed: float | None, outcome: str = "resolved") -> Run:
    return Run(cluster, f"gpuheal-{cluster}-gpu01", f"r{started:g}", "gpu01", started, closed, "COMPLETED", outcome)


def fault(cluster: str, began: float, over: float, name: str = "apiserver_away") -> dict[str, object]:
    return {"kind": "fault", "fault": name, "cluster": cluster, "began": began, "at": over, "said": ""}


def test_a_fault_meets_what_was_open_on_its_cluster_for_the_seconds_it_lasted() -> None:
    runs = [run("west", 0.0, 50.0), run("east", 0.0, 50.0), run("west", 60.0, None)]
    waits = [("west", 5.0, 100.0), ("west", 45.0, 46.0), ("east", 0.0, 100.0)]
    found = costs.fault_costs(runs, waits, [fault("west", 40.0, 70.0)], end=200.0)
    assert [(c.incidents, c.incident_s, c.jobs, c.waited_s) for c in found] == [(2, 10.0 + 10.0, 2, 30.0 + 1.0)]


def test_a_shared_fault_meets_both_clusters_and_a_fault_of_an_instant_still_meets() -> None:
    runs = [run("west", 0.0, 50.0), run("east", 10.0, 30.0)]
    found = costs.fault_costs(runs, [("east", 0.0, 30.0)], [fault("", 20.0, 20.0, "restart_temporal")], end=60.0)
    assert [(c.cluster, c.incidents, c.incident_s, c.jobs) for c in found] == [("", 2, 0.0, 1)]


def test_nothing_open_meets_no_fault() -> None:
    found = costs.fault_costs([run("west", 0.0, 10.0)], [("west", 0.0, 10.0)], [fault("west", 11.0, 20.0)], end=30.0)
    assert [(c.incidents, c.jobs) for c in found] == [(0, 0)]


def test_what_ends_as_a_fault_begins_meets_it_and_what_ends_before_does_not() -> None:
    runs = [run("west", 0.0, 40.0), run("west", 0.0, 39.0)]
    found = costs.fault_costs(runs, [], [fault("west", 40.0, 70.0)], end=100.0)
    assert [(c.incidents, c.incident_s) for c in found] == [(1, 0.0)]


def test_the_report_section_names_each_fault_and_the_waits_left_out() -> None:
    cost = costs.FaultCost("kill_worker", "east", 130.0, 2.0, 3, 6.0, 1, 2.0)
    text = "\n".join(costs.lines([cost], 4, begun=100.0))
    assert "| kill_worker | east | +30 s | 2 s | 3 | 6 | 1 | 2 |" in text
    assert "left out (4 jobs)" in text


def test_a_fault_that_goes_on_after_its_act_costs_until_it_is_over() -> None:
    """A refusal of notices is set and left to run: its act is done at once, its `over` later."""
    refused = {**fault("", 10.0, 10.0, "notices_refused"), "over": 90.0}
    found = costs.fault_costs([run("east", 0.0, 50.0)], [("east", 20.0, 200.0)], [refused], end=300.0)
    assert [(c.lasted, c.incident_s, c.waited_s) for c in found] == [(80.0, 40.0, 70.0)]


def test_the_soak_records_when_a_fault_is_over_not_only_when_its_act_was_done(tmp_path: Path) -> None:
    """The notices receiver is told to refuse for a while and the act returns: its record's `over`
    is when the refusal ends, which is what the fault's cost runs to."""
    refused: list[float] = []
    world = SimpleNamespace(root=tmp_path, notices=SimpleNamespace(refuse_for=refused.append))
    doing = Acts(world, None, time.time(), 1)  # type: ignore[arg-type]  # only the notices are touched
    asyncio.run(doing.inflict([Fault(0.0, "notices_refused", "", 45.0)]))
    (act,) = [json.loads(line) for line in (tmp_path / "acts.jsonl").read_text().splitlines()]
    assert refused == [45.0] and act["at"] - act["began"] < 5
    assert costs.ended(act) - act["began"] == pytest.approx(45.0, abs=1.0)


def test_a_fault_skipped_did_nothing_so_it_lasted_no_time(tmp_path: Path) -> None:
    world = SimpleNamespace(root=tmp_path, temporal=SimpleNamespace(temporal_kind="dev"))
    doing = Acts(world, None, time.time(), 1)  # type: ignore[arg-type]  # a dev server: nothing touched
    asyncio.run(doing.inflict([Fault(0.0, "restart_postgres", "", 30.0)]))
    (act,) = [json.loads(line) for line in (tmp_path / "acts.jsonl").read_text().splitlines()]
    assert act["said"].startswith("skipped") and costs.ended(act) - act["began"] < 5


def test_a_kill_that_waits_for_an_activity_begins_when_it_kills(tmp_path: Path) -> None:
    """The soak looks for a worker running an incident's activity before it kills one: the fault
    begins at the kill, not at the looking (what it met before then was not its doing)."""
    killed: list[float] = []
    worker = SimpleNamespace(pid=41, send_signal=lambda _sig: killed.append(time.time()), wait=lambda: 0)
    cluster = SimpleNamespace(workers=[worker], start_worker=lambda _i: None, worker_name=lambda i: f"worker-{i}")
    notices = SimpleNamespace(refuse_for=lambda _s: None)
    world = SimpleNamespace(root=tmp_path, clusters={"east": cluster}, notices=notices)
    doing = Acts(world, None, time.time(), 1)  # type: ignore[arg-type]
    looks = iter([[], [(41, "drain_slurm_node of gpuheal-east-gpu01")]])

    async def running(_cluster: str) -> list[tuple[int, str]]:
        return next(looks)

    doing.running_activities = running  # type: ignore[method-assign,assignment]
    asyncio.run(doing.inflict([Fault(0.0, "kill_worker", "east", 0.0), Fault(0.0, "notices_refused", "", 10.0)]))
    act, after = [json.loads(line) for line in (tmp_path / "acts.jsonl").read_text().splitlines()]
    assert "during drain_slurm_node" in act["said"]
    assert act["began"] == pytest.approx(killed[0], abs=0.05) and act["at"] - act["began"] >= 2
    assert after["began"] >= act["at"]  # the next fault begins at its own start, not at the kill
