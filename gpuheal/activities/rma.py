"""Evidence for the vendor: the board's history from Temporal's visibility (by serial, across
nodes, renames and re-images), and the bundle handed to the site's ticket hook; and the same
history's application faults, which the ladder reads (gpuheal.core.app_faults).

``GPUHEAL_RMA_HOOK`` is called as ``HOOK rma NODE INCIDENT`` with the bundle (JSON) on stdin and
prints ``{"ticket": "..."}``. The bundle names the incident run, so a hook that files once per
run (the retried activity calls it again) files one ticket.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

from temporalio import activity
from temporalio.client import WorkflowContinuedAsNewError, WorkflowExecution

from gpuheal.activities import interface as act
from gpuheal.activities.interface import implements
from gpuheal.clients import proc
from gpuheal.core import policy, queries
from gpuheal.core import search_attributes as sa
from gpuheal.core.app_faults import AppFault, AppFaults, AppFaultsRequest
from gpuheal.core.messages import INCIDENT
from gpuheal.core.models.report import HealthReport
from gpuheal.core.rma import RmaEvidence, RmaRequest, XidRecord

HISTORY_LIMIT = 50  # incidents of one board: more is a fleet problem, not one board's
RESULT_READS = 8  # closed runs' results read at once
HOOK_TIMEOUT_S = 60.0


class RmaActivities:
    def __init__(self, hook: str | None) -> None:
        self._hook = hook

    @implements(act.GATHER_RMA_EVIDENCE)
    async def gather_rma_evidence(self, req: RmaRequest) -> RmaEvidence:
        """The board's incidents, newest first: by serial where the reports named one (it follows
        the board), else the node's own."""
        client = activity.client()
        serials = [b.serial for b in req.boards if b.serial]
        terms = [queries.contains(sa.GPU_SERIALS, s) for s in serials] or [queries.eq(sa.NODE, req.node)]
        query = queries.where(queries.of_type(INCIDENT), queries.eq(sa.CLUSTER, req.cluster), queries.any_of(*terms))
        runs = [wf async for wf in client.list_workflows(query, limit=HISTORY_LIMIT)]
        reading = asyncio.Semaphore(RESULT_READS)

        async def outcome_of(wf: WorkflowExecution) -> str:
            if wf.run_id == req.run_id:
                return "this incident"
            if wf.close_time is None:
                return ""
            try:
                async with reading:
                    # (never follow its runs: a follow-up of this incident may be the caller)
                    result = await INCIDENT.handle(client, wf.id, run_id=wf.run_id).result(follow_runs=False)
                return result.outcome
            except WorkflowContinuedAsNewError:
                return "followed_up"
            except Exception as err:  # a failed or terminated run: say so, keep the rest
                return f"no result ({type(err).__name__})"

        outcomes = await asyncio.gather(*(outcome_of(wf) for wf in runs))
        history = [
            XidRecord(
                at=wf.start_time,
                node=wf.typed_search_attributes.get(sa.NODE) or "?",
                incident_id=wf.id,
                run_id=wf.run_id,
                xid=wf.typed_search_attributes.get(sa.XID),
                action=wf.typed_search_attributes.get(sa.ACTION) or "",
                outcome=outcome,
            )
            for wf, outcome in zip(runs, outcomes, strict=True)
        ]
        return RmaEvidence(**dict(req), history=tuple(history))

    @implements(act.FIND_APPLICATION_FAULTS)
    async def find_application_faults(self, req: AppFaultsRequest) -> AppFaults:
        """This GPU's earlier incidents that were application faults, with their jobs, from
        Temporal: those whose first report is XID 13, 31 or 43 (every application fault's is),
        by serial (it follows the board) or on this node, closed within the window; then those
        of this GPU (the same serial where both name one, else the same GPU index). Visibility
        that lags can only leave one out: the job restarts, and the next fault counts it."""
        client = activity.client()
        who = [queries.contains(sa.GPU_SERIALS, s) for s in req.serials] + [queries.eq(sa.NODE, req.node)]
        query = queries.where(
            queries.of_type(INCIDENT),
            queries.eq(sa.CLUSTER, req.cluster),
            queries.any_of(*who),
            queries.any_of(*(queries.eq(sa.XID, x) for x in sorted(policy.APPLICATION_XIDS))),
            queries.status("Completed"),
            queries.after(queries.CLOSE_TIME, req.since),
        )
        runs = [wf async for wf in client.list_workflows(query, limit=HISTORY_LIMIT)]
        reading = asyncio.Semaphore(RESULT_READS)

        async def read(wf: WorkflowExecution) -> AppFault | None:
            async with reading:
                result = await INCIDENT.handle(client, wf.id, run_id=wf.run_id).result(follow_runs=False)
            if not policy.is_application_fault(result.reports) or not _this_gpu(req, result.reports):
                return None
            jobs = tuple(a.job_id for a in result.jobs)
            return AppFault(
                incident_id=wf.id, run_id=wf.run_id, closed_at=result.closed_at, jobs=jobs, burn_in=result.burn_in
            )

        found = await asyncio.gather(*(read(wf) for wf in runs))
        return AppFaults(faults=tuple(f for f in found if f is not None))

    @implements(act.FILE_RMA)
    async def file_rma(self, evidence: RmaEvidence) -> str:
        """The ticket the hook filed, or why none was (no hook: the evidence is in the postmortem)."""
        if not self._hook:
            return "no GPUHEAL_RMA_HOOK: the evidence is in the postmortem"
        done = await proc.run(
            [self._hook, "rma", evidence.node, evidence.incident_id],
            timeout_s=HOOK_TIMEOUT_S,
            what="RMA hook",
            stdin=json.dumps(evidence.model_dump(mode="json"), sort_keys=True).encode(),
        )
        out = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
        return str(out.get("ticket") or "filed (the hook named no ticket)")[:200]


def _this_gpu(req: AppFaultsRequest, reports: Sequence[HealthReport]) -> bool:
    """An incident's reports name this GPU: its serial where both sides name one, else its index
    (a report naming no GPU cannot be told apart: it counts)."""
    theirs = {r.gpu_serial for r in reports if r.gpu_serial}
    if req.serials and theirs:
        return bool(theirs & set(req.serials))
    return req.gpu is None or any(r.gpu in (None, req.gpu) for r in reports)
