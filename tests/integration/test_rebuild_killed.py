"""A recreated coordinator's rebuild killed with its worker in a storm (issue 32), on the real
dev server and Slurm, with two worker processes: the other worker takes the rebuild over and the
books hold."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pytest
from temporalio.api.enums.v1.workflow_pb2 import PendingActivityState
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from gpuheal.activities import interface as act
from gpuheal.core import ids
from gpuheal.core.fleet.models import FleetStatus
from gpuheal.core.fleet.policy import BudgetPolicy
from gpuheal.core.models.base import ActionClass
from gpuheal.core.models.incident import ApprovalPolicy
from gpuheal.core.models.result import RemediationResult
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import start_or_join
from gpuheal.workflows.remediation import GpuRemediationWorkflow
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import gpuheal, report, until, worker_env
from tests.integration.production.test_workers import identity
from tests.integration.test_fleet import fleet_status, sized, with_fleet

pytestmark = pytest.mark.integration

ACTIVE, SPARES, STORM, BUDGET = 12, 12, 8, 3
STARTED = PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
TIMED_OUT = {RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED}  # (the SDK's own timeout: CANCELLED)
# What the worker processes run with: the same policy as `settings` below (the coordinator is
# seeded from the first worker's configuration).
POLICY_ENV = {
    "GPUHEAL_BUDGET": str(BUDGET),
    "GPUHEAL_RATE": "1000",
    "GPUHEAL_BREAKER_MAX": "1000",
    "GPUHEAL_HELD_CONTAINMENT": "none",
    "GPUHEAL_APPROVAL_REQUIRED": "replace_node",
    "GPUHEAL_APPROVAL_TIMEOUT_S": "1800",
}


@pytest.mark.timeout(600)  # the takeover waits for the killed attempt's 60 s heartbeat timeout
async def test_a_rebuild_killed_with_its_worker_in_a_storm_is_taken_over_and_the_books_hold(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    """Budget 3, no containment, replacements wait for approval. 8 XID 79s: 3 granted (waiting
    for approval, their grants standing), 5 held. The coordinator is terminated by hand; the next
    report recreates it, and the worker process running its rebuild (`find_open_incidents`, on
    `<queue>-coordinator`) is SIGKILLed while the rebuild runs. The other worker takes it over
    once its heartbeat is missed: the fresh coordinator counts the 3 grants, puts every other
    incident in line, trips saying it was recreated, and Slurm never shows more than 3 drained.
    Once an operator resumes and approves, every incident resolves and nothing is left."""
    sized(slurm, ACTIVE, SPARES)
    settings = with_fleet(
        settings,
        budget=BudgetPolicy(cluster=str(BUDGET), rate=1000, node_cooldown_s=0),
        containment_while_held="none",
        approval=ApprovalPolicy(required_for=(ActionClass.REPLACE_NODE,), timeout_s=1800),
    )
    fleet_id = ids.coordinator_id(settings.cluster or "")
    nodes = [f"gpu{i:02d}" for i in range(1, ACTIVE + 1)]
    drained_at_once: list[int] = []
    sampling = True

    def sample() -> None:  # what Slurm says, all along: nodes drained or down
        while sampling:
            drained_at_once.append(sum(1 for n in slurm.nodes().values() if n.drained or n.state == "down"))

    with worker_env(slurm, settings, **POLICY_ENV):
        workers = [slurm.start_worker(0), slurm.start_worker(1)]
    names = [identity(w.pid) for w in workers]
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        handles = {n: await start_or_join(client, settings, report(settings, n, 79)) for n in nodes[:STORM]}

        async def storm_decided() -> FleetStatus | None:
            try:
                s = await fleet_status(client, settings)
            except RPCError:  # (not started yet, or not through its first task)
                return None
            return s if len(s.out_of_service) == BUDGET and len(s.held) == STORM - BUDGET else None

        before = await until(storm_decided, "3 granted and 5 held", timeout=180)
        granted = sorted(g.node for g in before.out_of_service)

        # Terminated by hand; the next report recreates it. The worker whose cache holds most
        # incidents (a query goes to the worker that ran the run's last task) is stopped
        # (SIGSTOP) meanwhile, so the rebuild's status queries to them wait out their sticky
        # timeout: the rebuild, on the other worker, is still running when seen, and that worker
        # is killed. (A rebuild that ends before it is seen: another round, on another node.)
        victim = survivor = ""
        for node in nodes[STORM:]:
            stopped = await _most_cached(handles.values(), names)
            workers[stopped].send_signal(signal.SIGSTOP)
            await client.get_workflow_handle(fleet_id).terminate("an operator, by hand")
            handles[node] = await start_or_join(client, settings, report(settings, node, 79))
            seen = await until(lambda: _rebuild(client, fleet_id), f"the rebuild after {node}'s report", 120)
            if seen in names:
                victim, i = seen, names.index(seen)
                workers[i].send_signal(signal.SIGKILL)  # mid-activity
                workers[i].wait()
                await asyncio.sleep(0.5)  # (a completion already on its way is written by now)
                if await _rebuild_done_by(client, fleet_id) == (1, victim):
                    # It ended between being seen and the kill (a loaded machine): nothing was
                    # taken over. A fresh process in its place, and another round.
                    with worker_env(slurm, settings, **POLICY_ENV):
                        workers[i] = slurm.start_worker(i)
                    names[i], victim = identity(workers[i].pid), ""
                else:
                    survivor = names[1 - i]
            workers[stopped].send_signal(signal.SIGCONT)
            if victim:
                break
        assert victim, "every rebuild ended before it was seen running"
        recreated = len(handles) - STORM

        async def rebuilt() -> FleetStatus | None:
            """Rebuilt, with every open incident in the books (the newest one's admission may
            have been on the killed worker too: it is asked again after its timeout)."""
            s = await _status(client, settings)
            if s is None:
                return None
            whole = len(s.out_of_service) + len(s.held) == len(handles)
            return s if "coordinator recreated" in s.breaker.why and whole else None

        fleet = await until(rebuilt, "the rebuild taken over by the other worker", timeout=300)
        done_by = await _rebuild_done_by(client, fleet_id)
        assert done_by is not None, "rebuilt, but no rebuild completed in the history"
        attempt, by = done_by
        assert attempt >= 2 and by == survivor, (attempt, by, victim)
        assert fleet.breaker.tripped and sorted(g.node for g in fleet.out_of_service) == granted
        assert sorted(h.node for h in fleet.held) == sorted(set(handles) - set(granted))
        assert len(fleet.held) == STORM - BUDGET + recreated

        resumed = await gpuheal(slurm, settings, "resume", "--operator", "alice", "--reason", "checked them")
        assert resumed.returncode == 0, resumed.stderr
        results = await _approve_until_done(slurm, settings, handles)
        after = await fleet_status(client, settings)
    finally:
        sampling = False
        sampler.join()
        for w in workers:
            w.send_signal(signal.SIGCONT)  # (a stopped process would not stop on TERM)
            Sandbox.stop_process(w)
    assert [r.outcome for r in results.values()] == ["resolved"] * len(handles), results
    assert max(drained_at_once) <= BUDGET and len(drained_at_once) > 20
    assert after.out_of_service == () and after.held == ()


async def _most_cached(handles: Iterable[Any], names: list[str]) -> int:
    """The worker that ran the last workflow task of most of these incidents (its sticky queue is
    where their queries go first)."""
    last: Counter[str] = Counter()
    for handle in handles:
        by = ""
        async for event in handle.fetch_history_events():
            if event.HasField("workflow_task_completed_event_attributes"):
                by = event.workflow_task_completed_event_attributes.identity
        last[by] += 1
    return max(range(len(names)), key=lambda i: last[names[i]])


async def _status(client: Client, settings: Settings) -> FleetStatus | None:
    """The coordinator's status; None while its query times out, right after the kill: a query
    goes to the sticky queue of the worker that ran the run's last task, and the killed worker's
    queue answers nothing until the server gives up on it (CI saw `Timeout expired`, stop 49).
    Any other error is one."""
    try:
        return await fleet_status(client, settings)
    except RPCError as err:
        if err.status in TIMED_OUT or "Timeout expired" in err.message:
            return None
        raise


REBUILDS = {act.FIND_OPEN_INCIDENTS.name, act.FIND_OPEN_INCIDENTS_PACKED.name}  # (the packed one from REBUILD_PACKED)


async def _rebuild(client: Client, fleet_id: str) -> str:
    """The worker identity running the fresh coordinator's rebuild now; "done" once it has
    rebuilt; "" meanwhile (scheduled, or between attempts, or not begun)."""
    try:
        described = await client.get_workflow_handle(fleet_id).describe()
    except RPCError:
        return ""
    for pending in described.raw_description.pending_activities:
        if pending.activity_type.name in REBUILDS:
            return pending.last_worker_identity if pending.state == STARTED else ""
    if described.status is not None and described.status.name == "RUNNING" and await _rebuild_done_by(client, fleet_id):
        return "done"
    return ""


async def _rebuild_done_by(client: Client, fleet_id: str) -> tuple[int, str] | None:
    """The attempt that completed the latest coordinator run's rebuild, and its worker; None
    while it has not completed (its started event is written when the activity closes)."""
    rebuilds: set[int] = set()
    async for event in client.get_workflow_handle(fleet_id).fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            if event.activity_task_scheduled_event_attributes.activity_type.name in REBUILDS:
                rebuilds.add(event.event_id)
        elif event.HasField("activity_task_started_event_attributes"):
            started = event.activity_task_started_event_attributes
            if started.scheduled_event_id in rebuilds:
                return started.attempt, started.identity
    return None


async def _approve_until_done(
    slurm: Sandbox, settings: Settings, handles: dict[str, Any]
) -> dict[str, RemediationResult]:
    """Approve each replacement as it comes to wait (the held ones come as the budget frees),
    until every incident has ended."""
    done: dict[str, RemediationResult] = {}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 600
    while len(done) < len(handles) and loop.time() < deadline:
        for node, handle in handles.items():
            if node in done:
                continue
            described = await handle.describe()
            if described.status is not None and described.status.name != "RUNNING":
                done[node] = await handle.result()
            elif (await handle.query(GpuRemediationWorkflow.status)).awaiting_approval:
                approved = await gpuheal(slurm, settings, "approve", node, "--operator", "alice", "--reason", "go")
                assert approved.returncode == 0, approved.stderr
        await asyncio.sleep(1)
    assert len(done) == len(handles), f"not ended within 600 s: {sorted(set(handles) - set(done))}"
    return {n: done[n] for n in sorted(done)}
