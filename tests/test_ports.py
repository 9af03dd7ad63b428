"""The sandbox's port sets (infra.sandbox.stack.PORTS) never overlap: the demo, the tests, the
benchmarks and two soaks run side by side on one machine (`make test` runs a soak beside its
tests, and the hour's soak runs beside `make test`)."""

from __future__ import annotations

from itertools import combinations

from infra.sandbox.stack import PORTS, Ports

# The sets whose Temporal may be the cluster (its membership ports PORT - 300 on); the others run
# the dev server.
CLUSTER_SETS = frozenset({"demo", "production", "soak", "soak-long"})


def spans(name: str, p: Ports) -> list[tuple[str, int, int]]:
    """What each part of a set may bind, low and high included."""
    return [
        # The Temporal cluster: its services from PORT to PORT + 40, its membership PORT - 300 on.
        ("temporal", p.temporal, p.temporal + 40),
        ("temporal-ui", p.temporal + 1000, p.temporal + 1000),  # the dev server's UI
        *([("membership", p.temporal - 300, p.temporal - 297)] if name in CLUSTER_SETS else []),
        ("webhook", p.webhook, p.webhook + 50),  # the soak's second webhook +1, its notices +50
        ("metrics", p.metrics, p.metrics + 31),  # a worker's and its SDK's, 10 apart per worker
        ("kube", p.kube, p.kube + 2),  # the apiserver, etcd's client and peer ports
        # Per Slurm release (three), 200 lower for each newer one: slurmctld PORT, slurmd PORT + 1,
        # slurmrestd PORT + 3, and a slurmd per node from PORT + 101 (32 nodes at most here).
        *[(f"slurm-{v}", p.slurm - 200 * v, p.slurm - 200 * v + 3) for v in range(3)],
        *[(f"slurmd-{v}", p.slurm - 200 * v + 101, p.slurm - 200 * v + 132) for v in range(3)],
    ]


def test_no_two_port_sets_share_a_port() -> None:
    taken = [(name, part, lo, hi) for name, p in PORTS.items() for part, lo, hi in spans(name, p)]
    clashes = [
        f"{a[0]}.{a[1]} {a[2]}-{a[3]} and {b[0]}.{b[1]} {b[2]}-{b[3]}"
        for a, b in combinations(taken, 2)
        if a[2] <= b[3] and b[2] <= a[3]
    ]
    assert clashes == []
