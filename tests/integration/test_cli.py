"""The operator's CLI on the real stack: answers, not tracebacks; the incident list.

Each error a user can cause gets one or two plain lines naming the thing and what to do, and its
own exit code (gpuheal/cli/errors.py); `status` answers from the history when the incident is closed or
no worker answers."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from temporalio.client import Client

from gpuheal.cli import errors
from gpuheal.core import ids
from gpuheal.core.models.base import Stage
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import start_or_join
from gpuheal.workers.main import make_worker
from gpuheal.workflows.remediation import GpuRemediationWorkflow
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import gpuheal, held_behind_paused_breaker, report

pytestmark = pytest.mark.integration


def plain(out: str) -> None:
    assert "Traceback" not in out and len(out.strip().splitlines()) <= 3, out


async def test_an_unknown_incident_is_named_with_what_to_do(slurm: Sandbox, settings: Settings) -> None:
    for verb in (["status", "gpu09"], ["approve", "gpu09", "--operator", "a", "--reason", "r"]):
        done = await gpuheal(slurm, settings, *verb)
        assert done.returncode == errors.UNKNOWN, done
        assert "no incident gpu09" in done.stderr and "gpuheal incidents" in done.stderr
        plain(done.stderr)


async def test_temporal_unreachable_is_one_line_with_the_address(slurm: Sandbox, settings: Settings) -> None:
    done = await gpuheal(slurm, settings, "status", "gpu01", GPUHEAL_TEMPORAL_ADDRESS="127.0.0.1:1")
    assert done.returncode == errors.UNREACHABLE, done
    assert "cannot reach Temporal at 127.0.0.1:1" in done.stderr and "GPUHEAL_TEMPORAL_ADDRESS" in done.stderr
    plain(done.stderr)


async def test_bad_input_quotes_the_offending_value(slurm: Sandbox, settings: Settings) -> None:
    done = await gpuheal(slurm, settings, "report", "--node", "gpu01;reboot", "--xid", "79")
    assert done.returncode == errors.BAD_INPUT, done
    assert "node" in done.stderr and "'gpu01;reboot'" in done.stderr
    plain(done.stderr)
    done = await gpuheal(slurm, settings, "history", 'gpu"01')  # never reaches the visibility query
    assert done.returncode == errors.BAD_INPUT and "invalid node name 'gpu\"01'" in done.stderr, done
    plain(done.stderr)
    # A target reaches a workflow id, and the postmortem's file names: checked first, nothing written.
    done = await gpuheal(slurm, settings, "postmortem", "gpuheal-x/../../tmp/x", "--out", str(slurm.root / "pm"))
    assert done.returncode == errors.BAD_INPUT and "invalid incident id 'gpuheal-x/../../tmp/x'" in done.stderr, done
    assert not (slurm.root / "pm").exists()
    done = await gpuheal(slurm, settings, "override", "gpu01;x", "--operator", "a", "--reason", "r")
    assert done.returncode == errors.BAD_INPUT and "invalid node name 'gpu01;x'" in done.stderr, done
    done = await gpuheal(slurm, settings, "incidents", "--since", "forever")
    assert done.returncode == errors.BAD_INPUT and "'forever' is not a duration" in done.stderr, done
    done = await gpuheal(slurm, settings, "incidents", "--stage", "nap")
    assert done.returncode == errors.BAD_INPUT and "'nap'" in done.stderr, done


async def test_no_worker_status_answers_from_temporals_record_within_seconds(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    await start_or_join(client, settings, report(settings, "gpu03", 48))  # no worker: it waits in triage
    t0 = time.monotonic()
    done = await gpuheal(slurm, settings, "status", "gpu03")
    assert time.monotonic() - t0 < 15
    assert done.returncode == errors.NO_WORKER, done
    assert "stage triage" in done.stdout and "Temporal's record" in done.stdout
    assert "no worker answered" in done.stdout
    plain(done.stderr)
    await client.get_workflow_handle(ids.incident_id(settings.cluster or "", "gpu03")).terminate("test over")


async def test_a_closed_incident_answers_from_its_history_and_lists_itself(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report(settings, "gpu02", 48))
        result = await asyncio.wait_for(handle.result(), 90)
        refused = await gpuheal(slurm, settings, "resume", "--operator", "a", "--reason", "r")
    assert result.outcome == "resolved"
    assert refused.returncode == errors.REFUSED and "refused: the circuit breaker is not tripped" in refused.stderr
    plain(refused.stderr)
    # The worker is gone now: a closed incident still answers, from its history.
    t0 = time.monotonic()
    status = await gpuheal(slurm, settings, "status", "gpu02")
    assert status.returncode == 0 and time.monotonic() - t0 < 15, status
    assert "resolved" in status.stdout and "repair_or_replace" in status.stdout
    closed = await gpuheal(slurm, settings, "approve", "gpu02", "--operator", "a", "--reason", "r")
    assert closed.returncode == errors.CLOSED and "is closed" in closed.stderr, closed
    plain(closed.stderr)
    # The list: one line each, filters, and JSON for scripts.
    listed = await gpuheal(slurm, settings, "incidents")
    assert listed.returncode == 0, listed
    header, *rows = listed.stdout.strip().splitlines()
    assert header.split()[:6] == ["NODE", "STAGE", "ACTION", "AGE", "OUTCOME", "MTTR"]
    assert len(rows) == 1 and rows[0].split()[:3] == ["gpu02", "done", "reset_gpu"] and "resolved" in rows[0]
    data = json.loads((await gpuheal(slurm, settings, "incidents", "--json", "--outcome", "resolved")).stdout)
    assert [(r["node"], r["outcome"]) for r in data] == [("gpu02", "resolved")]
    assert data[0]["mttr_s"] == pytest.approx(result.mttr_s) and data[0]["incident_id"] == handle.id
    none = await gpuheal(slurm, settings, "incidents", "--json", "--open")
    assert json.loads(none.stdout) == []
    # A node's history: when, which XID, what was done, how it ended.
    history = await gpuheal(slurm, settings, "history", "gpu02")
    assert history.returncode == 0, history
    (line,) = history.stdout.strip().splitlines()
    assert "XID 48" in line and "reset_gpu" in line and "resolved" in line and handle.id in line, line


async def test_approving_an_incident_that_is_not_waiting_is_refused_with_its_stage(
    slurm: Sandbox, settings: Settings, client: Client
) -> None:
    async with make_worker(client, settings):
        handle = await held_behind_paused_breaker(slurm, settings, client, "gpu01")
        for verb in ("approve", "abort"):
            done = await gpuheal(slurm, settings, verb, "gpu01", "--operator", "bob", "--reason", "go")
            assert done.returncode == errors.REFUSED, done
            assert "refused: incident is not awaiting approval (stage: held)" in done.stderr
            plain(done.stderr)
        status = await handle.query(GpuRemediationWorkflow.status)
        assert status.stage == Stage.HELD and not any("approval" in d for d in status.done)  # nothing changed
        await handle.terminate("test over")
        await client.get_workflow_handle(ids.coordinator_id(settings.cluster or "")).terminate("test over")
