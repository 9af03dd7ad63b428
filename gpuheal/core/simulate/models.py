"""What `gpuheal simulate` takes and gives (gpuheal.core.simulate runs it). Every default is
declared once, here, with where its figure comes from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from gpuheal.core.errors import describe_error
from gpuheal.core.models.base import Frozen

Model = Literal["gpuheal", "slurmd_lost", "healthcheck_drain"]
MODELS: tuple[Model, ...] = ("gpuheal", "slurmd_lost", "healthcheck_drain")
MODEL_WORDS: dict[Model, str] = {
    "gpuheal": "(c) gpuheal: alert -> coordinator -> drain, requeue, repair or replace",
    "slurmd_lost": "(a) Slurm alone, slurmd lost: DOWN after SlurmdTimeout, Slurm requeues",
    "healthcheck_drain": "(b) Slurm + health check: drained, the job hung until a person requeues it",
}


class Timings(Frozen):
    """How long each part of a recovery takes. gpuheal's own part and Slurm's are measured by
    `make bench` (bench/results/mttr.json, read by `from_bench`); the rest are a real fleet's,
    stated as assumptions and changeable on the command line."""

    detect_s: float = Field(
        43.0,
        ge=0,
        description="failure -> report: Prometheus/Alertmanager at production "
        "intervals (bench/results/detection.md: 43 s; the agent's direct path is 0.05 s)",
    )
    gpuheal_s: float = Field(
        2.0, ge=0, description="gpuheal's own part: report -> the job requeued on a healthy node (bench: MTTR - floor)"
    )
    slurm_down_s: float = Field(
        527.0,
        ge=0,
        description="(a) Slurm's own part: slurmd lost -> the job "
        "requeued and started (bench: SlurmdTimeout 300 s + its requeue wait)",
    )
    job_restart_s: float = Field(
        600.0,
        ge=0,
        description="a large job's restart from its checkpoint (scheduling, NCCL init, checkpoint load): assumed",
    )
    checkpoint_interval_s: float = Field(
        1800.0,
        gt=0,
        description="work since the last checkpoint is redone: uniform in 0..this, the same draw in every model",
    )
    person_s: float = Field(
        3600.0,
        ge=0,
        description="a page answered: a person resubmits a job, "
        "repairs a node, resets a breaker, decides a domain incident",
    )
    reset_s: float = Field(300.0, ge=0, description="a GPU reset and its health check")
    reboot_s: float = Field(900.0, ge=0, description="a node reboot and its health check")
    replace_s: float = Field(1800.0, ge=0, description="a new node from the provider, joined and burned in")

    @classmethod
    def from_bench(cls, path: Path, **overrides: float) -> Timings:
        """The measured figures of `make bench` where its results exist, the rest as declared."""
        measured: dict[str, float] = {}
        if path.exists():
            try:
                data = json.loads(path.read_text())
                measured = {k: float(data[k]) for k in ("gpuheal_s", "slurm_down_s") if k in data}
            except (ValueError, TypeError, KeyError) as err:
                raise ValueError(f"{path}: not the benchmark's figures ({err})") from err
        try:
            return cls.model_validate({**measured, **overrides})
        except ValidationError as err:
            raise ValueError(describe_error(err)) from err


class Fleet(Frozen):
    """The fleet the trace runs on: jobs of `job_nodes` nodes; the nodes beyond are idle spares."""

    nodes: int = Field(ge=1, le=200_000)
    job_nodes: int = Field(128, ge=1)
    spares: int = Field(ge=0)
    gpus_per_node: int = Field(8, ge=1, le=64)
    rack_size: int = Field(32, ge=0, description="nodes per rack, the domain the escalation watches (0: none known)")
    cluster: str = "sim"

    @property
    def jobs(self) -> int:
        return (self.nodes - self.spares) // self.job_nodes


DecisionKind = Literal["granted", "held", "observed", "approval", "ignored"]


class Decision(Frozen):
    """What gpuheal's policy and coordinator did with one reported failure."""

    failure: int  # its index in the trace (sorted by time)
    at_s: float  # when it was reported
    node: str
    cause: str
    action: str
    decision: DecisionKind
    reason: str = ""
    waited_s: float = 0.0  # held: until granted (or the hold's bound)
    budget_used: int = 0  # nodes out because of gpuheal when it was decided


class ModelResult(Frozen):
    model: Model
    days: float
    effective_training: float  # productive GPU time / GPU time of the training nodes
    gpu_hours_lost: float
    interruptions: int  # job interruptions (any cause)
    incidents: int = 0  # failures a health check reports (gpuheal starts an incident)
    max_nodes_out: int  # failed nodes not yet back, at once
    mean_downtime_s: float  # per interruption: failure -> training again
    held: int = 0
    breaker_trips: int = 0
    domain_incidents: int = 0
    replaced: int = 0  # nodes replaced: by gpuheal in its model, by a person in the others
    max_budget_used: int = 0
    decisions: tuple[Decision, ...] = ()
