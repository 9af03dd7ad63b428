"""The soak's load: a seeded schedule of GPU failures across the clusters, as a fleet has them.

A schedule is a pure function of its seed and shape, so a seed replays a soak's load exactly.
The mix follows what a large fleet reports (most hardware, some application faults that gpuheal
must not mistake for hardware, some informational XIDs it must leave alone, repeats on one GPU
that escalate), and Alertmanager's habits: a group re-sent within seconds (duplicates) and again
at its repeat interval (late re-sends, the same alert with its first `startsAt`). Two kinds of
burst must trip the breaker: a rack at once, and a whole cluster's false alarm.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Kind = Literal[
    "hardware", "application", "informational", "repeat", "duplicate", "resend", "rack", "false_alarm", "relapse"
]
# The kinds that are a GPU failing (the node's jobs stop stepping): "relapse" is the operator's
# scene (infra.soak.acts), another GPU of a node whose incident it has just aborted.
HARDWARE_KINDS: frozenset[Kind] = frozenset({"hardware", "repeat", "rack", "relapse"})
PER_HOUR = 500  # new failures an hour across the clusters (the soak: about 500 incidents)
# XIDs by what gpuheal should do with them (gpuheal.core.policy.XID_ACTIONS), each with a weight:
# GPUs falling off the bus and ECC errors lead, as in the field.
HARDWARE = {79: 4, 48: 3, 95: 2, 64: 1, 74: 2, 119: 1, 140: 1}
APPLICATION = {13: 2, 31: 2, 43: 1}
INFORMATIONAL = {63: 1, 92: 1, 45: 1}
TABLES: dict[str, Mapping[int, int]] = {
    "hardware": HARDWARE,
    "application": APPLICATION,
    "informational": INFORMATIONAL,
}
MIX: dict[Kind, float] = {"hardware": 0.70, "application": 0.15, "informational": 0.10, "repeat": 0.05}
DUPLICATE_P, DUPLICATE_WITHIN_S = 0.3, 10.0  # Alertmanager's group re-sent at once (an HA pair)
RESEND_P, RESEND_AFTER_S = 0.1, (300.0, 900.0)  # and at its repeat interval, still firing
RACK_BURSTS_PER_HOUR, FALSE_ALARMS_PER_HOUR = 2, 1
GPUS = 8  # GPUs per node in the soak's fleet
BURST_WITHIN_S = 3.0  # a rack's or a cluster's reports all arrive within this


@dataclass(frozen=True)
class Failure:
    at_s: float  # when the soak sends it, from the load's start
    cluster: str
    node: str
    gpu: int
    xid: int
    kind: Kind
    first_s: float  # when the failure began (the alert's startsAt): a duplicate keeps its first's


@dataclass(frozen=True)
class Shape:
    """What the load runs over: each cluster's nodes that train, and its racks (lists of nodes)."""

    minutes: float
    nodes: Mapping[str, Sequence[str]]
    racks: Mapping[str, Sequence[Sequence[str]]]
    gpus: int = GPUS

    def __post_init__(self) -> None:
        if not self.nodes or not all(self.nodes.values()):
            raise ValueError("a soak's load needs every cluster to have nodes that train")
        if not any(self.racks.values()):
            raise ValueError("a soak's load needs a rack (a list of nodes) in some cluster, for its rack bursts")


def schedule(seed: int, shape: Shape) -> list[Failure]:
    """The whole load, sorted by when it is sent; nothing is sent after the load's end."""
    rng = random.Random(seed)
    end = shape.minutes * 60.0
    clusters = sorted(shape.nodes)
    out: list[Failure] = []
    t = 0.0
    while True:
        t += rng.expovariate(PER_HOUR / 3600.0)
        if t >= end:
            break
        out += _one(rng, t, end, shape, clusters, out)
    for count, make in ((RACK_BURSTS_PER_HOUR, _rack), (FALSE_ALARMS_PER_HOUR, _false_alarm)):
        for _ in range(_how_many(rng, count * shape.minutes / 60.0)):
            out += make(rng, rng.uniform(0.1, 0.9) * end, shape, clusters)
    return sorted(out, key=lambda f: (f.at_s, f.cluster, f.node, f.kind))


def _how_many(rng: random.Random, expected: float) -> int:
    """At least one of each burst in any soak (a short one must trip the breaker too)."""
    whole = int(expected)
    return max(1, whole + (1 if rng.random() < expected - whole else 0))


def _pick(rng: random.Random, weights: Mapping[int, int]) -> int:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def _one(
    rng: random.Random, t: float, end: float, shape: Shape, clusters: list[str], before: list[Failure]
) -> list[Failure]:
    kind: Kind = rng.choices(list(MIX), weights=list(MIX.values()))[0]
    earlier = [f for f in before if f.kind == "hardware"]
    if kind == "repeat" and earlier:  # the same XID on the same GPU again: it escalates
        last = rng.choice(earlier)
        first = Failure(t, last.cluster, last.node, last.gpu, last.xid, "repeat", t)
    else:
        kind = "hardware" if kind == "repeat" else kind
        cluster = rng.choice(clusters)
        node = rng.choice(list(shape.nodes[cluster]))
        first = Failure(t, cluster, node, rng.randrange(shape.gpus), _pick(rng, TABLES[kind]), kind, t)
    out = [first]
    if rng.random() < DUPLICATE_P and t + DUPLICATE_WITHIN_S < end:
        out.append(_again(first, t + rng.uniform(0.0, DUPLICATE_WITHIN_S), "duplicate"))
    late = t + rng.uniform(*RESEND_AFTER_S)
    if rng.random() < RESEND_P and late < end:
        out.append(_again(first, late, "resend"))
    return out


def _again(first: Failure, at: float, kind: Kind) -> Failure:
    return Failure(at, first.cluster, first.node, first.gpu, first.xid, kind, first.first_s)


def _rack(rng: random.Random, t: float, shape: Shape, clusters: list[str]) -> list[Failure]:
    """A rack's nodes at once: its power or its switch, each node's GPUs lost (XID 79) or its
    NVLink (74)."""
    cluster = rng.choice([c for c in clusters if shape.racks.get(c)])
    rack, xid = rng.choice(list(shape.racks[cluster])), rng.choice((79, 74))
    return [Failure(t + rng.uniform(0, BURST_WITHIN_S), cluster, n, 0, xid, "rack", t) for n in rack]


def _false_alarm(rng: random.Random, t: float, shape: Shape, clusters: list[str]) -> list[Failure]:
    """Every node of one cluster at once: a monitoring fault, not the GPUs (double-bit ECC on all)."""
    cluster = rng.choice(clusters)
    return [
        Failure(t + rng.uniform(0, BURST_WITHIN_S), cluster, n, 0, 48, "false_alarm", t) for n in shape.nodes[cluster]
    ]


# A relapse's XIDs, in the order it takes them: each drains the node (resets, which the soak's
# policy does without approval, then a lost GPU).
RELAPSE_XIDS = (48, 95, 64, 119, 140, 143, 32, 79)


def relapse_failure(sent: Sequence[tuple[float, int, int]], since: float) -> tuple[int, int]:
    """(GPU, XID) of a node's relapse, given what was sent to it as (when, GPU, XID). Never a
    failure sent to it before: the aborted run may have taken any of them in, and dedupe's window
    runs from its close, so any could be a duplicate. An XID not sent since `since` (the aborted
    run's start) where one is left: its drain reason unlike the node's, since Slurm logs nothing
    for a drain with the reason a node has. Then one not sent at all, on a GPU not sent to."""
    pairs = {(g, x) for _, g, x in sent}
    recent, ever, gpus = {x for at, _, x in sent if at >= since}, {x for _, _, x in sent}, {g for _, g, _ in sent}
    left = [(g, x) for x in RELAPSE_XIDS for g in range(GPUS) if (g, x) not in pairs]
    if not left:
        raise ValueError(f"every relapse failure was sent to the node already ({len(pairs)} of them)")
    return min(left, key=lambda p: (p[1] in recent, p[1] in ever, p[0] in gpus))
