"""The project's own Prometheus metrics, served by the worker beside the SDK's.

Stage durations and MTTR are observed when an incident closes (record_incident_metrics); the
open-incident gauge is refreshed from Temporal's visibility store, so it stays right across
worker restarts and with several workers.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from gpuheal.core.fleet.view import FleetView
from gpuheal.core.models.base import ActionClass, Stage
from gpuheal.core.models.result import RemediationResult

_BUCKETS = (5, 10, 20, 30, 60, 120, 300, 600, 900, 1800, 3600)

INCIDENTS_OPEN = Gauge("gpuheal_incidents_open", "Remediation workflows running now")
INCIDENTS_CLOSED = Counter("gpuheal_incidents_closed_total", "Incidents closed", ["action", "outcome"])
STAGE_SECONDS = Histogram(
    "gpuheal_stage_duration_seconds",
    "Time spent in each remediation stage",
    ["stage"],
    buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900),
)
MTTR_SECONDS = Histogram(
    "gpuheal_mttr_seconds",
    "Failure observed to training making progress again",
    ["action"],
    buckets=_BUCKETS,
)
DETECTION_SECONDS = Histogram(
    "gpuheal_detection_seconds",
    "Failure observed (the first report's time) to its incident starting",
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
)
STEPS_LOST = Counter("gpuheal_training_steps_lost_total", "Training steps redone after failures")
GPU_SECONDS_LOST = Counter("gpuheal_gpu_seconds_lost_total", "GPU time lost to failures")


# Every label set exists (at zero) from the start, so increase() over a window counts the first
# incident too (a series that appears at 1 has no increase to Prometheus).
for _action in ActionClass:
    MTTR_SECONDS.labels(_action.value)
for _stage in Stage:
    STAGE_SECONDS.labels(_stage.value)


def observe_incident(result: RemediationResult) -> None:
    INCIDENTS_CLOSED.labels(result.action.value, result.outcome).inc()
    for stage in result.stages:
        if stage.duration_s is not None:
            STAGE_SECONDS.labels(stage.stage.value).observe(stage.duration_s)
    if result.mttr_s is not None:
        MTTR_SECONDS.labels(result.action.value).observe(result.mttr_s)
    if result.stages:
        DETECTION_SECONDS.observe(max(0.0, (result.stages[0].started_at - result.failure_observed_at).total_seconds()))
    STEPS_LOST.inc(result.steps_lost)
    GPU_SECONDS_LOST.inc(result.gpu_seconds_lost)


# The fleet (its coordinator's state, refreshed by the worker every 15 s).
FLEET_MODE = Gauge("gpuheal_fleet_mode", "1 for the cluster's current mode", ["mode"])
FLEET_BREAKER = Gauge("gpuheal_fleet_breaker_tripped", "1 while the circuit breaker is tripped")
FLEET_OUT = Gauge("gpuheal_fleet_out_of_service", "Nodes out of service because of gpuheal now")
FLEET_HELD = Gauge("gpuheal_fleet_held", "Incidents held, waiting for capacity")
FLEET_BUDGET_LIMIT = Gauge("gpuheal_fleet_budget_limit", "Nodes the disruption budget allows out", ["budget"])
FLEET_BUDGET_USED = Gauge("gpuheal_fleet_budget_used", "Nodes out against each budget", ["budget"])


_BUDGETS_SHOWN: set[str] = set()  # the budget labels set last time


def observe_fleet(view: FleetView) -> None:
    for mode in ("observe", "approve", "auto"):
        FLEET_MODE.labels(mode).set(1 if view.mode == mode else 0)
    FLEET_BREAKER.set(1 if view.breaker.tripped else 0)
    FLEET_OUT.set(view.out + view.containing + view.left)
    FLEET_HELD.set(view.held)
    shown = {u.name for u in (*view.budget, *([view.containment] if view.containment else []))}
    for gone in _BUDGETS_SHOWN - shown:  # a budget no longer in the view: its series ends (no stale value)
        FLEET_BUDGET_LIMIT.remove(gone)
        FLEET_BUDGET_USED.remove(gone)
    _BUDGETS_SHOWN.clear()
    _BUDGETS_SHOWN.update(shown)
    for use in (*view.budget, *([view.containment] if view.containment else [])):
        FLEET_BUDGET_LIMIT.labels(use.name).set(use.limit)
        FLEET_BUDGET_USED.labels(use.name).set(use.used)
