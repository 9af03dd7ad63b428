"""What the coordinator shows: its view (gpuheal.core.fleet.view) in its memo and the UI's
details, drawn anew after state changes. `gpuheal fleet` reads the memo from the server, so it
answers while the coordinator is too busy for a query (a storm)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from gpuheal.core import messages as m
    from gpuheal.core.fleet import view as fleet_view

if TYPE_CHECKING:
    from gpuheal.workflows.coordinator.state import CoordinatorState


def details(c: CoordinatorState) -> None:
    """A state change: the view is drawn anew, by show() once for all the changes of this
    workflow task (a storm's task carries many); coordinators before VIEW draw it here."""
    if c.showing is None:
        workflow.set_current_details(fleet_view.details(view(c), c.undelivered))
    c.changed = True


def view(c: CoordinatorState) -> fleet_view.FleetView:
    return fleet_view.view(fleet_view.status(c.fleet, workflow.now()), workflow.now())


async def show(c: CoordinatorState) -> None:
    """The view in the memo and the UI's details, written anew after state changes, beside the
    loop for the whole run. The memo only when a figure changed (each write is a history event)."""
    shown: dict[str, Any] | None = None
    while True:
        await workflow.wait_condition(lambda: c.changed)
        c.changed = False
        v = view(c)
        workflow.set_current_details(fleet_view.details(v, c.undelivered))
        figures = v.model_dump(exclude={"at"})
        if figures != shown:
            workflow.upsert_memo({m.FLEET_VIEW.key: v})
            shown = figures
