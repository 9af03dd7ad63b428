"""The coordinator's state at fleet scale: what it carries across continue-as-new, and what one
decision costs, in a 10,000-node fleet's worst week.

    python -m bench.fleet_state [--runs 5]

Each run builds its own week (its own seed: distinct run ids, GPUs and order) through the pure
decisions the coordinator takes (gpuheal.core.fleet.coordination): 10,000 arrivals, one a minute
over seven days, every one a different run with a GPU UUID and serial; 2,000 of their nodes out
(granted) and 2,000 held in line. Then it times, on that state, admissions of new runs and
requests of held ones (each a single decision, as one update's handler takes it), and packs the
state as the next run's input (gpuheal.core.fleet.packing). The baseline is the release before
(issue 33): the same week with every arrival kept whole (`compact=False`) and the state carried as
JSON. Writes bench/results/fleet-state.md: goals beside figures, every run's row.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from bench.common import check, distinct, goal, pct
from gpuheal.core.fleet import coordination, packing
from gpuheal.core.fleet.models import AdmitRequest, Breaker, CapacityRequest, FleetState, Placement
from gpuheal.core.fleet.policy import BudgetPolicy, FleetPolicy, VersionedPolicy
from gpuheal.core.models.base import ActionClass
from infra.sandbox import REPO

RESULTS = REPO / "bench" / "results" / "fleet-state.md"
NODES, ARRIVALS, OUT, HELD = 10_000, 10_000, 2_000, 2_000
T0 = datetime(2026, 12, 1, tzinfo=UTC)
LIMIT_BYTES = 2 * 1024 * 1024  # Temporal refuses a continue-as-new input over 2 MiB
GOAL_BYTES = 512 * 1024  # issue 33: far below the limit
GOAL_DECISION_MS = 2.0  # issue 33: a decision under a millisecond or two
SAMPLES = 200  # decisions timed per run and kind


def node(i: int) -> str:
    return f"gpu-r{i // 40:03d}-n{i:05d}"


def placement(i: int) -> Placement:
    domains = {f"rack=r{i // 40:03d}": 40, f"switch=s{i // 400:02d}": 400}
    return Placement(node=node(i), cluster_size=NODES, pool="train", pool_size=NODES, domains=domains)


@dataclass
class Week:
    state: FleetState
    now: datetime
    runs: list[str]  # every arrival's run id, in order
    held: list[CapacityRequest]


def worst_week(seed: int, compact: bool = True) -> Week:
    """A 10,000-node fleet's worst week, built through the coordinator's own decisions."""
    rng = random.Random(seed)
    p = FleetPolicy(budget=BudgetPolicy(cluster=str(OUT), rate=100_000, per_pool=None, node_cooldown_s=0))
    s = FleetState(cluster="c", policy=VersionedPolicy(version=1, policy=p, changed_by="bench", reason="b", at=T0))
    order = rng.sample(range(NODES), NODES)
    runs: list[str] = []
    held: list[CapacityRequest] = []
    now = T0
    for k in range(ARRIVALS):
        i, now = order[k % NODES], T0 + timedelta(seconds=k * 60)
        run = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        runs.append(run)
        admit = AdmitRequest(
            incident_id=f"gpuheal-c-{node(i)}", run_id=run, cluster="c", placement=placement(i),
            action=ActionClass.REPLACE_NODE, what="XID 79", seed=p,
            gpu_uuids=(f"GPU-{uuid.UUID(int=rng.getrandbits(128), version=4)}",),
            gpu_serials=(f"{rng.randrange(10**12, 10**13)}",),
        )  # fmt: skip
        coordination.admit(s, admit, now, serve_when_freed=True, compact=compact)
        s.breaker = Breaker()  # a week, not a storm: the breaker's own tests are elsewhere
        if k >= ARRIVALS - OUT - HELD:
            req = CapacityRequest(
                cluster="c", incident_id=admit.incident_id, run_id=run, placement=admit.placement,
                action=ActionClass.REPLACE_NODE,
            )  # fmt: skip
            decision, _ = coordination.request(s, req, now, counts_left=True, serve_when_freed=True)
            if not decision.granted:
                held.append(req)
    return Week(state=s, now=now, runs=runs, held=held)


@dataclass
class Row:
    run: int
    seed: int
    compact: bool
    json_bytes: int
    carried_bytes: int
    pack_ms: float
    unpack_ms: float
    admit_ms: list[float]
    request_ms: list[float]
    out: int
    held: int


def measure(run: int, seed: int, compact: bool) -> Row:
    week = worst_week(seed, compact)
    s, now = week.state, week.now
    check(len(week.runs) == ARRIVALS and len(set(week.runs)) == ARRIVALS, "the week's runs are not distinct")
    check((len(s.grants), len(s.queue)) == (OUT, HELD), f"{len(s.grants)} out, {len(s.queue)} held")
    rng = random.Random(seed + 1)
    admit_ms, request_ms = [], []
    for j in range(SAMPLES):  # new runs of nodes seen this week, a second apart
        i, at = rng.randrange(NODES), now + timedelta(seconds=j + 1)
        req = AdmitRequest(
            incident_id=f"gpuheal-c-{node(i)}", run_id=str(uuid.uuid4()), cluster="c", placement=placement(i),
            action=ActionClass.RESTART_APP, what="XID 13", seed=s.policy.policy, gpu_serials=("1",),
        )  # fmt: skip
        t = time.perf_counter()
        coordination.admit(s, req, at, serve_when_freed=True, compact=compact)
        admit_ms.append((time.perf_counter() - t) * 1e3)
        s.breaker = Breaker()
        ask = week.held[rng.randrange(len(week.held))]
        t = time.perf_counter()
        coordination.request(s, ask, at, counts_left=True, serve_when_freed=True)
        request_ms.append((time.perf_counter() - t) * 1e3)
    whole = s.model_dump_json().encode()
    t = time.perf_counter()
    packed = packing.pack(s, now).data if compact else whole
    pack_ms = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    back = packing.unpack(packed) if compact else FleetState.model_validate_json(packed)
    unpack_ms = (time.perf_counter() - t) * 1e3
    check(back.grants.keys() == s.grants.keys() and back.queue == s.queue, "the carried state is not the state")
    return Row(run, seed, compact, len(whole), len(packed), pack_ms, unpack_ms, admit_ms, request_ms, OUT, HELD)


def report(rows: list[Row], beside: str = "") -> str:
    new = [r for r in rows if r.compact]
    old = [r for r in rows if not r.compact]
    carried = max(r.carried_bytes for r in new)
    admit99 = max(pct(r.admit_ms, 0.99) for r in new)
    request99 = max(pct(r.request_ms, 0.99) for r in new)
    lines = [
        "# The coordinator's state in a 10,000-node fleet's worst week",
        "",
        f"`python -m bench.fleet_state --runs {len(new)}`, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC. Each run builds its"
        f" own week (its seed): {ARRIVALS:,} arrivals over seven days, {OUT:,} nodes out, {HELD:,} held; then"
        f" {SAMPLES} admissions and {SAMPLES} requests are timed on it (one decision each), and the state is packed"
        " as the next run's input. Baseline: the release before issue 33 (every arrival kept whole for the week,"
        " the state carried as JSON), on the same weeks.",
        "",
        f"Ran beside: {beside}. Times on a loaded machine are not this code's alone." if beside else "Ran alone.",
        "",
        "## Goals",
        "",
        goal("carried state (continue-as-new input), largest run", carried < GOAL_BYTES, f"{carried / 1024:.0f} KB",
             f"< {GOAL_BYTES // 1024} KB (Temporal's limit {LIMIT_BYTES // 1024} KB)"),
        goal("admission, p99 of every run's", admit99 < GOAL_DECISION_MS, f"{admit99:.3f} ms",
             f"< {GOAL_DECISION_MS} ms"),
        goal("capacity request (held), p99", request99 < GOAL_DECISION_MS, f"{request99:.3f} ms",
             f"< {GOAL_DECISION_MS} ms"),
        "",
        "## Every run",
        "",
        "| run | seed | build | JSON | carried | pack | unpack | admit p50 / p99 | request p50 / p99 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r.run} | {r.seed} | {'this' if r.compact else 'before'} | {r.json_bytes / 1024:.0f} KB"
            f" | {r.carried_bytes / 1024:.0f} KB{' (over the limit)' if r.carried_bytes > LIMIT_BYTES else ''}"
            f" | {r.pack_ms:.0f} ms | {r.unpack_ms:.0f} ms"
            f" | {statistics.median(r.admit_ms):.3f} / {pct(r.admit_ms, 0.99):.3f} ms"
            f" | {statistics.median(r.request_ms):.3f} / {pct(r.request_ms, 0.99):.3f} ms |"
        )
    if old:
        lines += [
            "",
            f"Before: the carried state was {statistics.median(r.carried_bytes for r in old) / 1024:.0f} KB (median),"
            f" an admission {statistics.median(pct(r.admit_ms, 0.5) for r in old):.2f} ms (median of medians).",
        ]
    lines += [
        "",
        "Serving the whole line (2,000 held) when something frees is not one decision: it is one per held"
        " incident, and runs only when a release, a resume or time frees a slot.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--baseline-runs", type=int, default=1)
    ap.add_argument("--beside", default="", help="what else ran on the machine meanwhile (said in the results)")
    args = ap.parse_args()
    rows = []
    for run in range(1, args.runs + 1):
        rows.append(measure(run, 1000 + run, compact=True))
        print(f"run {run}: carried {rows[-1].carried_bytes / 1024:.0f} KB")
    for run in range(1, args.baseline_runs + 1):
        rows.append(measure(run, 1000 + run, compact=False))
        print(f"baseline {run}: carried {rows[-1].carried_bytes / 1024:.0f} KB")
    distinct("a week", [r.seed for r in rows if r.compact])
    RESULTS.write_text(report(rows, args.beside))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
