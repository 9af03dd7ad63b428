"""One decision per incident (issue 36): its admission and its capacity request in one update.

An incident introduced itself (`admit`) and, a moment later, asked for capacity (`request`):
two of the coordinator's updates per incident, each a slot of the ten Temporal allows in flight,
and the policy (about 650 bytes) sent back with every admission. `admit_and_request_many` takes
a worker's batch of incidents and decides, in one workflow task, first every admission in order,
then the capacity requests of those whose admitted action takes capacity (with their
containment, when asked): exactly as the same incidents' admissions one by one, then their
requests one by one (each incident admits before it asks, and any order of independent
incidents is an order they could have come in). tests/test_coordination.py proves it.

It decides no capacity while the coordinator rebuilds its books (the admissions are answered at
once; those incidents ask as before), nor in observe mode (they never ask).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from gpuheal.core import policy
from gpuheal.core.fleet import containment, coordination
from gpuheal.core.fleet.coordination import Effects
from gpuheal.core.fleet.models import (
    Admission,
    AdmitItem,
    Admitted,
    CapacityDecision,
    CapacityRequest,
    FleetState,
)
from gpuheal.core.fleet.policy import policy_key


def capacity_request(item: AdmitItem, admission: Admission, s: FleetState) -> CapacityRequest | None:
    """The request the incident would send once admitted (workflows/incident/capacity.request),
    or None when it would send none: not asked, observe mode, or an action that takes no
    capacity once admitted (a repeat offender is replaced: that takes capacity)."""
    if not item.ask_capacity or admission.policy.policy.mode == "observe":
        return None
    action = policy.as_admitted(item.admit.action, admission.repeat_offender)
    if not policy.takes_capacity(action):
        return None
    a = item.admit
    drains = item.contain_if_held and admission.policy.policy.containment_while_held == "drain"
    return CapacityRequest(
        cluster=a.cluster,
        incident_id=a.incident_id,
        placement=a.placement,
        action=action,
        run_id=a.run_id,
        contain_if_held=drains,
    )


def admit_and_request_many(
    s: FleetState,
    items: Sequence[AdmitItem],
    now: datetime,
    *,
    decide_capacity: bool,
    counts_left: bool = True,
    serve_when_freed: bool = True,
    compact: bool = True,
    app_faults_apart: bool = True,
) -> tuple[list[Admitted], Effects]:
    """Each item admitted in order (coordination.admit), then the capacity requests of those that
    asked and take capacity, decided as one batch (coordination.request_many, then
    containment.with_containment). `decide_capacity` False (a coordinator still rebuilding): the
    admissions alone."""
    out, admissions = Effects(), []
    for item in items:
        admission, effects = coordination.admit(
            s,
            item.admit,
            now,
            serve_when_freed=serve_when_freed,
            compact=compact,
            app_faults_apart=app_faults_apart,
        )
        out += effects
        admissions.append(admission)
    asks = [capacity_request(i, a, s) if decide_capacity else None for i, a in zip(items, admissions, strict=True)]
    reqs = [r for r in asks if r is not None]
    decided: dict[int, CapacityDecision] = {}
    if reqs:
        answers, effects = coordination.request_many(
            s, reqs, now, counts_left=counts_left, serve_when_freed=serve_when_freed
        )
        out += effects
        answers, effects = containment.with_containment(s, reqs, answers, now, counts_left)
        out += effects
        places = [k for k, r in enumerate(asks) if r is not None]
        decided = dict(zip(places, answers, strict=True))
    return [_admitted(i, a, decided.get(k)) for k, (i, a) in enumerate(zip(items, admissions, strict=True))], out


def _admitted(item: AdmitItem, a: Admission, decision: CapacityDecision | None) -> Admitted:
    known = item.known_policy and item.known_policy == policy_key(a.policy)
    return Admitted(
        policy=None if known else a.policy,
        repeat_offender=a.repeat_offender,
        domain_incident=a.domain_incident,
        breaker=a.breaker,
        decision=decision,
    )
