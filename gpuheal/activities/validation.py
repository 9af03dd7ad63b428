"""GPU validation before a repaired node takes jobs again: a burn-in job through Slurm.

"Ready" (the provider's health check) says nothing about a GPU. So a repaired node, still
drained by its incident, is held in a maintenance reservation, resumed, and runs the site's
burn-in script (GPUHEAL_VALIDATE_JOB) there; nothing else can start on it meanwhile. A pass ends
the reservation: the node is in service. A job that ran and failed (or ran past the bound: a hung
diagnostic) drains it again with the reason, for the vendor: the incident ends
`failed_validation`, never `resolved`. A job that never ran to an end (still pending at the bound,
behind another job; cancelled; preempted) is no verdict: the node is drained again in the
incident's name for a person to validate, and nothing is condemned.
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
from gpuheal.clients.slurm.burn_in import ENDED, NO_VERDICT, WAITING, BurnIn
from gpuheal.core import policy
from gpuheal.core.models.slurm import NodeRef, ValidateRequest, ValidationResult

log = logging.getLogger("gpuheal.validation")
POLL_S = 2.0
CANCEL_WAIT_S = 60.0


def reservation_name(node: str, run_id: str | None) -> str:
    """One per incident run (a node's next incident validates afresh): its first run, which a
    Temporal reset keeps; a request from a release that sent none, the activity's own run."""
    run = run_id or (activity.info().workflow_run_id if activity.in_activity() else "") or "local"
    return f"gpuheal-validate-{node}-{_tail(run)}"


def _tail(run_id: str) -> str:
    """A run id's random tail: run ids are UUIDv7 (Temporal 1.27 on), whose head is the time to
    about a minute, which two runs may share."""
    return run_id.replace("-", "")[-8:]


def _now() -> float:
    return time.monotonic()


def _job_name(reservation: str) -> str:
    """The burn-in job's name: its reservation's (the incident's first run) and this run's, so a
    retry finds its job, and a follow-up or reset run, in the same reservation, never takes the
    verdict of a job an earlier run left in Slurm's memory."""
    run = (activity.info().workflow_run_id if activity.in_activity() else "") or "local"
    return f"{reservation}-{_tail(run)}"


# The failure drain's reason and its reading are policy's: the node's next incident reads it too.
failed_reason = policy.failed_validation_reason
failed_detail = policy.failed_validation_detail


class ValidationActivities:
    def __init__(self, slurm: SlurmBackend, burn_in: BurnIn) -> None:
        self._slurm = slurm
        self._burn_in = burn_in

    async def hold(self, node: str, run_id: str | None, timeout_s: float) -> None:
        """A replacement's new node, in its reservation before it joins: only the burn-in will
        run there (validate_node_gpus finds the reservation by the same name)."""
        await self._burn_in.reserve(reservation_name(node, run_id), node, timeout_s)

    @implements(act.VALIDATE_NODE_GPUS)
    async def validate_node_gpus(self, req: ValidateRequest) -> ValidationResult:
        ref = req.node
        name = reservation_name(ref.node, req.run_id)
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
            # Never leave it in service unvalidated: drained again (ours, so the retry resumes it;
            # should the incident give up, it reads as what it is, no verdict).
            why = policy.unvalidated_reason(ref.incident_id, "the burn-in was interrupted")
            try:
                await asyncio.shield(self._drain(ref, why))
            except Exception as err:  # Slurm unreachable too: the workflow drains it when it gives up
                log.error("could not drain %s again after a failed validation: %s", ref.node, err)
            raise
        if verdict.ran_and_failed:
            await self._drain(ref, failed_reason(ref.incident_id, verdict.detail))
        elif verdict.no_verdict:
            await self._drain(ref, policy.unvalidated_reason(ref.incident_id, verdict.detail))
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
        job_id = await self._burn_in.submit(req.job, name, ref.node, _job_name(name))
        # The bound is the job's own: it waits for the node up to it (behind a job Slurm may not
        # requeue, say), and once started it runs up to it (its reservation extended to match).
        deadline = _now() + req.timeout_s
        state, code = await self._burn_in.state(job_id)
        started = False
        while state not in ENDED:
            if not started and state not in WAITING:
                started, deadline = True, _now() + req.timeout_s
                await self._burn_in.reserve(name, ref.node, req.timeout_s)
            if _now() >= deadline:
                break
            activity.heartbeat(f"burn-in job {job_id} on {ref.node}")
            await asyncio.sleep(POLL_S)
            state, code = await self._burn_in.state(job_id)
        if state not in ENDED:
            await self._burn_in.cancel(job_id)
            for _ in range(int(CANCEL_WAIT_S / POLL_S)):  # gone before the reservation is
                if (await self._burn_in.state(job_id))[0] in ENDED:
                    break
                # Silent here, the attempt would time out and a retry start beside it.
                activity.heartbeat(f"cancelling burn-in job {job_id} on {ref.node}")
                await asyncio.sleep(POLL_S)
            if not started:  # behind another job, or never given the node: says nothing of the GPUs
                detail = f"burn-in job {job_id} never started within {req.timeout_s:.0f} s"
                return ValidationResult(passed=False, detail=detail, job_id=job_id, no_verdict=True)
            detail = f"burn-in job {job_id} ran {req.timeout_s:.0f} s with no verdict (hung)"
            return ValidationResult(passed=False, detail=detail, job_id=job_id)
        detail = f"burn-in job {job_id} ended {state} (exit {code})"
        passed = state == "COMPLETED" and code.startswith("0:")
        return ValidationResult(passed=passed, detail=detail, job_id=job_id, no_verdict=state in NO_VERDICT)
