"""`gpuheal simulate` (gpuheal.core.simulate, gpuheal.core.simulate.traces): the same trace gives
the same figures; through any trace, the coordinator's own budget holds, every reported failure
is decided once, no figure leaves its range; with spares enough, gpuheal never costs more
training than Slurm alone; and bad traces and arguments are refused by name, changing nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.cli.main import run
from gpuheal.core.fleet.policy import BreakerPolicy, BudgetPolicy, FleetPolicy, limit_of
from gpuheal.core.simulate import traces
from gpuheal.core.simulate.models import MODELS, Fleet, Timings
from gpuheal.core.simulate.run import simulate
from gpuheal.core.simulate.traces import Failure, TraceError

DAY = 86400.0
# What a failure reports: XIDs of every action class (63: ignore, 13: restart_app, 48: reset,
# 79: replace), health signals (reboot), or nothing a GPU health check sees.
REPORTED: list[tuple[int | None, str | None]] = [
    (79, None),
    (48, None),
    (63, None),
    (13, None),
    (119, None),
    (None, "health_check_failed"),
    (None, "gpu_lost"),
    (None, None),
]


def failures(nodes: int, days: float, reported: list[tuple[int | None, str | None]] = REPORTED) -> Any:
    one = st.builds(
        lambda at, n, r: Failure(at_s=at, node=traces.node_name(n), cause="test", xid=r[0], signal=r[1]),
        st.floats(0, days * DAY, allow_nan=False),
        st.integers(0, nodes - 1),
        st.sampled_from(reported),
    )
    return st.lists(one, max_size=40)


@settings(max_examples=80, deadline=None)
@given(
    trace=failures(40, 3),
    budget=st.integers(1, 6),
    breaker=st.integers(1, 30),
    spares=st.integers(0, 4),
    mode=st.sampled_from(["auto", "approve", "observe"]),
)
def test_through_any_trace_the_budget_holds_and_every_report_is_decided_once(
    trace: list[Failure], budget: int, breaker: int, spares: int, mode: str
) -> None:
    policy = FleetPolicy.model_validate(
        {"mode": mode, "budget": {"cluster": str(budget)}, "breaker": {"max_incidents": breaker}}
    )
    fleet = Fleet(nodes=40, job_nodes=8, spares=spares, rack_size=8)
    # checking: after every event, every node is owned, idle or out once, and every job's nodes add up
    results = simulate(trace, fleet, 3, Timings(), policy, MODELS, seed=1, checking=True)
    for r in results:
        assert 0.0 <= r.effective_training <= 1.0, r
        assert r.gpu_hours_lost >= 0 and r.max_nodes_out <= len({f.node for f in trace})
    g = results[0]
    assert g.model == "gpuheal"
    assert g.max_budget_used <= limit_of(str(budget), 40), g  # the coordinator's own decisions, never past it
    assert len(g.decisions) == g.incidents  # each reported failure of a node in service: one decision
    assert len({d.failure for d in g.decisions}) == len(g.decisions)
    assert all(d.decision != "held" or d.waited_s >= 0 for d in g.decisions)
    ignored = [d for d in g.decisions if d.action == "ignore"]
    assert all(d.decision == "ignored" for d in ignored)  # never admitted, never counted
    if mode == "observe":
        assert all(d.decision in {"observed", "ignored"} for d in g.decisions) and g.max_budget_used == 0
    if not any(f.seen for f in trace):  # nothing reported: nothing decided, and all three models agree
        assert not g.decisions and len({r.gpu_hours_lost for r in results}) == 1


@settings(max_examples=40, deadline=None)
@given(trace=failures(16, 1, [(63, None)]))
def test_reports_that_call_for_nothing_cost_no_training(trace: list[Failure]) -> None:
    fleet = Fleet(nodes=16, job_nodes=8, spares=0, rack_size=0)
    for r in simulate(trace, fleet, 1, Timings(), FleetPolicy(), MODELS, checking=True):
        assert r.effective_training == 1.0 and r.interruptions == 0 and r.max_nodes_out == 0


@settings(max_examples=60, deadline=None)
@given(trace=failures(32, 3))
def test_with_spares_enough_gpuheal_never_costs_more_training_than_slurm_alone(trace: list[Failure]) -> None:
    # No contention for nodes, a budget and breaker that never bind: each interruption's downtime
    # is shorter under gpuheal (detect + its own part < SlurmdTimeout, < a person or a time limit).
    policy = FleetPolicy(budget=BudgetPolicy(cluster="100%", rate=10_000), breaker=BreakerPolicy(max_incidents=10_000))
    fleet = Fleet(nodes=72, job_nodes=8, spares=40, rack_size=0)
    gpuheal, slurmd_lost, healthcheck = simulate(trace, fleet, 3, Timings(), policy, MODELS, seed=2, checking=True)
    assert gpuheal.gpu_hours_lost <= slurmd_lost.gpu_hours_lost + 1e-6
    assert gpuheal.gpu_hours_lost <= healthcheck.gpu_hours_lost + 1e-6


def test_the_same_trace_gives_the_same_figures_and_no_failure_loses_nothing() -> None:
    trace = traces.generate(512, 20, seed=7)
    fleet = Fleet(nodes=512, job_nodes=128, spares=8)
    first = simulate(trace, fleet, 20, Timings(), FleetPolicy(), MODELS, seed=7)
    assert first == simulate(trace, fleet, 20, Timings(), FleetPolicy(), MODELS, seed=7)
    for r in simulate([], fleet, 20, Timings(), FleetPolicy(), MODELS):
        assert r.effective_training == 1.0 and r.gpu_hours_lost == 0 and r.interruptions == 0


def test_a_storm_trips_the_breaker_and_a_person_resets_it() -> None:
    # 30 XID 79s within a minute on one 64-node fleet: the default breaker (10 in 300 s) trips.
    storm = [Failure(at_s=60 + i, node=traces.node_name(i), cause="storm", xid=79) for i in range(30)]
    fleet = Fleet(nodes=64, job_nodes=8, spares=0, rack_size=0)
    (g,) = simulate(storm, fleet, 1, Timings(), FleetPolicy(), ("gpuheal",))
    assert g.breaker_trips == 1 and g.held >= 19
    assert g.max_budget_used <= limit_of(FleetPolicy().budget.cluster, 64)
    assert any(d.decision == "held" and "circuit breaker" in d.reason for d in g.decisions)
    assert any("taken back" in d.reason or "circuit breaker" in d.reason for d in g.decisions)
    assert g.replaced == 30  # every node replaced in the end: the person reset it, the line was served


def test_the_generator_follows_the_published_rate_and_shares() -> None:
    trace = traces.generate(traces.LLAMA3_GPUS // 8, traces.LLAMA3_DAYS, seed=3)
    assert 0.85 * traces.LLAMA3_INTERRUPTIONS < len(trace) < 1.15 * traces.LLAMA3_INTERRUPTIONS
    gpu = sum(1 for f in trace if f.cause == "faulty_gpu") / len(trace)
    assert 0.30 < gpu < 0.41  # 148 of 419 (35.3 %; the paper's share column says 30.1 %)
    assert trace == sorted(trace, key=lambda f: f.at_s) and all(f.at_s < traces.LLAMA3_DAYS * DAY for f in trace)


def test_a_recorded_trace_reads_back_and_a_bad_row_is_named(tmp_path: Path) -> None:
    trace = traces.generate(64, 30, seed=4)
    csv_file = tmp_path / "t.csv"
    csv_file.write_text(traces.to_csv(trace))
    assert traces.read(csv_file) == trace
    js = tmp_path / "t.json"
    js.write_text(json.dumps([f.model_dump() for f in trace]))
    assert traces.read(js) == trace
    csv_file.write_text("at_s,node,cause,xid,signal,gpu\n1,node00001,x,79,,0\n2,bad node;rm,x,79,,0\n")
    with pytest.raises(TraceError, match="entry 3"):
        traces.read(csv_file)
    csv_file.write_text("when,where\n1,node1\n")
    with pytest.raises(TraceError, match="header"):
        traces.read(csv_file)


def test_the_command_prints_the_three_models_and_refuses_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "trace.csv"
    assert run(["simulate", "--nodes", "256", "--days", "30", "--write-trace", str(out)]) == 0
    text = capsys.readouterr().out
    assert all(label in text for label in ("(c) gpuheal", "(a) Slurm alone", "(b) Slurm + health check"))
    assert traces.read(out)  # the trace it used, replayable with --trace
    assert run(["simulate", "--nodes", "256", "--days", "30", "--trace", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-3:] == text.splitlines()[-3:]
    with pytest.raises(SystemExit, match="no timing 'bogus'"):
        run(["simulate", "--set", "bogus=1"])
    bad = tmp_path / "policy.yaml"
    bad.write_text("budget:\n  cluster: lots\n")
    with pytest.raises(SystemExit, match="lots"):
        run(["simulate", "--policy", str(bad)])


def test_a_node_repaired_before_its_job_lets_go_is_not_handed_to_another_job() -> None:
    # (a) with a quick person: the GPU is reset (60 + 300 s) before Slurm's own requeue (527 s).
    trace = [
        Failure(at_s=0, node=traces.node_name(0), cause="t", xid=48),
        Failure(at_s=400, node=traces.node_name(0), cause="t"),  # still held by its job: nothing more
        Failure(at_s=450, node=traces.node_name(1), cause="t"),
    ]
    fleet = Fleet(nodes=3, job_nodes=1, spares=1, rack_size=0)
    timings = Timings(person_s=60)
    (r,) = simulate(trace, fleet, 1, timings, FleetPolicy(), ("slurmd_lost",), checking=True)
    assert r.interruptions == 2 and 0.95 < r.effective_training < 1.0  # both jobs back, neither lost


def test_a_node_replaced_before_its_job_lets_go_still_frees_the_job() -> None:
    trace = [Failure(at_s=10, node=traces.node_name(0), cause="t", xid=79)]
    fleet = Fleet(nodes=2, job_nodes=1, spares=1, rack_size=0)
    timings = Timings(person_s=0, replace_s=300)  # the new node joins before Slurm's requeue
    (r,) = simulate(trace, fleet, 1, timings, FleetPolicy(), ("slurmd_lost",), checking=True)
    assert r.interruptions == 1 and r.mean_downtime_s == 300 + 600  # let go at the replacement, restarted
