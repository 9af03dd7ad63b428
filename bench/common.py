"""What every benchmark shares: percentiles, and the self-check that makes a figure belong to the
run it claims (a benchmark whose runs are not what it says fails, it does not print)."""

from __future__ import annotations

import asyncio
import os
import statistics
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TypeVar

from temporalio.service import RPCError, RPCStatusCode

T = TypeVar("T")


class BenchCheckFailed(RuntimeError):
    """A run is not what the benchmark claims it measured: no figure is written."""


def check(ok: bool, why: str) -> None:
    """Fail the benchmark loudly when a claim about its own runs does not hold."""
    if not ok:
        raise BenchCheckFailed(why)


def distinct(what: str, values: Iterable[object]) -> None:
    """Every run measured something of its own (a run id, a job, an incident)."""
    seen = list(values)
    dup = sorted({str(v) for v in seen if seen.count(v) > 1})
    check(not dup, f"{what} measured twice: {', '.join(dup)} (runs are not distinct)")


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1); NaN for no values."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values: list[float], unit: str = "s", digits: int = 2) -> str:
    """`median / p95 / min / max` of a column, for the aggregate rows."""
    if not values:
        return "- | - | - | -"
    f = f"{{:.{digits}f}} {unit}"
    return " | ".join(f.format(v) for v in (statistics.median(values), pct(values, 0.95), min(values), max(values)))


def goal(name: str, met: bool, figure: str, target: str) -> str:
    """A goal beside its figure, a miss said plainly."""
    return f"- {name}: {figure} against {target}: **{'met' if met else 'MISSED'}**"


def cpu_s(pid: int) -> float:
    """CPU seconds of a process and the children it waited for (utime, stime, cutime, cstime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def patiently(what: str, call: Callable[[], Awaitable[T]], tries: int = 24, pause_s: float = 5.0) -> T:
    """`call`, tried again while the server says it is over its persistence limit
    (RESOURCE_EXHAUSTED: a cluster still serving a storm's held incidents refused a 10,000-run
    listing so, stop 50); each refusal is said. Any other error, or the last refusal, is raised."""
    for attempt in range(1, tries + 1):
        try:
            return await call()
        except RPCError as err:
            if err.status != RPCStatusCode.RESOURCE_EXHAUSTED or attempt == tries:
                raise
            print(f"  {what}: refused ({err.message}); again in {pause_s:g} s ({attempt}/{tries})", flush=True)
            await asyncio.sleep(pause_s)
    raise AssertionError("not reached: the last try returns or raises")
