"""The soak's report (bench/results/soak.md for the hour): its seed and shape, what was injected,
the counts, and each invariant's verdict with every violation named beside the fault before it."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from infra.soak import costs
from infra.soak.invariants import INVARIANTS, Records, Violation, given_back, held_out
from infra.soak.load import HARDWARE_KINDS
from infra.soak.records import Run


def _t(at: float, begun: float) -> str:
    return f"{at - begun:+.0f} s" if at else "at the end"


def fault_before(at: float, cluster: str, acts: Sequence[Mapping[str, Any]], begun: float) -> str:
    """The last fault on this cluster, or on what the clusters share, before `at` (at the end: the
    last of the soak)."""
    mine = [a for a in acts if a["kind"] == "fault" and a.get("cluster", "") in ("", cluster)]
    before = [a for a in mine if not at or a["began"] <= at]
    if not before:
        return "none"
    last = before[-1]
    return f"{last['fault']} {last.get('cluster') or 'shared'} at {_t(last['began'], begun)}"


def recoveries(records: Records, acts: Sequence[Mapping[str, Any]]) -> list[float]:
    """Failure to training again, per hardware failure that hit a job: from the soak's injection to
    the job's first progress line after its restart (slurmctld's log: its comment, restart=N+1)."""
    return _took(training_waits(records, acts))


def _took(waits: Sequence[tuple[str, float, float, bool]]) -> list[float]:
    return [stop - start for _, start, stop, trained in waits if trained]


def training_waits(records: Records, acts: Sequence[Mapping[str, Any]]) -> list[tuple[str, float, float, bool]]:
    """Each job's wait to train again after a hardware failure that hit it: (cluster, failed at,
    trained again at, True), or (..., the soak's end, False) for a job that had not by then."""
    kinds = ("allocate", "progress", "requeue", "end")
    moments: list[tuple[float, int, Any]] = [(e.at, 1, e) for e in records.events if e.kind in kinds]
    moments += [(a["at"], 0, a) for a in acts if a["kind"] == "failure" and a["load"] in HARDWARE_KINDS]
    on: dict[tuple[str, str], int] = {}
    restarts: dict[tuple[str, int], int] = {}
    waiting: dict[tuple[str, int], tuple[float, int]] = {}  # job -> (failed at, its restarts then)
    took: list[tuple[str, float, float, bool]] = []
    for at, _, m in sorted(moments, key=lambda x: (x[0], x[1])):
        if isinstance(m, dict):
            job = on.get((m["cluster"], m["node"]))
            if job is not None and (m["cluster"], job) not in waiting:
                waiting[(m["cluster"], job)] = (at, restarts.get((m["cluster"], job), 0))
        elif m.kind in ("allocate", "requeue", "end"):  # a job off its nodes: a failure there is not its
            on = {k: v for k, v in on.items() if not (k[0] == m.cluster and v == m.job)}
            if m.kind == "allocate":
                on[(m.cluster, m.node)] = m.job
        else:
            key = (m.cluster, m.job)
            restarts[key] = m.restart
            if key in waiting and m.restart > waiting[key][1]:
                took.append((m.cluster, waiting.pop(key)[0], at, True))
    return took + [(cluster, start, max(start, records.end), False) for (cluster, _), (start, _) in waiting.items()]


def markdown(
    seed: int,
    minutes: float,
    settle: float,
    begun: float,
    end: float,
    records: Records,
    found: Mapping[str, list[Violation]],
    acts: Sequence[Mapping[str, Any]],
) -> str:
    when = datetime.fromtimestamp(begun, UTC).strftime("%Y-%m-%d %H:%M UTC")
    sent = Counter(a["load"] for a in acts if a["kind"] == "failure")
    refused = sum(1 for a in acts if a["kind"] == "failure" and a["status"] != 200)
    faults = [a for a in acts if a["kind"] == "fault"]
    outcomes = Counter(r.outcome or r.status for r in records.runs)
    lines = [
        "# Chaos soak",
        "",
        f"Written by `make soak` (infra/soak) on {when}: seed {seed}, {minutes:g} minutes of load and faults, "
        f"then up to {settle:g} minutes for incidents to end ({end - begun:.0f} s in all). Checked from "
        "slurmctld's logs, Slurm sampled every second, Temporal's histories and the provider's spare record.",
        "",
        "## What was injected",
        "",
        "| alerts sent, by kind | count |",
        "|---|---|",
        *[f"| {kind} | {n} |" for kind, n in sorted(sent.items())],
        f"| not answered 200 by the webhook | {refused} |",
        "",
        "| fault | cluster | at | what happened |",
        "|---|---|---|---|",
        *[f"| {a['fault']} | {a.get('cluster') or 'shared'} | {_t(a['began'], begun)} | {a['said']} |" for a in faults],
        "",
        "## Incidents",
        "",
        f"{len(records.runs)} incident runs; by outcome (or status): "
        + ", ".join(f"{k} {n}" for k, n in sorted(outcomes.items())),
        "",
        *[
            f"- still open at the end: `{r.key}` at {r.stage or '?'}, {end - r.started:.0f} s of its "
            f"{r.bound_s:.0f} s" + (f", waiting for {r.waiting_for}" if r.waiting_for else "")
            for r in records.runs
            if r.closed is None
        ],
        "",
        *borrowing(records.runs),
        "## Invariants",
        "",
        "| invariant | verdict | violations |",
        "|---|---|---|",
        *[f"| {name} | {'held' if not found[name] else '**BROKEN**'} | {len(found[name])} |" for name in INVARIANTS],
    ]
    broken = [v for name in INVARIANTS for v in found[name]]
    if broken:
        lines += [
            "",
            "| invariant | cluster | when | about | what | the fault before it |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {v.invariant} | {v.cluster} | {_t(v.at, begun)} | `{v.subject}` | {v.detail} | "
            f"{fault_before(v.at, v.cluster, acts, begun)} |"
            for v in broken[:200]
        ]
    lines += [
        "",
        "## The books, from Slurm and Temporal",
        "",
        "| cluster | most held out by gpuheal at once / bound | borrowed nodes given back, most at once "
        "(left out of the bound) | breaker trips / operator resumes | spares given | drains / requeues in "
        "slurmctld's log |",
        "|---|---|---|---|---|---|",
    ]
    most: Counter[str] = Counter()
    for s, held in held_out(records.samples, records.lendable):
        most[s.cluster] = max(most[s.cluster], len(held))
    back: Counter[str] = Counter()
    lent = set(records.lendable)
    for s in records.samples:
        back[s.cluster] = max(back[s.cluster], len(given_back(s, lent)))
    for cluster in sorted({s.cluster for s in records.samples}):
        bound = max((b.most for b in records.bounds if b.cluster == cluster), default=0)
        trips = sum(1 for c in records.breaker if c.cluster == cluster and c.tripped)
        resumes = sum(1 for c in records.breaker if c.cluster == cluster and not c.tripped and c.operator)
        spares = sum(1 for g in records.spares if g.cluster == cluster)
        drains = sum(1 for e in records.events if e.cluster == cluster and e.kind == "drain")
        requeues = sum(1 for e in records.events if e.cluster == cluster and e.kind == "requeue")
        lines.append(
            f"| {cluster} | {most[cluster]} / {bound} | {back[cluster]} | {trips} / {resumes} | {spares} "
            f"| {drains} / {requeues} |"
        )
    resolved = [r.closed - r.started for r in records.runs if r.outcome == "resolved" and r.closed]
    if resolved:
        q = statistics.quantiles(resolved, n=20, method="inclusive") if len(resolved) > 1 else [resolved[0]] * 19
        lines += [
            "",
            f"Resolved incidents' time open (report to close): p50 {statistics.median(resolved):.1f} s, "
            f"p95 {q[18]:.1f} s, max {max(resolved):.1f} s ({len(resolved)} runs).",
        ]
    waits = training_waits(records, acts)  # read once: the figure below and each fault's share
    took = _took(waits)
    if took:
        q = statistics.quantiles(took, n=20, method="inclusive") if len(took) > 1 else [took[0]] * 19
        lines += [
            f"Failure to training again (the soak's injection to the job's first step after its restart, "
            f"slurmctld's log): p50 {statistics.median(took):.1f} s, p95 {q[18]:.1f} s, max {max(took):.1f} s "
            f"({len(took)} jobs)."
        ]
    trained = [(c, start, stop) for c, start, stop, done in waits if done]
    lines += ["", *costs.lines(costs.fault_costs(records.runs, trained, acts, end), len(waits) - len(trained), begun)]
    return "\n".join(lines) + "\n"


def borrowing(runs: Sequence[Run]) -> list[str]:
    """What the incidents that found no spare got from the inference pool, in their own words."""
    said = [b for r in runs for b in r.borrows]
    if not said:
        return ["Borrowing from the inference pool: not tried by a run that completed.", ""]
    took = sum(1 for b in said if b.startswith("borrowed "))
    lines = [f"Borrowing from the inference pool: {len(said)} tries, {took} took a node.", ""]
    lines += [f"- {n}: {b}" for b, n in Counter(said).most_common(10)]
    return [*lines, ""]
