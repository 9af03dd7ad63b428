"""The coordinator run's state, in one object: the cluster's FleetState (every decision takes it,
continue-as-new carries it), what the handlers queued for the loop to do outside them, and what it
shows: its view (gpuheal.core.fleet.view) in its memo and the UI's details, drawn anew after state
changes (`gpuheal fleet` reads the memo from the server, so it answers while the coordinator is too
busy for a query: a storm). The workflow (workflows/fleet.py) holds one CoordinatorState; its parts
beside it take it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from gpuheal.core import messages as m
    from gpuheal.core.fleet import view as fleet_view
    from gpuheal.core.fleet.coordination import Effects
    from gpuheal.core.fleet.models import CoordinatorInput, DomainIncident, FleetState, GrantNotice, Note, OpenDomains
    from gpuheal.core.fleet.policy import FleetPolicy


@dataclass
class CoordinatorState:
    fleet: FleetState
    seed: FleetPolicy  # the worker's configured policy it was started with, carried as it came
    signals: list[tuple[str, GrantNotice]] = field(default_factory=list)  # to held incidents
    notes: list[Note] = field(default_factory=list)  # to the operators
    domains: list[DomainIncident] = field(default_factory=list)  # domain incidents to open
    on_way: dict[asyncio.Future[None], Note | DomainIncident] = field(default_factory=dict)  # beside the loop
    undelivered: list[str] = field(default_factory=list)  # what could not be done, for the UI's details
    reaping: bool = False  # a look for closed runs is on its way
    look: asyncio.Future[None] | None = None
    # A fresh start may be a recreation: nothing is granted until it has rebuilt (reconcile.rebuild).
    rebuilding: bool = False
    rebuild_failing: bool = False  # its listing failed once: the breaker is tripped, updates wait no more
    look_again: asyncio.Future[None] | None = None  # a rebuild's second look (reconcile.VISIBILITY_LAG_S)
    reap_now: bool = False  # a grant notice found its incident gone: look at once
    changed: bool = True  # the memo's view is to be written (show)
    showing: asyncio.Future[None] | None = None  # show, for coordinators with VIEW
    packed: bool = False  # from PACKED on: compact books, carried compressed, shorter runs
    publishes: bool = False  # from PUBLISHES on: the policy and open domains in the memo too

    def pending(self) -> bool:
        return bool(self.signals or self.notes or self.domains)

    def apply(self, out: Effects) -> None:
        """What a state change asked for, queued for the loop to do (outside the handler)."""
        self.signals += out.signals
        self.notes += out.notes
        self.domains += out.domains
        self.view_changed()

    def carried(self) -> CoordinatorInput:
        """The next run's input: the state, and what is still on its way (it goes on there)."""
        notes = tuple(x for x in self.on_way.values() if not isinstance(x, DomainIncident))
        domains = tuple(x for x in self.on_way.values() if isinstance(x, DomainIncident))
        if self.reaping:  # a look on its way is not carried: the next run looks soon
            self.fleet.reaped_at = None
        return CoordinatorInput(
            cluster=self.fleet.cluster, seed=self.seed, state=self.fleet, notes=notes, domains=domains
        )

    def view_changed(self) -> None:
        """A state change: the view is drawn anew, by show() once for all the changes of this
        workflow task (a storm's task carries many); coordinators before VIEW draw it here."""
        if self.showing is None:
            workflow.set_current_details(fleet_view.details(self.view(), self.undelivered))
        self.changed = True

    def view(self) -> fleet_view.FleetView:
        return fleet_view.view(fleet_view.status(self.fleet, workflow.now()), workflow.now())

    async def show(self) -> None:
        """The view in the memo and the UI's details, written anew after state changes, beside the
        loop for the whole run. The memo only when a figure changed (each write is a history event)."""
        shown: dict[str, Any] | None = None
        published: dict[str, Any] = {}
        while True:
            await workflow.wait_condition(lambda: self.changed)
            self.changed = False
            v = self.view()
            workflow.set_current_details(fleet_view.details(v, self.undelivered))
            figures = v.model_dump(exclude={"at"})
            if figures != shown:
                workflow.upsert_memo({m.FLEET_VIEW.key: v})
                shown = figures
            if self.publishes:
                levers = self.levers()
                changed = {k: v for k, v in levers.items() if published.get(k) != v}
                if changed:  # rarely: a policy change, a domain incident opened or decided
                    workflow.upsert_memo(dict(changed))
                    published.update(changed)

    def levers(self) -> dict[str, Any]:
        """What the operators' levers read (gpuheal.cli.policy, gpuheal.cli.fleet), by memo key."""
        domains = tuple(d for d in self.fleet.domain_incidents.values() if not d.decided)
        return {m.FLEET_POLICY_MEMO.key: self.fleet.policy, m.FLEET_DOMAINS.key: OpenDomains(incidents=domains)}
