"""Fleet safety on the real Temporal dev server and Slurm sandbox (and Kubernetes where a step
involves it): a disruption budget under a storm, a circuit breaker that survives a worker kill
and a server restart, domain escalation, observe mode, repeat offenders, re-sent alerts, grants
never counted twice, and one policy whoever sends the report."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from typing import Any, cast

import pytest
from temporalio.client import Client
from temporalio.service import RPCError

from gpuheal.core import ids, queries
from gpuheal.core import search_attributes as sa
from gpuheal.core.fleet import reaping
from gpuheal.core.fleet.models import CapacityRequest, FleetStatus, Placement
from gpuheal.core.fleet.policy import BudgetPolicy, EscalationPolicy, FleetPolicy, RepeatPolicy
from gpuheal.core.messages import FLEET_REQUEST_CAPACITY, FLEET_STATUS, INCIDENT
from gpuheal.core.models.base import ActionClass, Stage
from gpuheal.core.models.incident import ApprovalPolicy
from gpuheal.core.models.result import RemediationResult
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import start_or_join
from gpuheal.workers.main import make_worker
from gpuheal.workflows.remediation import GpuRemediationWorkflow
from infra.sandbox.kube import KubeSandbox
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import (
    gpuheal,
    held_behind_paused_breaker,
    nodes_in_service,
    report,
    slurmctld_log,
    until,
    worker_env,
)

pytestmark = pytest.mark.integration


def with_fleet(settings: Settings, **policy: Any) -> Settings:
    """The test's roomy policy (conftest), with what this test is about."""
    return settings.model_copy(update={"fleet": settings.fleet.model_copy(update=policy)})


async def fleet_status(client: Client, settings: Settings) -> FleetStatus:
    return await FLEET_STATUS.ask(client.get_workflow_handle(ids.coordinator_id(settings.cluster or "")))


def sized(slurm: Sandbox, active: int, spares: int) -> Sandbox:
    """Slurm restarted with `active` nodes in service and `spares` spares."""
    slurm.extra_env.update({"GPUHEAL_SLURM_ACTIVE": str(active), "GPUHEAL_SLURM_SPARES": str(spares)})
    try:
        slurm.start_slurm(clean=True)
    finally:
        slurm.extra_env.pop("GPUHEAL_SLURM_ACTIVE")
        slurm.extra_env.pop("GPUHEAL_SLURM_SPARES")
    return slurm


@pytest.fixture
def big(slurm: Sandbox) -> Sandbox:
    """12 nodes in service and 10 spares."""
    return sized(slurm, 12, 10)


async def test_a_storm_never_takes_more_than_the_budget(big: Sandbox, settings: Settings, client: Client) -> None:
    # Held incidents touch nothing here, so Slurm's own states show exactly what the budget let
    # out (with the default containment, held nodes are drained too: nothing new lands on them,
    # their jobs run on, nothing is replaced; the breaker test below runs that way).
    settings = with_fleet(
        settings, budget=BudgetPolicy(cluster="3", rate=1000, node_cooldown_s=0), containment_while_held="none"
    )
    out_at_once: list[int] = []
    sampling = True

    def sample() -> None:  # what Slurm says, every 0.2 s: nodes drained or down
        while sampling:
            states = big.nodes()
            out_at_once.append(sum(1 for n in states.values() if n.drained or n.state == "down"))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    # 10 replace-class reports at once, all waiting when the worker starts: the coordinator
    # decides them together (started one by one beside a running worker, on a loaded server the
    # first granted could finish before the last arrived, and fewer than 5 were ever held at once).
    handles = [await start_or_join(client, settings, report(settings, f"gpu{i:02d}", 79)) for i in range(1, 11)]
    try:
        async with make_worker(client, settings):

            async def held() -> tuple[list[Any], FleetStatus] | None:
                """At least 5 held, as the incidents and the coordinator both say."""
                found = []
                for h in handles:
                    status = await h.query(GpuRemediationWorkflow.status)
                    if status.stage == Stage.HELD:
                        found.append(status)
                fleet = await fleet_status(client, settings)
                return (found, fleet) if len(found) >= 5 and len(fleet.held) >= 5 else None

            waiting, fleet = await until(held, "incidents held by the budget")
            reason = "disruption budget: 3 of 3 nodes out of service (cluster)"
            assert all(reason in s.done[-1] or s.held for s in waiting)
            assert len(fleet.out_of_service) <= 3 and fleet.held[0].reason == reason
            gathering = asyncio.gather(*(h.result() for h in handles))
            results: list[RemediationResult] = await asyncio.wait_for(gathering, 240)
            after = await fleet_status(client, settings)
    finally:
        sampling = False
        sampler.join()
    assert [r.outcome for r in results] == ["resolved"] * 10  # all, in the end, as the budget freed
    assert max(out_at_once) <= 3 and len(out_at_once) > 20
    assert sum(1 for r in results if any(s.stage == Stage.HELD for s in r.stages)) >= 5
    assert after.out_of_service == () and after.held == ()


@pytest.fixture
def paired(slurm: Sandbox) -> Sandbox:
    """12 nodes in service and a spare for each."""
    return sized(slurm, 12, 12)


async def test_every_node_failing_at_once_with_the_defaults_drains_no_more_than_the_bounds(
    paired: Sandbox, settings: Settings, client: Client
) -> None:
    """A false alert on every node in service (a bad rule, an agent bug), with the default
    policy: at no time does Slurm show more drained than the budget plus the containment bound
    (10 % each of the cluster, at least one each), the breaker trips and from then on nothing new
    is drained, `gpuheal fleet` shows the containment bound, and once an operator resumes, every
    incident ends resolved."""
    settings = settings.model_copy(update={"fleet": FleetPolicy()})  # the defaults, as shipped
    out_at_once: list[int] = []
    sampling = True

    def sample() -> None:
        while sampling:
            out_at_once.append(sum(1 for n in paired.nodes().values() if n.drained or n.state == "down"))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    nodes = sorted(nodes_in_service(paired))
    assert len(nodes) == 12
    try:
        async with make_worker(client, settings):
            handles = [await start_or_join(client, settings, report(settings, n, 79)) for n in nodes]

            async def settled() -> FleetStatus | None:
                stages = [(await h.query(GpuRemediationWorkflow.status)).stage for h in handles]
                s = await fleet_status(client, settings)
                # Those granted before the trip are taken back at their check before a
                # replacement (held again), unless they were past it already (then they finish).
                past = sum(1 for st in stages if st in (Stage.HELD, Stage.DONE, Stage.CLOSE))
                return s if s.breaker.tripped and past == len(nodes) and len(s.held) >= len(nodes) - 2 else None

            fleet = await until(settled, "all held behind the tripped breaker", timeout=120)
            # The bounds as the coordinator computes them, on the cluster's size as Slurm lists it.
            assert fleet.containment is not None
            bound = fleet.budget[0].limit + fleet.containment.limit
            drained_then = sum(1 for n in paired.nodes().values() if n.drained)
            await asyncio.sleep(10)  # nothing new drained while tripped
            assert sum(1 for n in paired.nodes().values() if n.drained) == drained_then
            shown = await gpuheal(paired, settings, "fleet")
            assert shown.returncode == 0, shown.stderr
            assert fleet.containment is not None and f"of {fleet.containment.limit}" in shown.stdout
            resumed = await gpuheal(paired, settings, "resume", "--operator", "alice", "--reason", "rule fixed")
            assert resumed.returncode == 0, resumed.stderr
            results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 400)
    finally:
        sampling = False
        sampler.join()
    assert max(out_at_once) <= bound, f"{max(out_at_once)} out at once (bound {bound})"
    assert len(out_at_once) > 50
    assert [r.outcome for r in results] == ["resolved"] * len(nodes)


async def test_the_breaker_trips_holds_survives_a_kill_and_a_restart_and_resumes_only_by_hand(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    with worker_env(slurm, settings, GPUHEAL_BREAKER_MAX="2"):
        worker = slurm.start_worker()
        try:
            handles = [
                await start_or_join(client, settings, report(settings, n, 48)) for n in ("gpu01", "gpu02", "gpu03")
            ]

            async def tripped() -> FleetStatus | None:
                """The coordinator once the line has settled: the breaker tripped and all three
                held. The two admitted before it tripped may have been granted first; the grant
                is taken back at the check before a replacement, so each ends up held, in the
                order it got there."""
                try:
                    stages = [(await h.query(GpuRemediationWorkflow.status)).stage for h in handles]
                    s = await fleet_status(client, settings)
                except Exception:
                    return None
                settled = stages == [Stage.HELD] * 3 and len(s.held) == 3
                return s if settled and s.breaker.tripped else None

            fleet = await until(tripped, "the breaker to trip")
            assert "3 new incidents within 300 s (more than 2)" in fleet.breaker.why
            assert set(fleet.breaker.nodes) == {"gpu01", "gpu02", "gpu03"}
            held = [h.incident_id for h in fleet.held]

            # Nothing new is drained while the breaker is tripped: the one admitted last (its
            # arrival tripped it) is held untouched and says why. The others were drained before
            # the trip (by their remediation, or contained while held by the budget), and their
            # grants taken back before any replacement. Nothing replaced.
            async def untouched() -> list[str] | None:
                states, found = slurm.nodes(), []
                for h in fleet.held:
                    if states[h.node].drained:
                        continue
                    incident = client.get_workflow_handle(h.incident_id)
                    held_for = (await incident.query(GpuRemediationWorkflow.status)).held
                    if held_for is None or "not contained: circuit breaker tripped" not in held_for:
                        return None
                    found.append(h.node)
                return found or None

            left = await until(untouched, "the last incident held untouched, saying why")
            await asyncio.sleep(2)  # and it stays so
            assert not any(slurm.nodes()[n].drained for n in left)
            assert nodes_in_service(slurm) == {"gpu01", "gpu02", "gpu03"}  # no spare started
            # A kill and a server restart: the breaker stays tripped, the held stay held.
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            slurm.stop_temporal()
            slurm.start_temporal()
            worker = slurm.start_worker()
            await asyncio.sleep(3)
            after = await until(tripped, "the coordinator after the restart")
            assert after.breaker.why == fleet.breaker.why and [h.incident_id for h in after.held] == held
            for h in handles:
                if h.id in held:
                    assert (await h.query(GpuRemediationWorkflow.status)).stage == Stage.HELD
            resumed = await gpuheal(
                slurm, settings, "resume", "--operator", "alice", "--reason", "false alarm: one rack PDU"
            )
            assert resumed.returncode == 0, resumed.stderr
            assert "resumed by alice" in resumed.stdout
            results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 180)
            assert not (await fleet_status(client, settings)).breaker.tripped  # (a query needs the worker)
        finally:
            Sandbox.stop_process(worker)
    assert [r.outcome for r in results] == ["resolved"] * 3


async def test_observe_mode_touches_nothing_and_records_what_it_would_do(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    settings = with_fleet(settings, mode="observe")
    job = slurm.submit_training("watched")
    node = await asyncio.to_thread(slurm.wait_for_step, job, 3)
    before = slurmctld_log(slurm)
    async with make_worker(client, settings):
        result = await asyncio.wait_for(
            (await start_or_join(client, settings, report(settings, node, 79))).result(), 60
        )
    after = slurmctld_log(slurm)[len(before) :]
    assert result.outcome == "observed"
    assert "update_node" not in after and "Requeu" not in after and "kill_job" not in after, after
    # The only job updates are the training job's own progress comments (the progress contract).
    updates = [line for line in after.splitlines() if "] _update_job: " in line]
    assert all("setting comment to gpuheal step=" in line for line in updates), updates
    observe = next(s for s in result.stages if s.stage == Stage.OBSERVE)
    assert f"would drain {node}" in observe.outcome and f"would requeue job {job}" in observe.outcome
    assert f"would replace {node}" in observe.outcome
    j = slurm.job(job)
    assert j is not None and j.state == "RUNNING" and j.restart_count == 0 and not slurm.nodes()[node].drained


async def test_the_third_incident_on_a_node_within_the_window_replaces_it(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    settings = with_fleet(settings, repeat=RepeatPolicy(incidents=3, window_s=7 * 86400))
    results = []
    async with make_worker(client, settings):
        for _ in range(3):
            handle = await start_or_join(client, settings, report(settings, "gpu03", 48, gpu=1))
            results.append(await asyncio.wait_for(handle.result(), 90))
    actions = [r.action for r in results]
    assert actions == [ActionClass.RESET_GPU, ActionClass.RESET_GPU, ActionClass.REPLACE_NODE], [
        r.reason for r in results
    ]
    assert "repeat offender: 3 incidents on gpu03 within 7 days" in results[2].reason


async def test_the_same_alert_posted_again_after_its_incident_closed_starts_nothing(
    webhook: Sandbox, settings: Settings, client: Client
) -> None:
    settings = with_fleet(settings, duplicate_window_s=600)
    payload = webhook.alertmanager_payload("gpu02", 48, cluster=settings.cluster)
    async with make_worker(client, settings):
        status, body = await asyncio.to_thread(webhook.post_alert, payload)
        assert status == 200, body
        incident = body["started_or_joined"][0]["workflow_id"]  # type: ignore[index]
        await asyncio.wait_for(client.get_workflow_handle(incident).result(), 90)
        await asyncio.sleep(1)
        status, again = await asyncio.to_thread(webhook.post_alert, payload)  # Alertmanager's repeat_interval
    assert status == 200 and again["started_or_joined"] == []
    (handled,) = cast("list[dict[str, str]]", again["already_handled"])
    assert handled["by"] == incident and "gpu02" in handled["report"]
    count = await client.count_workflows(
        queries.where(queries.of_type(INCIDENT), queries.eq(sa.CLUSTER, settings.cluster or ""))
    )
    assert count.count == 1


async def test_a_grant_is_counted_once_whatever_the_retries_and_kills(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    """Granted, then slurmctld stops answering (so the incident cannot drain yet), the worker is
    SIGKILLed, and the same capacity request arrives again as a retried activity would send it:
    the grant stands once, and is given back once."""
    with worker_env(slurm, settings, GPUHEAL_HELD_CONTAINMENT="none"):
        worker = slurm.start_worker()
        ctld = int((slurm.slurm_dir / "run" / "slurmctld.pid").read_text())
        try:
            handle = await held_behind_paused_breaker(slurm, settings, client, "gpu01")
            os.kill(ctld, signal.SIGSTOP)  # from here the incident cannot reach Slurm: it cannot drain
            resumed = await gpuheal(slurm, settings, "resume", "--operator", "alice", "--reason", "go")
            assert resumed.returncode == 0, resumed.stderr

            async def granted() -> FleetStatus | None:
                s = await fleet_status(client, settings)
                return s if [g.incident_id for g in s.out_of_service] == [handle.id] else None

            await until(granted, "the grant")
            await asyncio.sleep(1)
            assert not drained_by(slurm, "gpu01", handle.id)
            worker.send_signal(signal.SIGKILL)  # between the grant and the drain
            worker.wait()
            worker = slurm.start_worker()

            async def answers() -> FleetStatus | None:
                """A query right after the kill may wait out the dead worker's sticky queue
                (longer than a query may take): asked again until the new worker answers."""
                try:
                    return await fleet_status(client, settings)
                except RPCError:
                    return None

            fleet = await until(answers, "the coordinator after the restart")
            grant = fleet.out_of_service[0]
            again = await FLEET_REQUEST_CAPACITY.execute(
                client.get_workflow_handle(ids.coordinator_id(settings.cluster or "")),
                CapacityRequest(
                    cluster=settings.cluster or "",
                    incident_id=handle.id,
                    placement=Placement(node="gpu01", cluster_size=3, pool=grant.pool),
                    action=ActionClass.RESET_GPU,
                ),
            )
            assert again.granted and again.already
            after = await fleet_status(client, settings)
            assert [g.incident_id for g in after.out_of_service] == [handle.id]  # once
            assert after.remediations_in_window == 2  # gpu03's and gpu01's, each once
            os.kill(ctld, signal.SIGCONT)
            result = await asyncio.wait_for(handle.result(), 120)
            end = await fleet_status(client, settings)
        finally:
            os.kill(ctld, signal.SIGCONT)
            Sandbox.stop_process(worker)
    assert result.outcome == "resolved"
    assert any(st.stage == Stage.HELD for st in result.stages) and drained_by(slurm, "gpu01", handle.id)
    assert end.out_of_service == () and end.remediations_in_window == 2


def drained_by(sb: Sandbox, node: str, incident_id: str) -> bool:
    """Whether slurmctld has drained `node` for the incident (its log: it can be read while
    slurmctld is stopped)."""
    return f"update_node: node {node} reason set to: {incident_id}" in slurmctld_log(sb)


async def _awaiting(handle: Any) -> bool:
    return bool((await handle.query(GpuRemediationWorkflow.status)).awaiting_approval)


async def test_a_cli_report_runs_under_the_clusters_approval_policy(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    """The worker (the cluster) asks for approval of replacements; a report typed in a shell
    without that setting still waits for a human."""
    settings = with_fleet(settings, approval=ApprovalPolicy(required_for=(ActionClass.REPLACE_NODE,), timeout_s=600))
    async with make_worker(client, settings):
        typed = await gpuheal(slurm, settings, "report", "--node", "gpu02", "--xid", "79", GPUHEAL_APPROVAL_REQUIRED="")
        assert typed.returncode == 0, typed.stderr
        handle = client.get_workflow_handle_for(
            GpuRemediationWorkflow.run, ids.incident_id(settings.cluster or "", "gpu02")
        )
        await until(lambda: _awaiting(handle), "the approval wait")
        aborted = await gpuheal(slurm, settings, "abort", "gpu02", "--operator", "carol", "--reason", "not today")
        assert aborted.returncode == 0, aborted.stderr
        result = await asyncio.wait_for(handle.result(), 60)
    assert result.outcome == "aborted" and result.policy_version == 1


@pytest.mark.parametrize("decision", ["dismiss", "release"])
async def test_half_a_rack_is_one_domain_incident_and_the_operators_decision_ends_it(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings, client: Client, decision: str
) -> None:
    """Dismissed: the rack is handled as one (no replacement each). Released (the switch ruled
    out): the node incidents go on one by one, within the budget, and are replaced."""
    slurm.extra_env["GPUHEAL_SLURM_ACTIVE"] = "4"
    try:
        slurm.start_slurm(clean=True)
    finally:
        slurm.extra_env.pop("GPUHEAL_SLURM_ACTIVE")
    kube.reset_nodes(["gpu01", "gpu02", "gpu03", "gpu04"])
    core: Any = kube.core()
    for n in ("gpu01", "gpu02", "gpu03", "gpu04"):
        core.patch_node(n, {"metadata": {"labels": {"gpuheal.io/rack": "r1"}}})
    settings = with_fleet(k8s_settings, escalation=EscalationPolicy(domain_share=0.5, window_s=300, min_nodes=2))
    async with make_worker(client, settings):
        a = await start_or_join(client, settings, report(settings, "gpu01", 79))
        b = await start_or_join(client, settings, report(settings, "gpu02", 79))

        async def escalated() -> FleetStatus | None:
            try:
                s = await fleet_status(client, settings)
            except RPCError:  # no coordinator yet
                return None
            return s if s.domain_incidents and len(s.held) == 2 else None

        fleet = await until(escalated, "a domain incident holding both", timeout=90)
        (domain,) = fleet.domain_incidents
        assert domain.domain == "gpuheal.io/rack=r1" and set(domain.nodes) == {"gpu01", "gpu02"}
        assert all("domain incident" in h.reason for h in fleet.held)
        decided = await gpuheal(
            slurm, settings, "domain", decision, "gpuheal.io/rack=r1", "--operator", "dana", "--reason", "looked at it"
        )
        assert decided.returncode == 0, decided.stderr
        results = await asyncio.wait_for(asyncio.gather(a.result(), b.result()), 180)
        after = await fleet_status(client, settings)
    if decision == "dismiss":
        assert [r.outcome for r in results] == ["escalated", "escalated"]
        assert all(r.replacement_node is None for r in results)  # one domain incident, not two replacements
        assert domain.incident_id in results[0].node_detail
    else:
        assert [r.outcome for r in results] == ["resolved", "resolved"]
        assert all(r.replacement_node is not None for r in results)
    assert [d.decided for d in after.domain_incidents] == [decision] and not after.held


async def test_a_coordinator_terminated_by_hand_is_rebuilt_from_the_open_incidents_and_starts_tripped(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    """One incident granted (waiting for approval of its replacement), one held by the budget
    and contained; the coordinator is terminated by hand. The next incident starts a fresh one,
    which finds both open, counts the grant and the containment, holds the newcomer untouched
    behind a tripped breaker, and says why; once resumed, the line moves as before."""
    settings = with_fleet(
        settings,
        budget=BudgetPolicy(cluster="1", node_cooldown_s=0),
        containment_limit="1",
        approval=ApprovalPolicy(required_for=(ActionClass.REPLACE_NODE,), timeout_s=600),
    )
    fleet_id = ids.coordinator_id(settings.cluster or "")
    async with make_worker(client, settings):
        first = await start_or_join(client, settings, report(settings, "gpu01", 79))
        await until(lambda: _awaiting(first), "gpu01 granted, waiting for approval")
        second = await start_or_join(client, settings, report(settings, "gpu02", 79))

        async def contained() -> bool:
            status = await second.query(GpuRemediationWorkflow.status)
            return status.stage == Stage.HELD and slurm.nodes()["gpu02"].drained

        await until(contained, "gpu02 held and contained")
        await client.get_workflow_handle(fleet_id).terminate("an operator, by hand")
        third = await start_or_join(client, settings, report(settings, "gpu03", 79))

        async def rebuilt() -> FleetStatus | None:
            try:
                s = await fleet_status(client, settings)
            except RPCError:
                return None
            return s if s.breaker.tripped and len(s.held) == 2 else None

        fleet = await until(rebuilt, "the recreated coordinator, tripped, with its line rebuilt")
        assert "coordinator recreated (its earlier run: Terminated at" in fleet.breaker.why
        assert "with 2 open incidents" in fleet.breaker.why
        assert [g.node for g in fleet.out_of_service] == ["gpu01"]
        assert [g.node for g in fleet.containing] == ["gpu02"]
        assert [h.node for h in fleet.held] == ["gpu02", "gpu03"]
        await asyncio.sleep(2)
        assert not slurm.nodes()["gpu03"].drained  # the newcomer is untouched behind the breaker
        resumed = await gpuheal(slurm, settings, "resume", "--operator", "alice", "--reason", "checked the three")
        assert resumed.returncode == 0, resumed.stderr
        for handle, node in ((first, "gpu01"), (second, "gpu02"), (third, "gpu03")):
            await until(lambda h=handle: _awaiting(h), f"{node} waiting for approval", timeout=120)
            approved = await gpuheal(slurm, settings, "approve", node, "--operator", "alice", "--reason", "go")
            assert approved.returncode == 0, approved.stderr
            assert (await asyncio.wait_for(handle.result(), 120)).outcome == "resolved"
        end = await fleet_status(client, settings)
    assert end.out_of_service == () and end.held == () and end.containing == ()


async def test_a_node_returned_with_the_printed_command_lets_the_held_incident_go_at_once(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    """Budget one. gpu01's incident is aborted after its drain: it ends with gpu01 drained and
    prints the command to return it. gpu02's XID 79 is held (gpu01 still counts). An operator
    runs exactly the printed command: Slurm resumes gpu01, the books free it once a look sees it
    back (RETURN_LOOK_S after the return), and gpu02 goes within seconds, not at the next look for
    closed runs (300 s)."""
    settings = with_fleet(
        settings,
        budget=BudgetPolicy(cluster="1", node_cooldown_s=0),
        containment_limit="0",
        approval=ApprovalPolicy(required_for=(ActionClass.REPLACE_NODE,), timeout_s=600),
    )
    async with make_worker(client, settings):
        first = await start_or_join(client, settings, report(settings, "gpu01", 79))
        await until(lambda: _awaiting(first), "gpu01 granted, waiting for approval")
        aborted = await gpuheal(slurm, settings, "abort", "gpu01", "--operator", "alice", "--reason", "vendor first")
        assert aborted.returncode == 0, aborted.stderr
        result = cast(RemediationResult, await asyncio.wait_for(first.result(), 60))
        assert result.outcome == "aborted" and slurm.nodes()["gpu01"].drained
        printed = result.node_detail.split("return it with: ")[1]
        assert printed == "gpuheal return gpu01 --operator NAME --reason TEXT"
        second = await start_or_join(client, settings, report(settings, "gpu02", 79))

        async def held() -> bool:
            return (await second.query(GpuRemediationWorkflow.status)).stage == Stage.HELD

        await until(held, "gpu02 held: gpu01 still drained, and counted")
        assert [g.node for g in (await fleet_status(client, settings)).left] == ["gpu01"]
        argv = printed.replace("NAME", "bob").replace("TEXT", "checked").split()[1:]
        returned = await gpuheal(slurm, settings, *argv)
        assert returned.returncode == 0, returned.stderr
        assert "gpu01 counted until Slurm shows it back" in returned.stdout
        assert "gpu01 resumed in Slurm" in returned.stdout
        assert not slurm.nodes()["gpu01"].drained

        async def went() -> bool:
            return bool((await second.query(GpuRemediationWorkflow.status)).awaiting_approval)

        # (the look 5 s after the return; should the resume land after it, the held incident's next)
        await until(
            went, "gpu02 granted within seconds", timeout=reaping.RETURN_LOOK_S + reaping.LEFT_CHECK_EVERY_S + 10
        )
        fleet = await fleet_status(client, settings)
        assert fleet.left == () and [g.node for g in fleet.out_of_service] == ["gpu02"]
        again = await gpuheal(slurm, settings, *argv)  # gpu02's node is its open incident's, not returnable
        assert again.returncode == 0 and "was not counted as left drained" in again.stdout
        refused = await gpuheal(slurm, settings, "return", "gpu02", "--operator", "bob", "--reason", "oops")
        assert refused.returncode != 0 and "its incident gpuheal-" in refused.stderr and "is open" in refused.stderr
        assert slurm.nodes()["gpu02"].drained, "an open incident's node was resumed"
        await gpuheal(slurm, settings, "abort", "gpu02", "--operator", "bob", "--reason", "test over")
        await asyncio.wait_for(second.result(), 60)
