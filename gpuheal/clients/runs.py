"""Whether an incident run crashed out, from Temporal: what a claim, a borrowed node or any other
mark an incident left on the world is worth once its run ended without reaching an ending of
its own (terminated, failed, timed out, cancelled; or gone past retention).

A run that completed reached one of its endings, and each gives back what it took or means to
keep it (a replacement in service, a borrowed node a job still runs on, kept for a person): its
marks stand. A run is its workflow id's chain from its first run id (`first_execution_run_id`,
which a continue-as-new and a reset keep): open while the id's current run is running and is of
that chain. A mark written by a release that named the activity's own run is that run's.
"""

from __future__ import annotations

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

CRASHED = frozenset(
    {
        WorkflowExecutionStatus.TERMINATED,
        WorkflowExecutionStatus.FAILED,
        WorkflowExecutionStatus.TIMED_OUT,
        WorkflowExecutionStatus.CANCELED,
    }
)


async def run_crashed_out(client: Client, incident_id: str, run_id: str | None, asker: str) -> bool:
    """True once the run has ended without an ending of its own. `asker` is the caller's own
    workflow id: it must be found first, so that "not found" means gone, never a wrong namespace
    or a failing-over server (which would read every live run as gone)."""
    await client.get_workflow_handle(asker).describe()
    try:
        latest = await client.get_workflow_handle(incident_id).describe()
        if not run_id or latest.raw_description.workflow_execution_info.first_run_id == run_id:
            return latest.status in CRASHED  # (running, or completed: it stands)
        # A later incident of the node runs now, or a run named by an earlier release: that run.
        that = await client.get_workflow_handle(incident_id, run_id=run_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return True
        raise
    return that.status in CRASHED
