"""What `gpuheal fleet`, the fleet gauges and the storm benchmark read: the coordinator's state,
as it shows it. Pure, no I/O.

The coordinator answers a `status` query with everything (`FleetStatus`), but a query needs the
busy workflow to answer it, and in a storm Temporal refuses queries for minutes ("consistent
query buffer is full"): the operator went blind exactly when it mattered. So the coordinator
also writes a `FleetView` into its memo as it decides, and a memo is read from the server
(`describe`), with no worker involved. The view is the same figures with each list cut to its
first `VIEW_NODES` (it goes into the coordinator's history with every change, so it is kept
to about a kilobyte); `gpuheal fleet --live` asks the query for the lists, each up to
`STATUS_MOST`.
"""

from __future__ import annotations

from datetime import datetime
from typing import TypeVar

from pydantic import ConfigDict

from gpuheal.core.fleet.budget import budget_uses, containment_use
from gpuheal.core.fleet.models import Breaker, BudgetUse, DomainIncident, FleetState, FleetStatus, Grant
from gpuheal.core.fleet.policy import Mode
from gpuheal.core.models.base import Frozen

VIEW_NODES = 10  # per list in the memo; the counts are always whole
# Per list in the `status` query's answer (`gpuheal fleet --live`): its four lists of incidents
# together at most about 0.6 MB (a held one is about 440 bytes), so an answer stays far below
# gRPC's 4 MiB beside what a workflow task carries (Design 014).
STATUS_MOST = 500
NOTE_CHARS = 120  # a held incident's reason, cut
T = TypeVar("T")


class NodeLine(Frozen):
    model_config = ConfigDict(frozen=True, extra="ignore")  # a newer coordinator's view still reads

    node: str  # a node, or a domain for a domain incident
    incident_id: str
    note: str = ""


class FleetView(Frozen):
    model_config = ConfigDict(frozen=True, extra="ignore")  # a newer coordinator's view still reads

    at: datetime  # the coordinator's time at its last change (a quiet coordinator writes nothing)
    cluster: str
    mode: Mode
    policy_version: int
    breaker: Breaker
    budget: tuple[BudgetUse, ...]  # cluster, each pool, each domain in use
    budgets_not_shown: int = 0  # domain budgets with nothing out, or past the first VIEW_NODES in use
    containment: BudgetUse | None = None
    remediations_in_window: int = 0
    out: int = 0  # granted (and contained by an earlier release's path)
    containing: int = 0  # held, drained as containment
    left: int = 0  # drained by closed runs, still counted
    held: int = 0
    out_nodes: tuple[NodeLine, ...] = ()
    containing_nodes: tuple[NodeLine, ...] = ()
    left_nodes: tuple[NodeLine, ...] = ()
    held_nodes: tuple[NodeLine, ...] = ()
    domain_incidents: tuple[NodeLine, ...] = ()
    whole: bool = False  # every list is complete (from the query)


def status(s: FleetState, now: datetime, most: int = STATUS_MOST) -> FleetStatus:
    """Everything the coordinator holds, as the `status` query answers it: each list of
    incidents cut to its first `most`, with its whole length in `totals`."""
    window = s.policy.policy.budget.rate_window_s
    lists = {
        "out_of_service": (*s.grants.values(), *s.contained.values()),
        "held": tuple(s.queue),
        "containing": tuple(s.containing.values()),
        "left": tuple(s.left.values()),
    }
    totals = {name: len(items) for name, items in lists.items() if len(items) > most}
    return FleetStatus(
        cluster=s.cluster,
        mode=s.policy.policy.mode,
        policy_version=s.policy.version,
        breaker=s.breaker,
        out_of_service=lists["out_of_service"][:most],
        held=lists["held"][:most],
        budget=tuple(budget_uses(s, None)),
        domain_incidents=tuple(s.domain_incidents.values()),
        remediations_in_window=sum(1 for t in s.remediations if (now - t).total_seconds() < window),
        containment=containment_use(s),
        containing=lists["containing"][:most],
        left=lists["left"][:most],
        totals=totals,
    )


def _line(g: Grant, note: str = "") -> NodeLine:
    return NodeLine(node=g.node, incident_id=g.incident_id, note=note)


def _domain_line(d: DomainIncident) -> NodeLine:
    nodes = ", ".join(d.nodes[:5]) + (", ..." if len(d.nodes) > 5 else "")
    note = f"{len(d.nodes)} nodes: {nodes} ({d.decided or 'open'})"
    return NodeLine(node=d.domain, incident_id=d.incident_id, note=note)


def view(st: FleetStatus, at: datetime, cut: int | None = VIEW_NODES) -> FleetView:
    """The status as shown: each list cut to its first `cut` (None: whole), the counts whole."""

    def first(items: tuple[T, ...]) -> tuple[T, ...]:
        return items if cut is None else items[:cut]

    # The cluster's and pools' budgets always; domains only in use (a fleet has hundreds of racks).
    budget = [u for u in st.budget if not u.name.startswith("domain ")]
    domains = tuple(u for u in st.budget if u.name.startswith("domain ") and (u.used > 0 or cut is None))
    if cut is not None:  # the fullest first: those are the ones an operator must see
        domains = tuple(sorted(domains, key=lambda u: (-u.used / max(1, u.limit), -u.used, u.name)))
    budget += first(domains)
    return FleetView(
        at=at,
        cluster=st.cluster,
        mode=st.mode,
        policy_version=st.policy_version,
        breaker=st.breaker.model_copy(update={"nodes": first(st.breaker.nodes)}),
        budget=tuple(budget),
        budgets_not_shown=len(st.budget) - len(budget),
        containment=st.containment,
        remediations_in_window=st.remediations_in_window,
        out=st.totals.get("out_of_service", len(st.out_of_service)),
        containing=st.totals.get("containing", len(st.containing)),
        left=st.totals.get("left", len(st.left)),
        held=st.totals.get("held", len(st.held)),
        # (each list cut before its lines are drawn: thousands held in a storm, ten shown)
        out_nodes=tuple(_line(g, g.override or "") for g in first(st.out_of_service)),
        containing_nodes=tuple(_line(g) for g in first(st.containing)),
        left_nodes=tuple(_line(g) for g in first(st.left)),
        held_nodes=tuple(
            NodeLine(node=h.node, incident_id=h.incident_id, note=h.reason[:NOTE_CHARS]) for h in first(st.held)
        ),
        domain_incidents=tuple(_domain_line(d) for d in first(st.domain_incidents)),
        whole=cut is None and not st.totals,
    )


def details(v: FleetView, undelivered: list[str]) -> str:
    """The coordinator's current details in the Web UI (markdown), from its view."""

    def names(lines: tuple[NodeLine, ...], count: int) -> str:
        more = f", ... {count - len(lines)} more" if count > len(lines) else ""
        return ", ".join(x.node for x in lines) + more if lines else "-"

    b = v.breaker
    rows = [
        f"mode **{v.mode}**, policy version {v.policy_version}",
        f"breaker: {'TRIPPED: ' + b.why if b.tripped else 'closed'}",
        f"out of service: {v.out} ({names(v.out_nodes, v.out)})",
        f"contained while held: {v.containing} of {v.containment.limit if v.containment else '-'}",
        f"left drained by closed runs (counted): {v.left} ({names(v.left_nodes, v.left)})",
        f"held: {v.held}" + "".join(f"\n  {i + 1}. {h.node}: {h.note}" for i, h in enumerate(v.held_nodes)),
    ]
    if v.held > len(v.held_nodes):
        rows.append(f"  ... and {v.held - len(v.held_nodes)} more (`gpuheal fleet --live`)")
    rows += [f"domain incident {d.node}: {d.note}" for d in v.domain_incidents]
    if undelivered:
        rows.append(f"undelivered: {len(undelivered)} (last: {undelivered[-1]})")
    return "\n".join(rows)
