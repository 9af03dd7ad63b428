"""For the vendor: a replaced, failed or repeat-offending board's RMA evidence, gathered at the
close and handed to the site's ticket hook. Never fails the incident: a hook that fails after its
retries is said in the evidence, and the postmortem carries it either way."""

from __future__ import annotations

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
HOOK_ATTEMPTS = 3


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
    evidence = await act_run(act.GATHER_RMA_EVIDENCE, req, summary="gather the RMA evidence")
    try:
        ticket = await act_run(
            act.FILE_RMA, evidence, summary="hand the RMA to the ticket hook", attempts=HOOK_ATTEMPTS
        )
    except ActivityError as err:
        ticket = f"the RMA hook failed ({err.cause or err}): file it by hand from the postmortem"
    s.rma = evidence.model_copy(update={"ticket": ticket})
