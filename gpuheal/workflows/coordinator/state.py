"""The coordinator run's state, in one object: the cluster's FleetState (every decision takes it,
continue-as-new carries it) and what the handlers queued for the loop to do outside them. The
workflow (workflows/fleet.py) holds one CoordinatorState; its parts beside it take it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from temporalio import workflow

from gpuheal.workflows.coordinator import memo

with workflow.unsafe.imports_passed_through():
    from gpuheal.core.fleet.coordination import Effects
    from gpuheal.core.fleet.models import CoordinatorInput, DomainIncident, FleetState, GrantNotice, Note
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
    reap_now: bool = False  # a grant notice found its incident gone: look at once
    changed: bool = True  # the memo's view is to be written (memo.show)
    showing: asyncio.Future[None] | None = None  # memo.show, for coordinators with VIEW

    def pending(self) -> bool:
        return bool(self.signals or self.notes or self.domains)

    def apply(self, out: Effects) -> None:
        """What a state change asked for, queued for the loop to do (outside the handler)."""
        self.signals += out.signals
        self.notes += out.notes
        self.domains += out.domains
        memo.details(self)

    def carried(self) -> CoordinatorInput:
        """The next run's input: the state, and what is still on its way (it goes on there)."""
        notes = tuple(x for x in self.on_way.values() if not isinstance(x, DomainIncident))
        domains = tuple(x for x in self.on_way.values() if isinstance(x, DomainIncident))
        if self.reaping:  # a look on its way is not carried: the next run looks soon
            self.fleet.reaped_at = None
        return CoordinatorInput(
            cluster=self.fleet.cluster, seed=self.seed, state=self.fleet, notes=notes, domains=domains
        )
