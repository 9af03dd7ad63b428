"""The engine of `gpuheal simulate` (gpuheal.core.simulate): the fleet on a simulated clock, who
owns which node, which are out, which jobs are down, and Slurm left to itself (models (a) and
(b)); gpuheal's own answer to a report is gpuheal.core.simulate.answer."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial

from gpuheal.core import policy
from gpuheal.core.fleet.policy import FleetPolicy
from gpuheal.core.models.base import ActionClass
from gpuheal.core.models.report import HealthReport
from gpuheal.core.simulate.models import Fleet, Model, ModelResult, Timings
from gpuheal.core.simulate.traces import Failure

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)  # the trace's second 0 (any fixed moment: nothing reads the clock)
REPAIR_TIME: dict[ActionClass, str] = {
    ActionClass.RESET_GPU: "reset_s",
    ActionClass.REBOOT_NODE: "reboot_s",
    ActionClass.REPLACE_NODE: "replace_s",
}


@dataclass
class Job:
    down_since: float | None = None
    missing: int = 0  # failed nodes still to be given back to it
    epoch: int = 0  # a later interruption makes an earlier restart event stale
    recompute_s: float = 0.0


@dataclass
class Engine:
    """The fleet on a simulated clock: who owns which node, which are out, which jobs are down."""

    model: Model
    fleet: Fleet
    t: Timings
    policy: FleetPolicy
    recompute: list[float]  # per failure: work since the last checkpoint (the same in every model)
    names: list[str]
    now: float = 0.0
    seq: int = 0
    events: list[tuple[float, int, Callable[[], None]]] = field(default_factory=list)
    owner: dict[str, int | None] = field(default_factory=dict)
    out: set[str] = field(default_factory=set)
    # Failed nodes their job has not let go of yet (node -> job): its requeue is still to come.
    holding: dict[str, int] = field(default_factory=dict)
    idle: deque[str] = field(default_factory=deque)
    wanting: deque[int] = field(default_factory=deque)
    jobs: list[Job] = field(default_factory=list)
    lost_node_s: float = 0.0
    downtimes: list[float] = field(default_factory=list)
    max_out: int = 0
    replaced: int = 0
    respond: Callable[[Failure, int, ActionClass], None] | None = None  # the model's answer to a report
    checking: bool = False  # check the node invariant after every event (tests)
    on_back: Callable[[str], None] | None = None  # a node back in service (the coordinator's reap)
    rack: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        f = self.fleet
        for i, name in enumerate(self.names):
            if f.rack_size:
                self.rack[name] = i // f.rack_size
            job = i // f.job_nodes if i < f.jobs * f.job_nodes else None
            self.owner[name] = job
            if job is None:
                self.idle.append(name)
        self.jobs = [Job() for _ in range(f.jobs)]

    # --- the clock ------------------------------------------------------------------------

    def at(self, when: float, do: Callable[[], None]) -> None:
        self.seq += 1
        heapq.heappush(self.events, (max(when, self.now), self.seq, do))

    def clock(self) -> datetime:
        return EPOCH + timedelta(seconds=self.now)

    def run(self, trace: list[Failure], days: float, after_each: Callable[[], None] | None = None) -> float:
        """Every failure and what follows, up to the end; returns the node-seconds of training lost."""
        for i, failure in enumerate(trace):
            self.at(failure.at_s, partial(self.fail, failure, i))
        end = days * 86400
        while self.events and self.events[0][0] <= end:
            self.now, _, do = heapq.heappop(self.events)
            do()
            if self.checking:
                self.check()
            if after_each is not None:
                after_each()
        self.now = end
        for job in self.jobs:  # still down at the end: lost until the end
            if job.down_since is not None:
                self.lost_node_s += self.fleet.job_nodes * (end - job.down_since + job.recompute_s)
        return self.lost_node_s

    # --- nodes and jobs ---------------------------------------------------------------------

    def report_of(self, f: Failure) -> HealthReport:
        return HealthReport(
            node=f.node, cluster=self.fleet.cluster, xid=f.xid, signal=f.signal, gpu=f.gpu, observed_at=self.clock()
        )

    def fail(self, f: Failure, index: int) -> None:
        if f.node not in self.owner or f.node in self.out or f.node in self.holding:
            return  # a node out already, or not yet let go by its job, or gone: nothing more to lose
        action = policy.triage(self.report_of(f)).action if f.seen else None
        if action == ActionClass.IGNORE:  # informational (a row remap recorded): nothing stops
            if self.respond is not None:
                self.respond(f, index, action)
            return
        self.out.add(f.node)
        if f.node in self.idle:
            self.idle.remove(f.node)  # a failed spare is no spare
        self.max_out = max(self.max_out, len(self.out))
        job = self.owner[f.node]
        if job is not None:
            self.holding[f.node] = job
            self.interrupt(job, index)
        if action is None:  # software, network: the job restarts at once, the node is fine
            self.requeue(f.node)
            self.node_back(f.node)
        elif self.respond is not None:
            self.respond(f, index, action)
        else:
            self.by_slurm(f, action)

    def interrupt(self, job: int, index: int) -> None:
        j = self.jobs[job]
        if j.down_since is None:
            j.down_since, j.recompute_s = self.now, self.recompute[index]
        j.missing += 1
        j.epoch += 1

    def requeue(self, node: str) -> None:
        """The job a failure on `node` stopped lets go of it and asks for a healthy node (a
        spare, or the next back). Once per failure: a later call finds nothing held."""
        if node not in self.holding:
            return
        self._let_go(node)
        if node not in self.out:  # repaired before the job let go of it
            self.idle.append(node)
        self.place()

    def _let_go(self, node: str) -> None:
        job = self.holding.pop(node)
        self.owner[node] = None
        self.wanting.append(job)

    def place(self) -> None:
        while self.wanting and self.idle:
            job, node = self.wanting.popleft(), self.idle.popleft()
            j = self.jobs[job]
            assert node not in self.out and self.owner.get(node) is None and j.missing > 0, (node, job, j)
            self.owner[node] = job
            j.missing -= 1
            if j.missing == 0:
                epoch = j.epoch
                self.at(self.now + self.t.job_restart_s, partial(self.resumed, job, epoch))

    def resumed(self, job: int, epoch: int) -> None:
        j = self.jobs[job]
        if j.epoch != epoch or j.down_since is None:
            return
        down = self.now - j.down_since
        self.downtimes.append(down)
        self.lost_node_s += self.fleet.job_nodes * (down + j.recompute_s)
        j.down_since = None

    def node_back(self, node: str, new_name: str | None = None) -> None:
        """A repaired node is back (or a new one joins in a replaced one's place) as a spare.
        Repaired before its job let go of it, it waits for that (the job's requeue); replaced,
        its job lets go of it now (the old node has left)."""
        self.out.discard(node)
        if self.on_back is not None:
            self.on_back(node)
        if new_name is not None:
            if node in self.holding:
                self._let_go(node)
            self.owner.pop(node, None)
            self.owner[new_name] = None
            self.idle.append(new_name)
        elif node not in self.holding and node not in self.idle:
            self.idle.append(node)
        self.place()

    def repair(
        self,
        f: Failure,
        action: ActionClass,
        after: float,
        done: Callable[[], None] | None = None,
        extra: float = 0.0,
    ) -> None:
        """The node out for `after` then its repair. A recorded incident kept it as long as it
        did, plus what the candidate made it wait more (`extra`: its holds)."""
        if f.took_s is not None:
            when = f.at_s + f.took_s + extra
        else:
            when = self.now + after + getattr(self.t, REPAIR_TIME.get(action, "reset_s"))

        def repaired() -> None:
            if action == ActionClass.REPLACE_NODE and f.took_s is None:
                self.replaced += 1
                self.node_back(f.node, f"{f.node}-r{self.replaced}")
            else:
                self.node_back(f.node)
            if done is not None:
                done()

        self.at(when, repaired)

    def by_slurm(self, f: Failure, action: ActionClass) -> None:
        """Slurm alone: the job back after its timers or a person; a person repairs the node."""
        back = self.t.slurm_down_s if self.model == "slurmd_lost" else self.t.person_s
        self.at(self.now + back, lambda: self.requeue(f.node))
        self.repair(f, action, after=self.t.person_s)

    def check(self) -> None:
        """Every node is in one place: owned and healthy, held by the job it failed under, idle,
        or out; and every job's healthy nodes plus those it misses are its size, each missed one
        held (its requeue to come) or asked for (in line for a node)."""
        idle = set(self.idle)
        assert len(idle) == len(self.idle), "a node idle twice"
        assert not idle & self.out and all(self.owner.get(n) is None for n in idle), "an idle node owned or out"
        assert all(self.owner.get(n) == j for n, j in self.holding.items()), "a held node owned by another job"
        for n, j in self.owner.items():
            assert j is not None or n in idle or n in self.out, f"{n} is nowhere"
        for i, job in enumerate(self.jobs):
            healthy = sum(1 for n, j in self.owner.items() if j == i and n not in self.holding)
            held = sum(1 for j in self.holding.values() if j == i)
            asked = sum(1 for j in self.wanting if j == i)
            assert job.missing == held + asked and healthy + job.missing == self.fleet.job_nodes, (i, job)

    def result(self, days: float, **gpuheal: object) -> ModelResult:
        f = self.fleet
        total = f.jobs * f.job_nodes * days * 86400
        lost = min(self.lost_node_s, total)
        return ModelResult.model_validate(
            {
                "model": self.model,
                "days": days,
                "effective_training": 1 - lost / total if total else 0.0,
                "gpu_hours_lost": round(lost * f.gpus_per_node / 3600, 1),
                "interruptions": len(self.downtimes) + sum(1 for j in self.jobs if j.down_since is not None),
                "max_nodes_out": self.max_out,
                "mean_downtime_s": sum(self.downtimes) / len(self.downtimes) if self.downtimes else 0.0,
                "replaced": self.replaced,
                **gpuheal,
            }
        )
