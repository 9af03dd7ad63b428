"""Failure traces for `gpuheal simulate`: generated from published rates, or read from a file.

The generator draws a Poisson process over the fleet (every GPU alike, a node chosen uniformly)
with the causes of Llama 3's 54-day pre-training run on 16,384 H100 GPUs: 419 unexpected
interruptions (Dubey et al., "The Llama 3 Herd of Models", 2024, Table 5). Shares are drawn by
the published counts, which sum to 419 (148 faulty GPU is 35.3 % of them; the paper's share
column prints 30.1 %). Each cause carries the report a node agent would send for it (an XID or a
health signal), or none: interruptions no GPU health check sees (a software bug, a switch)
start no incident, and every model pays the same for them.

A recorded trace is CSV (a header line `at_s,node,cause,xid,signal,gpu,took_s`) or JSON (a list of
objects with those fields); every row is validated, a bad one named by its line.
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, ValidationError

from gpuheal.core.errors import describe_error
from gpuheal.core.models.base import Frozen, NodeName

LLAMA3_INTERRUPTIONS = 419
LLAMA3_GPUS = 16_384
LLAMA3_DAYS = 54.0
# Interruptions per GPU per day, as published: 4.7e-4 (an 8-GPU node fails every ~264 days).
LLAMA3_RATE = LLAMA3_INTERRUPTIONS / (LLAMA3_GPUS * LLAMA3_DAYS)
MAX_FAILURES = 1_000_000  # a trace beyond this is refused, not simulated for hours


@dataclass(frozen=True)
class Cause:
    name: str
    count: int  # of Llama 3's 419
    xid: int | None = None  # the report a node agent sends for it
    signal: str | None = None


LLAMA3_CAUSES: tuple[Cause, ...] = (
    Cause("faulty_gpu", 148, xid=79),
    Cause("gpu_hbm3_memory", 72, xid=48),
    Cause("software_bug", 54),
    Cause("network_switch_or_cable", 35),
    Cause("host_maintenance", 32),
    Cause("gpu_sram_memory", 19, xid=95),
    Cause("gpu_system_processor", 17, xid=119),
    Cause("nic", 7),
    Cause("nccl_watchdog_timeout", 7),
    Cause("silent_data_corruption", 6),
    Cause("gpu_thermal_interface_or_sensor", 6, signal="health_check_failed"),
    Cause("ssd", 3),
    Cause("power_supply", 3),
    Cause("server_chassis", 2),
    Cause("io_expansion_board", 2),
    Cause("dependency", 2),
    Cause("cpu", 2),
    Cause("system_memory", 2),
)
assert sum(c.count for c in LLAMA3_CAUSES) == LLAMA3_INTERRUPTIONS


class TraceError(ValueError):
    """A trace that cannot be used: nothing is simulated."""


class Failure(Frozen):
    """One interruption: when (seconds from the trace's start), where, and what a health check
    would report (neither xid nor signal: nothing gpuheal sees)."""

    at_s: float = Field(ge=0)
    node: NodeName
    cause: str = Field(default="recorded", pattern=r"^[a-z0-9_]{1,40}$")
    xid: int | None = Field(default=None, ge=1, le=999)
    signal: str | None = Field(default=None, pattern=r"^[a-z0-9_]{1,40}$")
    gpu: int = Field(default=0, ge=0, le=63)
    # A recorded incident: how long its remediation kept the node (failure -> close), used for
    # it instead of the action's assumed time.
    took_s: float | None = Field(default=None, ge=0)

    @property
    def seen(self) -> bool:
        """A GPU health check reports it (an incident starts)."""
        return self.xid is not None or self.signal is not None


def node_name(i: int) -> str:
    return f"node{i:05d}"


def generate(
    nodes: int,
    days: float,
    *,
    gpus_per_node: int = 8,
    rate_per_gpu_day: float = LLAMA3_RATE,
    seed: int = 0,
    causes: tuple[Cause, ...] = LLAMA3_CAUSES,
) -> list[Failure]:
    """A Poisson trace: exponential gaps at the fleet's rate, each failure on a uniformly chosen
    node with a cause drawn by its published share. The same arguments give the same trace."""
    if nodes < 1 or gpus_per_node < 1 or not (0 < days < math.inf and 0 < rate_per_gpu_day < math.inf):
        raise TraceError("nodes, days, GPUs per node and the rate must all be positive and finite")
    rng = random.Random(seed)
    per_s = rate_per_gpu_day * nodes * gpus_per_node / 86400
    expected = per_s * days * 86400
    if expected > MAX_FAILURES:
        raise TraceError(f"about {expected:,.0f} failures: more than {MAX_FAILURES:,} (fewer days, nodes or rate)")
    weights = [c.count for c in causes]
    out: list[Failure] = []
    t = rng.expovariate(per_s)
    while t < days * 86400:
        cause = rng.choices(causes, weights)[0]
        out.append(
            Failure(
                at_s=round(t, 3),
                node=node_name(rng.randrange(nodes)),
                cause=cause.name,
                xid=cause.xid,
                signal=cause.signal,
                gpu=rng.randrange(gpus_per_node),
            )
        )
        t += rng.expovariate(per_s)
    return out


FIELDS = ("at_s", "node", "cause", "xid", "signal", "gpu", "took_s")


def read(path: Path) -> list[Failure]:
    """A recorded trace, CSV or JSON (by its suffix), sorted by time."""
    try:
        text = path.read_text()
    except OSError as err:
        raise TraceError(f"cannot read {path}: {err.strerror}") from err
    rows: list[tuple[int, dict[str, object]]]
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise TraceError(f"{path}: not JSON ({err.msg}, line {err.lineno})") from err
        if not isinstance(data, list):
            raise TraceError(f"{path}: a JSON trace is a list of failures")
        rows = [(i + 1, r) for i, r in enumerate(data)]
    else:
        reader = csv.DictReader(io.StringIO(text))
        if reader.fieldnames is None or not {"at_s", "node"} <= set(reader.fieldnames):
            raise TraceError(f"{path}: a CSV trace starts with the header {','.join(FIELDS)}")
        rows = [(i + 2, {k: v for k, v in r.items() if v not in ("", None)}) for i, r in enumerate(reader)]
    if len(rows) > MAX_FAILURES:
        raise TraceError(f"{path}: {len(rows):,} failures, more than {MAX_FAILURES:,}")
    out = []
    for where, row in rows:
        try:
            out.append(Failure.model_validate(row))
        except ValidationError as err:
            raise TraceError(f"{path}: entry {where}: {describe_error(err)}") from err
    return sorted(out, key=lambda f: f.at_s)


def to_csv(trace: list[Failure]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(FIELDS)
    for f in trace:
        w.writerow(["" if (v := getattr(f, k)) is None else v for k in FIELDS])
    return buf.getvalue()
