"""A repaired node takes jobs again only after its GPUs pass a burn-in job that real Slurm runs on
it, in a maintenance reservation, while nothing else can start there."""

from __future__ import annotations

import asyncio
import json

from temporalio.client import Client

from gpuheal.activities.fleet import FleetActivities
from gpuheal.clients.slurm import build_slurm
from gpuheal.core.fleet.models import RunRef, RunRefs
from gpuheal.core.models.base import NodeState
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import start_or_join
from gpuheal.workers.main import check_burn_in_can_run, make_worker
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import across_slurm, nodes_in_service, report
from tests.integration.test_fleet import fleet_status


def validating(settings: Settings, slurm: Sandbox) -> Settings:
    remediation = settings.remediation.model_copy(update={"validate_job": str(slurm.validate_job)})
    return settings.model_copy(update={"remediation": remediation})


def burn_ins(slurm: Sandbox) -> list[str]:
    out = slurm.slurm("squeue", "-h", "-t", "all", "-o", "%j %T %N")
    return [line for line in out.splitlines() if line.startswith("gpuheal-validate-")]


async def test_a_repaired_node_passes_its_burn_in_and_returns(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    settings = validating(settings, slurm)
    slurm.inject_gpu_fault("gpu01")  # a reset mends it
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report(settings, "gpu01", 48))
        result = await asyncio.wait_for(handle.result(), 120)
    assert result.outcome == "resolved" and result.node_state == NodeState.RETURNED
    assert "gpu01" in nodes_in_service(slurm)
    (job,) = burn_ins(slurm)  # once
    assert job.endswith("COMPLETED gpu01")
    assert "No reservations" in slurm.slurm("scontrol", "show", "reservation")


@across_slurm
async def test_a_repaired_node_whose_gpu_still_fails_is_not_returned(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    """Ready after the reset, so the provider's health check passes; the burn-in does not."""
    settings = validating(settings, slurm)
    slurm.inject_lasting_fault("gpu01")
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report(settings, "gpu01", 48))
        result = await asyncio.wait_for(handle.result(), 120)
        books = await fleet_status(client, settings)  # (a query: asked while a worker runs)
    assert result.outcome == "failed_validation" and result.node_state == NodeState.FAILED_VALIDATION
    assert "GPUs failed validation" in result.node_detail
    node = slurm.slurm("scontrol", "show", "node", "gpu01")
    incident = handle.id
    assert "State=IDLE+DRAIN" in node  # takes no job: drained and out, for the vendor
    assert f"Reason={incident}: GPU validation failed, for the vendor: burn-in job" in node and "ended FAILED" in node
    (job,) = burn_ins(slurm)
    assert job.endswith("FAILED gpu01")
    assert "No reservations" in slurm.slurm("scontrol", "show", "reservation")
    # The run is closed: the coordinator counts its node as left, and its look (what it asks
    # Slurm) keeps it counted: the drain names the incident.
    assert [g.node for g in books.left] == ["gpu01"] and books.out_of_service == ()
    fleet = FleetActivities(build_slurm(settings.slurm), None, settings.fleet, settings.remediation, (), 1)
    run = RunRef(incident_id=incident, run_id=handle.result_run_id or "", node="gpu01")
    assert (await fleet.find_nodes_left_drained(RunRefs(runs=(run,)))).runs == (run,)


async def test_a_burn_in_slurm_refuses_leaves_the_node_drained_not_in_service(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    """sbatch refuses the site's script (here: it is missing) on every try: the node is drained
    again, never left resumed inside its reservation. That says nothing of its GPUs: the
    incident ends unvalidated, the node kept drained in its name for a person, no RMA."""
    remediation = settings.remediation.model_copy(update={"validate_job": "/nonexistent/burn-in.sh"})
    settings = settings.model_copy(update={"remediation": remediation})
    slurm.inject_gpu_fault("gpu01")
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report(settings, "gpu01", 48))
        result = await asyncio.wait_for(handle.result(), 180)
    assert result.outcome == "unvalidated" and "the burn-in could not run" in result.node_detail
    assert result.node_state == NodeState.UNVALIDATED and result.rma is None
    node = slurm.slurm("scontrol", "show", "node", "gpu01")
    assert "State=IDLE+DRAIN" in node and f"Reason={handle.id}: GPU validation gave no verdict" in node
    reservations = slurm.slurm("scontrol", "show", "reservation")
    assert "Duration=UNLIMITED" not in reservations and "gpuheal-validate-gpu01" in reservations  # it ends by itself


async def test_a_burn_in_behind_a_job_gives_no_verdict_and_condemns_nothing(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    """A job Slurm may not requeue (--no-requeue) still runs on the repaired node: never killed,
    so the --exclusive burn-in waits behind it, past its bound. No verdict: the node is kept
    drained for a person (counted by the coordinator), no RMA, and the job runs on."""
    settings = validating(settings, slurm)
    settings = settings.model_copy(
        update={"remediation": settings.remediation.model_copy(update={"validate_timeout_s": 15})}
    )
    stuck = slurm.submit_training("stuck", requeue=False, nodelist="gpu01")
    await asyncio.to_thread(slurm.wait_for_step, stuck, 2)
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report(settings, "gpu01", 48))
        result = await asyncio.wait_for(handle.result(), 180)
        books = await fleet_status(client, settings)
    assert result.outcome == "unvalidated" and "never started within 15 s" in result.node_detail, result.reason
    assert result.node_state == NodeState.UNVALIDATED and result.rma is None
    node = slurm.slurm("scontrol", "show", "node", "gpu01")
    assert f"Reason={handle.id}: GPU validation gave no verdict" in node and "for the vendor" not in node
    (job,) = burn_ins(slurm)
    assert job.startswith("gpuheal-validate-gpu01") and " CANCELLED " in job
    assert job_fields(slurm, stuck)["JobState"] == "RUNNING"  # the user's job was never touched
    assert [g.node for g in books.left] == ["gpu01"]
    slurm.slurm("scancel", str(stuck))


def job_only_a_spare_can_run(slurm: Sandbox) -> int:
    """Pending until a spare takes jobs: it starts on the new node the moment that node may."""
    out = slurm.slurm(
        "sbatch", "--parsable", "--chdir=/tmp", "--exclude=gpu[01-03]", "--job-name=waiting", "--wrap", "sleep 300"
    )
    return int(out.strip().split(";")[0])


def job_fields(slurm: Sandbox, job_id: int) -> dict[str, str]:
    out = slurm.slurm("scontrol", "show", "job", "-o", str(job_id))
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


async def once_scheduled(slurm: Sandbox, job_id: int) -> dict[str, str]:
    """The job's fields once it left PENDING, or as they are after 30 s: the scheduler's next
    pass starts it once the reservation is gone."""
    for _ in range(120):
        job = job_fields(slurm, job_id)
        if job["JobState"] != "PENDING":
            break
        await asyncio.sleep(0.25)
    return job


async def test_a_replacement_runs_its_burn_in_before_it_takes_any_job(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    """The spare is held (a maintenance reservation) from before its slurmd registers: a job
    waiting for exactly that node starts there only after the burn-in passed."""
    settings = validating(settings, slurm)
    waiting = job_only_a_spare_can_run(slurm)
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report(settings, "gpu01", 79))  # off the bus: replaced
        result = await asyncio.wait_for(handle.result(), 120)
    assert result.outcome == "resolved" and result.node_state == NodeState.REPLACED, result.node_detail
    new = result.replacement_node
    assert new == "gpu04" and "GPUs validated" in result.node_detail
    (burn,) = burn_ins(slurm)
    assert burn.endswith(f"COMPLETED {new}")
    burn_id = slurm.slurm("squeue", "-h", "-t", "all", "-n", burn.split()[0], "-o", "%i").split()[0]
    job = await once_scheduled(slurm, waiting)
    assert job["JobState"] == "RUNNING" and job["NodeList"] == new
    assert job["StartTime"] >= job_fields(slurm, int(burn_id))["EndTime"]  # ISO times: text order is time order
    assert "No reservations" in slurm.slurm("scontrol", "show", "reservation")


def retrying_fast(settings: Settings) -> Settings:
    remediation = settings.remediation.model_copy(update={"capacity_retry_s": 2, "capacity_wait_s": 120})
    return settings.model_copy(update={"remediation": remediation})


@across_slurm
async def test_a_new_node_whose_gpu_fails_its_burn_in_takes_no_job_and_another_comes(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    """A spare with a bad GPU: no job ever starts on it, it is drained for the vendor and never
    taken again, and the incident looks on for another, which passes. On every Slurm release:
    each must accept a reservation on a node that has not registered yet (State=FUTURE)."""
    settings = retrying_fast(validating(settings, slurm))
    slurm.inject_lasting_fault("gpu04")
    waiting = job_only_a_spare_can_run(slurm)
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report(settings, "gpu01", 79))
        result = await asyncio.wait_for(handle.result(), 180)
    assert result.outcome == "resolved" and result.node_state == NodeState.REPLACED, result.node_detail
    assert result.replacement_node == "gpu05"
    assert "after gpu04 failed GPU validation (drained for the vendor)" in result.node_detail
    node = slurm.slurm("scontrol", "show", "node", "gpu04")
    assert "DRAIN" in node and "GPU validation failed, for the vendor: burn-in job" in node and "ended FAILED" in node
    assert sorted(b.split()[-2:] for b in burn_ins(slurm)) == [["COMPLETED", "gpu05"], ["FAILED", "gpu04"]]
    job = await once_scheduled(slurm, waiting)
    assert job["JobState"] == "RUNNING" and job["NodeList"] == "gpu05"  # never on gpu04
    assert "gpu01" not in nodes_in_service(slurm)
    assert "No reservations" in slurm.slurm("scontrol", "show", "reservation")
    # The provider's log of spares given (the chaos soak's checker reads it): gpu05 instead of gpu04.
    given = [json.loads(line) for line in (slurm.slurm_dir / "provider" / "given.jsonl").read_text().splitlines()]
    assert [(g["spare"], g["instead_of"]) for g in given] == [("gpu04", ""), ("gpu05", "gpu04")]
    assert given[0]["key"] == given[1]["key"] and given[0]["key"].startswith(f"{handle.id}/")  # one run's


async def test_a_batch_of_bad_new_nodes_ends_no_capacity_with_the_failed_node_kept(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    """Every spare's GPU fails: the run stops after MAX_REJECTED of them, within its bound. The
    failed node stays drained (nothing took its place), each bad one is drained for the vendor,
    and a job waiting for a spare never ran on any of them."""
    settings = retrying_fast(validating(settings, slurm))
    for spare in ("gpu04", "gpu05", "gpu06"):
        slurm.inject_lasting_fault(spare)
    waiting = job_only_a_spare_can_run(slurm)
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report(settings, "gpu01", 79))
        result = await asyncio.wait_for(handle.result(), 240)
    assert result.outcome == "no_capacity", result.reason
    assert "new node(s) gpu04, gpu05, gpu06 failed GPU validation: drained for the vendor" in result.reason
    assert "DRAIN" in slurm.slurm("scontrol", "show", "node", "gpu01")  # kept, counted as out
    for spare in ("gpu04", "gpu05", "gpu06"):
        assert "GPU validation failed, for the vendor" in slurm.slurm("scontrol", "show", "node", spare)
    assert len(burn_ins(slurm)) == 3
    assert job_fields(slurm, waiting)["JobState"] == "PENDING"
    assert "No reservations" in slurm.slurm("scontrol", "show", "reservation")


async def test_a_rest_worker_with_slurms_client_beside_it_may_burn_in(slurm: Sandbox, settings: Settings) -> None:
    """The check that refuses a worker whose burn-in cannot run passes where Slurm's client,
    munge and slurm.conf work beside slurmrestd (only the backend is named here: nothing more
    is read from it)."""
    s = validating(settings, slurm)
    s = s.model_copy(update={"slurm": s.slurm.model_copy(update={"backend": "rest"})})
    await check_burn_in_can_run(s)
