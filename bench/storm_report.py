"""bench/storm.py's results: one run's figures (Run), the table of the runs side by side, what
they say for a bigger machine, and each storm's goals beside its figures (bench/results/storm.md)."""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from bench.common import pct
from gpuheal.core.messages import (
    FLEET_ADMIT,
    FLEET_ADMIT_AND_REQUEST_MANY,
    FLEET_ADMIT_MANY,
    FLEET_CONFIRM,
    FLEET_CONTAIN,
    FLEET_REQUEST_CAPACITY,
    FLEET_REQUEST_CAPACITY_MANY,
)

# The operators' levers the storm times beside `gpuheal fleet` (their arguments: bench/storm.py).
LEVERS = ("policy show", "domain release")
SERVERS = {"dev": "Temporal dev server", "cluster": "Temporal cluster (temporal-server v1.32 on PostgreSQL 15, mTLS)"}


class Watched:
    """What a run's watch saw (bench.storm.Watch takes it, every second): all the report reads of it."""

    read_ms: list[float]  # `gpuheal fleet`'s read, in process
    command_ms: list[float]  # the command itself
    unanswered: list[str]  # reads that failed or timed out once a coordinator existed
    command_failed: list[str]  # `gpuheal fleet` that exited non-zero
    # The operators' levers (issue 33): `gpuheal policy show` and `gpuheal domain`, each command
    # whole (Python's start included) every 15 s; a lever that failed or took over 1 s, said.
    levers_ms: dict[str, list[float]]
    lever_reads_ms: dict[str, list[float]]  # their reads (the memo), in process, every second
    levers_failed: list[str]
    drained: list[int]  # the reported nodes Slurm shows drained, each sample
    bound: int  # cluster budget + containment bound, as the coordinator computes it


@dataclass
class Run:
    name: str
    reports: int
    starts_ms: list[float] = field(default_factory=list)
    grants_ms: list[float] = field(default_factory=list)  # from the incident's capacity ask to its answer
    answers_ms: list[float] = field(default_factory=list)  # from its admission's ask to its capacity answer
    send_s: float = 0.0
    all_decided_s: float = 0.0
    granted: int = 0
    held: int = 0
    worker_mb: float = 0.0
    temporal_mb: float = 0.0
    history_events: int = 0
    history_kb: float = 0.0
    coordinator_runs: int = 0
    workers: int = 1
    skipped: int = 0  # reports answered "already handled": the run would not be what it claims
    worker_cpu_s: float = 0.0  # all worker processes, with the Slurm commands they ran
    temporal_cpu_s: float = 0.0
    coordinator_tasks: int = 0  # the coordinator's workflow tasks over all its runs
    updates: dict[str, int] = field(default_factory=dict)  # updates the coordinator accepted, by name
    own_coordinator: bool = False  # the coordinator in a worker process of its own
    coordinator_mb: float = 0.0  # that process's peak RSS
    task_waits_ms: list[float] = field(default_factory=list)  # each coordinator task: scheduled -> started
    history_total_kb: float = 0.0  # the coordinator's events over all its runs
    history_by_kind: dict[str, float] = field(default_factory=dict)  # KiB by event type, all its runs
    watch: Watched | None = None

    def coordinator_updates(self) -> int:
        return sum(self.updates.values())

    def updates_per_1000(self) -> float:
        return self.coordinator_updates() * 1000 / max(self.reports, 1)


def table(runs: list[Run]) -> list[str]:
    watches = [r.watch for r in runs if r.watch is not None]

    def ms(v: list[float]) -> str:
        return f"{statistics.median(v):.0f} / {pct(v, 0.99):.0f} ms" if v else "n/a"

    def line(measure: str, cells: Iterable[str], target: str = "") -> str:
        return f"| {measure} | " + " | ".join(cells) + f" | {target} |"

    def updates(r: Run) -> str:
        u = r.updates.get

        def pair(one: str, many: str) -> str:
            return f"{u(one, 0)} + {u(many, 0)}"

        admits = f"{pair(FLEET_ADMIT.name, FLEET_ADMIT_MANY.name)} + {u(FLEET_ADMIT_AND_REQUEST_MANY.name, 0)}"
        asks = pair(FLEET_REQUEST_CAPACITY.name, FLEET_REQUEST_CAPACITY_MANY.name)
        return f"{admits} / {asks} / {u(FLEET_CONTAIN.name, 0)} / {u(FLEET_CONFIRM.name, 0)}"

    def heaviest(r: Run) -> str:
        top = sorted(r.history_by_kind.items(), key=lambda kv: -kv[1])[:3]
        return "; ".join(f"{kind} {kb:.0f}" for kind, kb in top) or "n/a"

    def waits(v: list[float]) -> str:
        return f"{statistics.median(v):.0f} / {pct(v, 0.99):.0f} / {max(v):.0f} ms" if v else "n/a"

    def rate(r: Run) -> str:
        return f"{r.coordinator_tasks} ({r.coordinator_tasks / max(r.all_decided_s, 0.1):.1f}/s)"

    lines = [
        line("measure", (f"{r.name} ({r.reports} reports)" for r in runs), "target"),
        "|---|" + "---|" * len(runs) + "---|",
        line("report -> workflow started, p50 / p99", (ms(r.starts_ms) for r in runs), "p99 < 200 ms"),
        line("coordinator grant latency, p50 / p99", (ms(r.grants_ms) for r in runs), "p99 < 1 s"),
        line("admission asked -> capacity answered, p50 / p99", (ms(r.answers_ms) for r in runs)),
        line("all reports sent", (f"{r.send_s:.1f} s" for r in runs)),
        line("every incident granted or held", (f"{r.all_decided_s:.1f} s" for r in runs)),
        line("granted / held", (f"{r.granted} / {r.held}" for r in runs)),
        line("worker peak RSS", (f"{r.worker_mb:.0f} MB" for r in runs), "< 300 MB"),
        line("Temporal server peak RSS", (f"{r.temporal_mb:.0f} MB" for r in runs)),
        line("coordinator history (this run)", (f"{r.history_events} events, {r.history_kb:.0f} KiB" for r in runs)),
        line("coordinator runs (continue-as-new; none ended otherwise)", (str(r.coordinator_runs) for r in runs)),
        line(
            "worker processes (coordinator updates each)",
            (
                f"{r.workers}{' + the coordinator' if r.own_coordinator else ''} ({max(1, 8 // r.workers)})"
                for r in runs
            ),
        ),
        line(
            "workers' CPU per incident (with their Slurm commands)",
            (f"{r.worker_cpu_s * 1000 / r.reports:.0f} ms" for r in runs),
        ),
        line("Temporal server's CPU per incident", (f"{r.temporal_cpu_s * 1000 / r.reports:.0f} ms" for r in runs)),
        line("coordinator workflow tasks (per second of the run)", (rate(r) for r in runs)),
        line(
            "coordinator updates: admit + admit_many + admit_and_request_many / request + request_many / contain"
            " / confirm",
            (updates(r) for r in runs),
        ),
        line(
            "coordinator updates, all, per 1,000 incidents",
            (f"{r.coordinator_updates()} ({r.updates_per_1000():.0f})" for r in runs),
            "<= 100",
        ),
        line("coordinator task scheduled -> started, p50 / p99 / max", (waits(r.task_waits_ms) for r in runs)),
        line("coordinator history (all its runs)", (f"{r.history_total_kb:.0f} KiB" for r in runs), "< 1 MB"),
        line("coordinator history: the largest event kinds, KiB", (heaviest(r) for r in runs)),
        line(
            "coordinator's own worker process, peak RSS",
            (f"{r.coordinator_mb:.0f} MB" if r.own_coordinator else "none: in the worker" for r in runs),
        ),
        line("`gpuheal fleet`'s read (memo), p50 / max", (peak(w.read_ms) for w in watches), "max < 1 s"),
        line(
            "`gpuheal fleet` command (with Python's start), p50 / max",
            (peak(w.command_ms) for w in watches),
            "max < 1 s",
        ),
        *(
            line(
                f"`gpuheal {name}`'s read (memo), p50 / max",
                (peak(w.lever_reads_ms.get(name, [])) for w in watches),
                "max < 1 s",
            )
            for name in LEVERS
        ),
        *(
            line(
                f"`gpuheal {name}` command (with Python's start), p50 / max",
                (peak(w.levers_ms.get(name, [])) for w in watches),
                "max < 1 s",
            )
            for name in LEVERS
        ),
        line(
            "fleet reads unanswered / commands failed",
            (f"{len(w.unanswered)} / {len(w.command_failed)}" for w in watches),
            "0 / 0",
        ),
        line(
            "most reported nodes drained at once (Slurm, every 1 s) / bound",
            (f"{max(w.drained, default=0)} / {w.bound} ({len(w.drained)} samples)" for w in watches),
            "at most the bound",
        ),
    ]
    return lines


def scaling(storms: list[Run]) -> list[str]:
    """What the figures say for a bigger machine: the per-core cost of one incident and the
    coordinator's task rate, the two ceilings (worker CPU, one workflow's task rate)."""
    cores = os.cpu_count() or 1
    lines = ["Scaling (this machine: " + f"{cores} cores):", ""]
    for r in storms:
        per = r.worker_cpu_s * 1000 / r.reports
        rate = r.coordinator_tasks / max(r.all_decided_s, 0.1)
        lines.append(
            f"- {r.name}: {per:.0f} CPU-ms of workers per incident and "
            f"{r.temporal_cpu_s * 1000 / r.reports:.0f} of the server; {r.reports / max(r.all_decided_s, 0.1):.1f} "
            f"incidents decided per second; the coordinator ran {rate:.1f} workflow tasks a second "
            f"({r.reports / max(r.coordinator_tasks, 1):.2f} incidents per task)."
        )
    r = storms[-1]
    per = (r.worker_cpu_s + r.temporal_cpu_s) / r.reports
    lines += [
        "",
        f"On paper, for 32 cores at the last storm's cost ({per * 1000:.0f} CPU-ms per incident, workers and server): "
        f"{32 / per:.0f} incidents a second if the CPU were the only limit; one coordinator's task rate "
        "(above) is the other, and more workers do not raise it.",
    ]
    return lines


def peak(v: list[float]) -> str:
    return f"{statistics.median(v):.0f} / {max(v):.0f} ms ({len(v)} reads)" if v else "n/a"


def goals(r: Run) -> list[str]:
    """Each goal beside its figure, met or missed, said plainly."""
    w = r.watch
    assert w is not None
    checks = [
        ("every incident granted or held within 60 s", r.all_decided_s < 60),
        ("report -> workflow started p99 < 200 ms", pct(r.starts_ms, 0.99) < 200),
        ("coordinator grant p99 < 1 s", pct(r.grants_ms, 0.99) < 1000),
        ("coordinator updates per 1,000 incidents <= 100", r.updates_per_1000() <= 100),
        ("coordinator history < 1 MB (all its runs)", r.history_total_kb < 1024),
        ("worker peak RSS < 300 MB", r.worker_mb < 300),
        ("`gpuheal fleet` read within 1 s every time", bool(w.read_ms) and max(w.read_ms) < 1000 and not w.unanswered),
        (
            "`gpuheal fleet` command within 1 s every time",
            bool(w.command_ms) and max(w.command_ms) < 1000 and not w.command_failed,
        ),
        ("never more drained than the bound", bool(w.drained) and 0 < w.bound and max(w.drained) <= w.bound),
        *(
            (f"`gpuheal {name}`'s read within 1 s every time", bool(ms) and max(ms) < 1000 and not w.levers_failed)
            for name, ms in ((n, w.lever_reads_ms.get(n, [])) for n in LEVERS)
        ),
        *(
            (f"`gpuheal {name}` command within 1 s every time", bool(ms) and max(ms) < 1000 and not w.levers_failed)
            for name, ms in ((n, w.levers_ms.get(n, [])) for n in LEVERS)
        ),
    ]
    lines = [f"- {r.name}: {what}: **{'met' if ok else 'MISSED'}**" for what, ok in checks]
    lines += [f"  - read unanswered: {e}" for e in w.unanswered]
    lines += [f"  - command failed: {e!r}" for e in w.command_failed]
    lines += [f"  - lever failed: {e!r}" for e in w.levers_failed]
    return lines


def report(runs: list[Run], args: argparse.Namespace, nodes: int) -> list[str]:
    """bench/results/storm.md: the baseline first, then each storm."""
    base = runs[0]
    lines = [
        f"# Failure storm: the coordinator under {args.reports:,} reports",
        "",
        f"Written by `make bench-storm` (bench/storm.py) on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"{nodes}-node Slurm sandbox (host Slurm), "
        f"{SERVERS[args.temporal]}, "
        f"budget {args.budget}, "
        f"{args.in_flight} reports in flight, breaker and rate opened wide. Figures, self-checked (bench/storm.py).",
        "",
        *table(runs),
        "",
        *[
            f"{r.name} / baseline: start p99 x{pct(r.starts_ms, 0.99) / pct(base.starts_ms, 0.99):.1f}, "
            f"grant p99 x{pct(r.grants_ms, 0.99) / pct(base.grants_ms, 0.99):.1f}, "
            f"worker RSS x{r.worker_mb / base.worker_mb:.2f}, Temporal RSS x{r.temporal_mb / base.temporal_mb:.2f}."
            for r in runs[1:]
        ],
        "",
        *scaling(runs[1:]),
        "",
        "Goals (each storm):",
        *[line for r in runs[1:] for line in goals(r)],
        "",
    ]
    return lines
