"""`gpuheal simulate`: a failure trace through the real policy and coordinator decisions, and
what each model of recovery costs a fleet in training time.

The fleet runs jobs of `job_nodes` nodes; the nodes beyond are idle spares. Every interruption
stops its job until the job has healthy nodes again and has restarted, and the work since its
last checkpoint is redone. The three models (gpuheal.core.simulate.models.MODEL_WORDS) differ in
what happens between the failure and the job's requeue, and in who repairs the node:

- gpuheal (gpuheal.core.simulate.answer): the real triage, admission, capacity and confirmation
  decisions of the coordinator (gpuheal.core.fleet.coordination) on the simulated clock.
- slurmd_lost (a): the job starts again `slurm_down_s` after the failure; a person repairs.
- healthcheck_drain (b): the node is drained, the job hangs; a person (`person_s`) requeues or
  resubmits it (a job that reached its time limit meanwhile ended TIMEOUT, which Slurm never
  requeues by itself: the benchmark measured it) and repairs the node.

Interruptions no health check sees (software, network) cost the same in every model: the job
restarts at once. A report whose action is `ignore` interrupts nothing. Nothing here reads a
clock or does I/O: the same trace gives the same figures.
"""

from __future__ import annotations

import random

from gpuheal.core.fleet.policy import FleetPolicy
from gpuheal.core.simulate.answer import Gpuheal
from gpuheal.core.simulate.engine import Engine
from gpuheal.core.simulate.models import Fleet, Model, ModelResult, Timings
from gpuheal.core.simulate.traces import Failure, node_name


def simulate(
    trace: list[Failure],
    fleet: Fleet,
    days: float,
    timings: Timings,
    candidate: FleetPolicy,
    models: tuple[Model, ...],
    seed: int = 0,
    checking: bool = False,
) -> list[ModelResult]:
    """Each model over the same trace, with the same draws of work to redo."""
    trace = sorted(trace, key=lambda f: f.at_s)
    rng = random.Random(seed)
    recompute = [rng.uniform(0, timings.checkpoint_interval_s) for _ in trace]
    names = fleet_names(trace, fleet)
    out = []
    for m in models:
        engine = Engine(m, fleet, timings, candidate, recompute, names, checking=checking)
        if m == "gpuheal":
            out.append(Gpuheal(engine).run(trace, days))
        else:
            engine.run(trace, days)
            out.append(engine.result(days))
    return out


def fleet_names(trace: list[Failure], fleet: Fleet) -> list[str]:
    """The trace's nodes, then generated ones (node00000...) up to the fleet's size."""
    names = sorted({f.node for f in trace})
    if len(names) > fleet.nodes:
        raise ValueError(f"the trace names {len(names)} nodes, more than the fleet's {fleet.nodes} (--nodes)")
    known = set(names)
    i = 0
    while len(names) < fleet.nodes:
        if (name := node_name(i)) not in known:
            names.append(name)
        i += 1
    return sorted(names)
