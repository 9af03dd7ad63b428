"""GPU validation before a repaired node takes jobs again: a burn-in job through Slurm.

"Ready" (the provider's health check) says nothing about a GPU. So a repaired node, still
drained by its incident, is held in a maintenance reservation, resumed, and runs the site's
burn-in script (GPUHEAL_VALIDATE_JOB) there; nothing else can start on it meanwhile. A pass ends
the reservation: the node is in service. A failure, or no verdict within the bound, drains it
again with the reason, for the vendor: the incident ends `failed_validation`, never `resolved`.
That reason is the incident's own (policy.drain_reason), so the coordinator keeps the node counted
after the run closes, and a retry that finds it answers the same verdict. Whatever goes wrong on
the way (Slurm unreachable, sbatch refused), the node is drained again before the error is raised:
it is never left in service unvalidated. Every step reads before it acts
(gpuheal.clients.slurm.burn_in), so a retry does nothing twice.
"""

from __future__ import annotations

import asyncio
import logging
import time

from temporalio import activity

from gpuheal.activities import interface as act
from gpuheal.activities.interface import implements
from gpuheal.clients.slurm import SlurmBackend
from gpuheal.clients.slurm.burn_in import BurnIn
from gpuheal.core import policy
from gpuheal.core.models.slurm import NodeRef, ValidateRequest, ValidationResult

log = logging.getLogger("gpuheal.validation")
POLL_S = 2.0
CANCEL_WAIT_S = 60.0


def reservation_name(node: str) -> str:
    """One per incident run (a node's next incident validates afresh)."""
    run = (activity.info().workflow_run_id or "")[:8] if activity.in_activity() else "local"
    return f"gpuheal-validate-{node}-{run}"


# The failure drain's reason and its reading are policy's: the node's next incident reads it too.
failed_reason = policy.failed_validation_reason
failed_detail = policy.failed_validation_detail


class ValidationActivities:
    def __init__(self, slurm: SlurmBackend, burn_in: BurnIn) -> None:
        self._slurm = slurm
        self._burn_in = burn_in

    async def hold(self, node: str, timeout_s: float) -> None:
        """A replacement's new node, in its reservation before it joins: only the burn-in will
        run there (validate_node_gpus finds the reservation by the same name)."""
        await self._burn_in.reserve(reservation_name(node), node, timeout_s)

    @implements(act.VALIDATE_NODE_GPUS)
    async def validate_node_gpus(self, req: ValidateRequest) -> ValidationResult:
        ref = req.node
        name = reservation_name(ref.node)
        await self._burn_in.reserve(name, ref.node, req.timeout_s)
        node = await self._slurm.node(ref.node)
        if node.drained and (detail := failed_detail(node.reason, ref.incident_id)) is not None:
            # An earlier attempt's verdict (its reservation's delete failed, or it was still ending
            # when this one started): the same answer, never a second burn-in or drain.
            await self._burn_in.unreserve(name)
            return ValidationResult(passed=False, detail=detail)
        if node.drained and not policy.is_our_drain(node.reason, ref.incident_id):
            await self._burn_in.unreserve(name)  # someone drained it meanwhile: theirs to decide
            return ValidationResult(passed=False, by_others=True, detail=f"drained by someone else: {node.reason!r}")
        try:
            verdict = await self._burn(req, name, resume=node.drained)
        except BaseException:
            # Never leave it in service unvalidated: drained again (ours, so the retry resumes it).
            why = policy.drain_reason(ref.incident_id, "GPU validation interrupted; retried")
            try:
                await asyncio.shield(self._drain(ref, why))
            except Exception as err:  # Slurm unreachable too: the workflow drains it when it gives up
                log.error("could not drain %s again after a failed validation: %s", ref.node, err)
            raise
        if not verdict.passed:
            await self._drain(ref, failed_reason(ref.incident_id, verdict.detail))
        await self._burn_in.unreserve(name)
        return verdict

    async def _drain(self, ref: NodeRef, reason: str) -> None:
        """Drained with `reason`, unless Slurm already shows this incident's failed validation
        (an attempt running beside this one wrote it): that verdict is never written over."""
        node = await self._slurm.node(ref.node)
        if not (node.drained and failed_detail(node.reason, ref.incident_id) is not None):
            await self._slurm.update_node(ref.node, "drain", reason)

    async def _burn(self, req: ValidateRequest, name: str, resume: bool) -> ValidationResult:
        ref = req.node
        if resume:
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
            for _ in range(int(CANCEL_WAIT_S / POLL_S)):  # gone before the reservation is
                if await self._burn_in.state(job_id) is not None:
                    break
                # Silent here, the attempt would time out and a retry start beside it.
                activity.heartbeat(f"cancelling burn-in job {job_id} on {ref.node}")
                await asyncio.sleep(POLL_S)
            detail = f"burn-in job {job_id} gave no verdict within {req.timeout_s:.0f} s"
            return ValidationResult(passed=False, detail=detail, job_id=job_id)
        state, code = ended
        passed = state == "COMPLETED" and code.startswith("0:")
        return ValidationResult(
            passed=passed, detail=f"burn-in job {job_id} ended {state} (exit {code})", job_id=job_id
        )
