"""The coordinator run's state, in one object: the cluster's FleetState (every decision takes it,
continue-as-new carries it), what the handlers queued for the loop to do outside them, and what it
shows: its view (gpuheal.core.fleet.view) in its memo and the UI's details, drawn anew after state
changes (`gpuheal fleet` reads the memo from the server, so it answers while the coordinator is too
busy for a query: a storm). The workflow (workflows/fleet.py) holds one CoordinatorState; its parts
beside it take it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import CancelledError, FailureError

from gpuheal.workflows.coordinator.versions import MEMO_EVERY_S, MEMO_PACED, PACK_BESIDE, PACK_TIMEOUT_S

with workflow.unsafe.imports_passed_through():
    from gpuheal.activities import interface as act
    from gpuheal.core import messages as m
    from gpuheal.core.fleet import packing
    from gpuheal.core.fleet import view as fleet_view
    from gpuheal.core.fleet.coordination import Effects
    from gpuheal.core.fleet.models import (
        CoordinatorInput,
        DomainIncident,
        FleetState,
        GrantNotice,
        Note,
        OpenDomain,
        OpenDomains,
    )
    from gpuheal.core.fleet.policy import FleetPolicy


CARRY_AGAIN_EVENTS = 500  # after a state too big to carry: history events before it tries again


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
    borrowed_waiting: tuple[str, ...] = ()  # crashed runs' borrowed nodes last seen waiting for jobs (told once)
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
    own_queue: str | None = None  # from OWN_QUEUE on: where its activities go (None: its own task queue)
    on_own_queue: bool = False  # from OWN_WORKFLOW_QUEUE on: its next run runs on its own queue
    move_to: str | None = None  # ... and, started on the cluster's queue, where its next run goes
    carry_after: int = 0  # history length before which it does not try to carry on again (too big)
    pack_here: bool = False  # a pack beside the task was not carried: the next is packed in the task

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
            cluster=self.fleet.cluster,
            seed=self.seed,
            state=self.fleet,
            notes=notes,
            domains=domains,
            on_own_queue=self.on_own_queue,
        )

    async def pack_carried(self) -> bytes | None:
        """pack(); from PACK_BESIDE the state is compressed beside the task, by a local activity
        that holds no thread of the task's, whatever its size (a branch on the size would tie a
        history's replay to how the state happens to serialize). What it packed is carried only
        if nothing reached the run meanwhile: the task stays open while it packs, and an event
        (an update, a signal, an activity's end) reaches a run only in a new task, which grows
        its history; only a pack outlasting the task's heartbeat (80 % of its timeout) lets one
        in. Else, if it failed, or past packing.BESIDE_MOST (nothing comes back then), not this
        time: the run packs in its task, with the quick codec, at its next task."""
        if not workflow.patched(PACK_BESIDE):
            return self.pack()
        if self.pack_here:
            return self.pack(quick=True)
        text = packing.prepare(self.fleet, workflow.now())
        before = workflow.info().get_current_history_length()
        try:
            data: bytes = await workflow.execute_local_activity(
                act.PACK_FLEET_STATE.name,
                text,
                result_type=bytes,
                start_to_close_timeout=timedelta(seconds=PACK_TIMEOUT_S),
                retry_policy=RetryPolicy(maximum_attempts=1),  # (failed: packed in the task instead)
                summary=f"packing the state to carry on ({len(text) // 1024} KB of JSON)",
            )
        except FailureError as err:  # (an application failure comes as itself; a timeout or cancel wrapped)
            if isinstance(err, CancelledError) or isinstance(err.cause, CancelledError):
                raise
            data = b""
        moved = workflow.info().get_current_history_length() != before
        if data.startswith(packing.MAGIC) and len(data) <= packing.BESIDE_MOST and not moved:
            return data
        self.moved_while_packing()
        return None

    def moved_while_packing(self) -> None:
        """What was packed beside the task is not carried: the next try packs in the task, and
        not in this one (it tries again once its history grows). Its result is already in this
        task's completion (a marker), and with a continue-as-new beside it the completion could
        pass gRPC's 4 MiB (design 014)."""
        self.pack_here = True
        self.carry_after = workflow.info().get_current_history_length() + 1

    def pack(self, quick: bool = False) -> bytes | None:
        """The state to carry on (gpuheal.core.fleet.packing), or None: not this time. Shed to fit
        (the repeat window's oldest days forgotten): the operators are told first, and it carries
        on once that notice is on its way. Too big even so: never handed to Temporal (it would
        terminate the run); this run goes on and tries again CARRY_AGAIN_EVENTS later."""
        packed = packing.pack(self.fleet, workflow.now(), quick=quick)
        if not packed.fits():
            self.carry_after = workflow.info().get_current_history_length() + CARRY_AGAIN_EVENTS
            text = (
                f"the coordinator's state is {len(packed.data) // 1024} KB packed, more than it may carry across "
                f"continue-as-new ({packing.MOST_BYTES // 1024} KB): it goes on in this run (its history grows); "
                "`gpuheal fleet` shows what it holds"
            )
            self.apply(Effects(notes=[("state_too_big", "critical", text)]))
            return None
        if packed.shed_days:
            text = (
                f"the coordinator forgot the oldest {packed.shed_days} day(s) of its repeat window to carry its "
                "state on: repeat offenders are counted over a shorter window until it refills"
            )
            self.apply(Effects(notes=[("repeat_window_shortened", "critical", text)]))
            return None
        return packed.data

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
        loop for the whole run. The memo only when a figure changed (each write is a history event),
        and from MEMO_PACED at most every MEMO_EVERY_S: what changes meanwhile is drawn together."""
        shown: dict[str, Any] | None = None
        published: dict[str, Any] = {}
        paced = workflow.patched(MEMO_PACED)
        written: datetime | None = None
        while True:
            await workflow.wait_condition(lambda: self.changed)
            self.changed = False
            v = self.view()
            workflow.set_current_details(fleet_view.details(v, self.undelivered))
            figures = v.model_dump(exclude={"at"})
            if paced and self.publishes:  # the levers first, never paced (a policy read right after a change)
                self._publish(published)
            if figures != shown:
                due = written + timedelta(seconds=MEMO_EVERY_S) - workflow.now() if paced and written else None
                if due is not None and due > timedelta(0):
                    await workflow.sleep(due, summary="the fleet view: written at most once a second")
                    self.changed = True  # drawn anew now, with what changed meanwhile
                    continue
                workflow.upsert_memo({m.FLEET_VIEW.key: v})
                shown, written = figures, workflow.now()
            if self.publishes and not paced:
                self._publish(published)

    def _publish(self, published: dict[str, Any]) -> None:
        """The operators' levers' keys that changed (rarely: a policy change, a domain incident
        opened or decided), written at once."""
        levers = self.levers()
        changed = {k: v for k, v in levers.items() if published.get(k) != v}
        if changed:
            workflow.upsert_memo(dict(changed))
            published.update(changed)

    def levers(self) -> dict[str, Any]:
        """What the operators' levers read (gpuheal.cli.policy, gpuheal.cli.fleet, gpuheal.cli.versions),
        by memo key: the policy, the open domain incidents (a line each, not their nodes), and the
        format the coordinator carries its state in (a rollout to a build that cannot read it is refused)."""
        domains = tuple(
            OpenDomain(domain=d.domain, incident_id=d.incident_id, nodes=len(d.nodes))
            for d in self.fleet.domain_incidents.values()
            if not d.decided
        )
        return {
            m.FLEET_POLICY_MEMO.key: self.fleet.policy,
            m.FLEET_DOMAINS.key: OpenDomains(incidents=domains),
            m.FLEET_STATE_FORMAT.key: packing.WRITES,
        }
