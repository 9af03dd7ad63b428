"""The soak's faults: a seeded schedule of one fault every couple of minutes, drawn so that every
kind comes round (each kind once before any twice), and the operator's acts that keep the world
moving. Pure: the harness carries each fault out (infra.soak's world) and records when it did.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

EVERY_S = 120.0  # a fault about every two minutes
JITTER = 0.25  # each gap drawn within +-25 %
FIRST_S = 30.0  # the first one after the load has begun
# How long a fault that lasts (a daemon stopped, an endpoint refusing) lasts, at most.
LASTS_S = (20.0, 90.0)

FaultKind = Literal[
    "kill_worker",  # SIGKILL a worker, chosen while it runs an incident's activity (Slurm, a node)
    "restart_temporal",  # the Temporal server's services restarted
    "restart_postgres",  # the database under Temporal restarted
    "stop_slurmctld",  # slurmctld stopped for a while, then started
    "apiserver_away",  # the Kubernetes apiserver unreachable for a while
    "notices_refused",  # the notice receiver answers 503 for a while
    "terminate_coordinator",  # the cluster's coordinator terminated by hand
    "pause_resume",  # an operator pauses the cluster, and resumes it a while later
    "policy_change",  # an operator applies a changed policy (a validated, recorded change)
    "roll_workers",  # the workers restarted one by one, as a rolling restart of their pods
]
FAULTS: tuple[FaultKind, ...] = (
    "kill_worker",
    "restart_temporal",
    "restart_postgres",
    "stop_slurmctld",
    "apiserver_away",
    "notices_refused",
    "terminate_coordinator",
    "pause_resume",
    "policy_change",
    "roll_workers",
)
# Faults that act on one gpuheal cluster (the others act on what the clusters share).
PER_CLUSTER = frozenset(
    {"kill_worker", "stop_slurmctld", "terminate_coordinator", "pause_resume", "policy_change", "roll_workers"}
)


@dataclass(frozen=True)
class Fault:
    at_s: float  # from the load's start
    kind: FaultKind
    cluster: str  # the cluster it acts on ("" for what the clusters share)
    lasts_s: float  # how long it lasts before it is undone (0: a single act)


def schedule(seed: int, minutes: float, clusters: list[str], kube_cluster: str) -> list[Fault]:
    """Faults from FIRST_S to the load's end, every EVERY_S (+-JITTER), kinds dealt like cards:
    each round of len(FAULTS) is a shuffled deck, so an hour's thirty deal each kind three times.
    The apiserver's fault goes to the cluster that has Kubernetes."""
    rng = random.Random(seed)
    end, t = minutes * 60.0, FIRST_S
    deck: list[FaultKind] = []
    out: list[Fault] = []
    while t < end:
        if not deck:
            deck = list(FAULTS)
            rng.shuffle(deck)
        kind = deck.pop()
        cluster = kube_cluster if kind == "apiserver_away" else rng.choice(sorted(clusters))
        lasting = kind in ("stop_slurmctld", "apiserver_away", "notices_refused", "pause_resume")
        lasts = round(rng.uniform(*LASTS_S), 1) if lasting else 0.0
        out.append(Fault(round(t, 1), kind, cluster if kind in PER_CLUSTER or kind == "apiserver_away" else "", lasts))
        t += EVERY_S * rng.uniform(1 - JITTER, 1 + JITTER)
    return out
