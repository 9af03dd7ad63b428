"""Domain incidents that end, or never come, without a decision: pure functions over FleetState,
beside gpuheal.core.fleet.reaping (which does the same for node incidents' runs).

An undecided domain incident holds every incident of its domain (breaker.escalated_domain). Its
workflow decides by its default when its bound runs out (workflows/domain.py), but a workflow
that failed or was terminated, that never started, or whose decision never reached the
coordinator decides nothing: the rack would stay held for good, each later incident of it ending
not granted after its own hold bound. So the coordinator asks, at its looks for closed runs,
whether their workflows closed (undecided_refs, then reap_domains), and applies the default to
any still undecided past its bound plus OVERDUE_MARGIN_S (release_overdue): either way the
domain is freed, with a warning to the operators.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Literal

from gpuheal.core.fleet.coordination import Effects
from gpuheal.core.fleet.models import DomainDecision, DomainIncident, DomainIncidentInput, FleetState, RunRef
from gpuheal.core.fleet.steering import domain_decision
from gpuheal.core.models.incident import POLICY_OPERATOR

# What a domain incident's workflow is started with (activities/fleet.py opens it with the
# defaults): its bound, and what silence means. Read from the model so the two never disagree.
DEFAULT_BOUND_S: float = DomainIncidentInput.model_fields["decide_within_s"].default
DEFAULT_DECISION: Literal["release", "dismiss"] = DomainIncidentInput.model_fields["default"].default
# Past its bound, a workflow still needs time to tell the coordinator its decision: its notice is
# retried for up to ~5 minutes before the bound starts, and in a storm a coordinator call queues
# for minutes (bench/storm.py: p99 52 s). Well within the 6 h a held node incident waits.
OVERDUE_MARGIN_S = 1800.0


def undecided_refs(s: FleetState, opening: Iterable[str] = ()) -> list[RunRef]:
    """The undecided domain incidents, as runs for the look for closed runs to ask about (by
    workflow id; run_id "" is its latest run). Those whose workflow is still being opened
    (`opening`: their incident ids, the coordinator's domain incidents on their way) are left
    out: "not found" counts as closed, and a workflow not started yet is not a closed one."""
    skip = set(opening)
    return [
        RunRef(incident_id=d.incident_id, run_id="", node="")
        for d in s.domain_incidents.values()
        if not d.decided and d.incident_id not in skip
    ]


def reap_domains(s: FleetState, closed: Iterable[RunRef], now: datetime) -> Effects:
    """Undecided domain incidents whose workflow closed (failed, terminated, gone): decided by
    their default, so their node incidents go on (within the budget). Other runs in `closed`
    (node incidents') are ignored: the same look may carry both."""
    gone = {r.incident_id for r in closed}
    out = Effects()
    for d in _undecided(s):
        if d.incident_id in gone:
            out += _by_default(s, d, "ended without a decision reaching the coordinator (failed or terminated)", now)
    return out


def overdue(s: FleetState, now: datetime, bound_s: float = DEFAULT_BOUND_S) -> list[DomainIncident]:
    """The undecided domain incidents opened more than `bound_s` + OVERDUE_MARGIN_S ago."""
    late = timedelta(seconds=bound_s + OVERDUE_MARGIN_S)
    return [d for d in _undecided(s) if now - d.opened_at >= late]


def release_overdue(s: FleetState, now: datetime, bound_s: float = DEFAULT_BOUND_S) -> Effects:
    """The overdue ones decided by their default: a domain incident that never started, or whose
    decision never arrived, frees its domain all the same. Asked at each look for closed runs
    (every REAP_EVERY_S): a few minutes late at most, against a margin of OVERDUE_MARGIN_S."""
    out = Effects()
    why = f"had no decision {(bound_s + OVERDUE_MARGIN_S) / 60:g} min after it opened"
    for d in overdue(s, now, bound_s):
        out += _by_default(s, d, why, now)
    return out


def _undecided(s: FleetState) -> list[DomainIncident]:
    return [d for d in s.domain_incidents.values() if not d.decided]


def _by_default(s: FleetState, d: DomainIncident, why: str, now: datetime) -> Effects:
    decision = DomainDecision(
        domain=d.domain, decision=DEFAULT_DECISION, operator=POLICY_OPERATOR, reason=f"domain incident {why}"
    )
    _, out = domain_decision(s, decision, now)
    then = {
        "release": "released by default: its node incidents go on, within the budget",
        "dismiss": "dismissed by default: its node incidents end",
    }[DEFAULT_DECISION]
    text = (
        f"domain incident {d.incident_id} ({d.domain}, {len(d.nodes)} nodes) {why}; {then}. Check the domain "
        "(switch, power, cooling) and the domain incident's history."
    )
    out.notes.append(("domain_incident_defaulted", "warning", text))
    return out
