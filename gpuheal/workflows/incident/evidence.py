"""For the vendor: a replaced, failed or repeat-offending board's RMA evidence, gathered at the
close and handed to the site's ticket hook. Never fails the incident: it runs before the close
releases the incident's capacity, so a history that cannot be read (visibility down, too slow)
files the evidence without it, and a hook that fails after its retries is said in the evidence;
the postmortem carries it either way."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

from gpuheal.workflows.activity import run as act_run
from gpuheal.workflows.incident.state import IncidentState

with workflow.unsafe.imports_passed_through():
    from gpuheal.activities import interface as act
    from gpuheal.core import rma, rma_policy

# Incidents started before the evidence was gathered closed without it; they keep doing so
# (workflow.patched) to replay.
RMA_EVIDENCE = "rma-evidence"
# Before this, a history that could not be read failed the incident at its close; replayed as such.
EVIDENCE_NEVER_FAILS = "rma-evidence-never-fails-the-incident"
HOOK_ATTEMPTS = 3
# Up to HISTORY_LIMIT runs' results, read a few at a time: a slow visibility store gets minutes,
# not the default 30 s, and a few tries, not thirty (the close, and the release, wait on it).
GATHER_TIMEOUT = timedelta(seconds=120)
GATHER_ATTEMPTS = 3


async def for_the_vendor(s: IncidentState) -> None:
    why = rma_policy.needed(s.node_at.state, s.repeat)
    if why is None or not workflow.patched(RMA_EVIDENCE):
        return
    ref = s.ref
    req = rma.RmaRequest(
        cluster=ref.cluster,
        node=ref.node,
        incident_id=ref.incident_id,
        run_id=workflow.info().first_execution_run_id,
        why=why,
        boards=rma_policy.boards_of(s.reports),
        kernel_log=rma_policy.kernel_lines(s.reports),
        actions=rma_policy.actions_of(s.stages),
    )
    gap = ""
    try:
        evidence = await act_run(
            act.GATHER_RMA_EVIDENCE,
            req,
            summary="gather the RMA evidence",
            timeout=GATHER_TIMEOUT,
            attempts=GATHER_ATTEMPTS,
        )
    except ActivityError as err:
        if not workflow.patched(EVIDENCE_NEVER_FAILS):
            raise
        evidence = rma.RmaEvidence(**dict(req), history=())
        gap = f" (the board's history could not be read: {err.cause or err})"
    try:
        ticket = await act_run(
            act.FILE_RMA, evidence, summary="hand the RMA to the ticket hook", attempts=HOOK_ATTEMPTS
        )
    except ActivityError as err:
        ticket = f"the RMA hook failed ({err.cause or err}): file it by hand from the postmortem"
    s.rma = evidence.model_copy(update={"ticket": ticket + gap})
