"""GPU validation before a repaired node takes jobs again: a burn-in job through Slurm.

"Ready" (the provider's health check) says nothing about a GPU. So a repaired node, still
drained by its incident, is held in a maintenance reservation, resumed, and runs the site's
burn-in script (GPUHEAL_VALIDATE_JOB) there; nothing else can start on it meanwhile. A pass ends
the reservation: the node is in service. A failure, or no verdict within the bound, drains it
again with the reason, for the vendor: the incident ends `failed_validation`, never `resolved`.
Every step reads before it acts (gpuheal.clients.slurm.burn_in), so a retry does nothing twice.
"""

from __future__ import annotations

import asyncio
import time

from temporalio import activity

from gpuheal.activities import interface as act
from gpuheal.activities.interface import implements
from gpuheal.clients.slurm import SlurmBackend
from gpuheal.clients.slurm.burn_in import BurnIn
from gpuheal.core import policy
from gpuheal.core.models import ValidateRequest, ValidationResult

POLL_S = 2.0


def reservation_name(node: str) -> str:
    """One per incident run (a node's next incident validates afresh)."""
    run = (activity.info().workflow_run_id or "")[:8] if activity.in_activity() else "local"
    return f"gpuheal-validate-{node}-{run}"


class ValidationActivities:
    def __init__(self, slurm: SlurmBackend, burn_in: BurnIn) -> None:
        self._slurm = slurm
        self._burn_in = burn_in

    @implements(act.VALIDATE_NODE_GPUS)
    async def validate_node_gpus(self, req: ValidateRequest) -> ValidationResult:
        ref = req.node
        name = reservation_name(ref.node)
        await self._burn_in.reserve(name, ref.node)
        node = await self._slurm.node(ref.node)
        if node.drained:
            if not policy.is_our_drain(node.reason, ref.incident_id):
                await self._burn_in.unreserve(name)  # someone drained it meanwhile: theirs to decide
                return ValidationResult(passed=False, detail=f"drained by someone else meanwhile: {node.reason!r}")
            await self._slurm.update_node(ref.node, "resume")  # inside the reservation: only the burn-in runs
        job_id = await self._burn_in.submit(req.job, name, ref.node)
        deadline = time.monotonic() + req.timeout_s
        ended = await self._burn_in.state(job_id)
        while ended is None and time.monotonic() < deadline:
            activity.heartbeat(f"burn-in job {job_id} on {ref.node}")
            await asyncio.sleep(POLL_S)
            ended = await self._burn_in.state(job_id)
        if ended is None:
            await self._burn_in.cancel(job_id)
            verdict = ValidationResult(
                passed=False, detail=f"burn-in job {job_id} gave no verdict within {req.timeout_s:.0f} s", job_id=job_id
            )
        else:
            state, code = ended
            passed = state == "COMPLETED" and code.startswith("0:")
            verdict = ValidationResult(
                passed=passed, detail=f"burn-in job {job_id} ended {state} (exit {code})", job_id=job_id
            )
        if not verdict.passed:
            why = policy.drain_reason(ref.incident_id, f"GPU validation failed: {verdict.detail}")
            await self._slurm.update_node(ref.node, "drain", why)
        await self._burn_in.unreserve(name)
        return verdict
