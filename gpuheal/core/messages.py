"""Every workflow's type and every message it takes: name, input and output, declared once.

What activities/interface.py is for activities, this is for workflows: the handlers are declared
by these names (``@workflow.update(name=FLEET_PAUSE.name)``) and every caller goes through the
reference (``await FLEET_PAUSE.execute(handle, action)``), so a name is spelled once and the
argument and the answer are typed by it. The references live in core because the activities and
the CLI may not import the workflows (the floors in pyproject.toml); tests/test_messages.py
checks every handler's name and signature against its reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from gpuheal.core.fleet.models import (
    Admission,
    Admissions,
    AdmitBatch,
    AdmitBatchAnswers,
    AdmitRequest,
    AdmitRequests,
    CapacityDecision,
    CapacityDecisions,
    CapacityRequest,
    CapacityRequests,
    CoordinatorInput,
    DomainDecision,
    DomainIncidentInput,
    DomainIncidentResult,
    FleetStatus,
    GrantNotice,
    NodeReturn,
    OpenDomains,
    OperatorAction,
    Override,
    ReleaseRequest,
)
from gpuheal.core.fleet.policy import ConfiguredPolicy, ModeChange, PolicyChange, VersionedPolicy
from gpuheal.core.fleet.view import FleetView
from gpuheal.core.jobs import JobRecoveryInput, JobRecoveryResult, JobRecoveryStatus, RecoveryJoin
from gpuheal.core.models.incident import Decision, RemediationInput
from gpuheal.core.models.report import HealthReport
from gpuheal.core.models.result import RemediationResult, RemediationStatus

if TYPE_CHECKING:  # only typed here: the callers bring their handles (client, activity or workflow side)
    from temporalio.client import Client, WithStartWorkflowOperation, WorkflowExecutionDescription, WorkflowHandle
    from temporalio.workflow import ExternalWorkflowHandle

I = TypeVar("I")  # noqa: E741  (input, output: as in activities/interface.py)
O = TypeVar("O")  # noqa: E741


@dataclass(frozen=True)
class Workflow(Generic[I, O]):
    """A workflow type: started by name (activities cannot import the class), typed by these."""

    name: str
    input: type[I]
    output: type[O]
    # What a run may take after its input, carried by continue-as-new only (never at a start):
    # the coordinator's packed state (gpuheal.core.fleet.packing).
    carried: tuple[type, ...] = ()

    def handle(self, client: Client, workflow_id: str, run_id: str | None = None) -> WorkflowHandle[Any, O]:
        return client.get_workflow_handle(workflow_id, run_id=run_id, result_type=self.output)


@dataclass(frozen=True)
class Update(Generic[I, O]):
    name: str
    input: type[I]
    output: type[O]

    async def execute(self, handle: WorkflowHandle[Any, Any], arg: I) -> O:
        answer: O = await handle.execute_update(self.name, arg, result_type=self.output)
        return answer

    async def execute_with_start(self, client: Client, arg: I, start: WithStartWorkflowOperation[Any, Any]) -> O:
        answer: O = await client.execute_update_with_start_workflow(
            self.name, arg, start_workflow_operation=start, result_type=self.output
        )
        return answer


@dataclass(frozen=True)
class Signal(Generic[I]):
    name: str
    input: type[I]

    async def send(self, handle: WorkflowHandle[Any, Any] | ExternalWorkflowHandle[Any], arg: I) -> None:
        await handle.signal(self.name, arg)


@dataclass(frozen=True)
class Query(Generic[O]):
    name: str
    output: type[O]

    async def ask(self, handle: WorkflowHandle[Any, Any], rpc_timeout: timedelta | None = None) -> O:
        answer: O = await handle.query(self.name, result_type=self.output, rpc_timeout=rpc_timeout)
        return answer


@dataclass(frozen=True)
class Memo(Generic[O]):
    """A value a workflow keeps in its memo as it runs: read from the server (describe), so it
    answers while the workflow is too busy for a query."""

    key: str
    output: type[O]

    async def read(self, handle: WorkflowHandle[Any, Any], rpc_timeout: timedelta | None = None) -> O | None:
        """The value, or None where the workflow has not written one (a release before it)."""
        return await self.read_from(await handle.describe(rpc_timeout=rpc_timeout))

    async def read_from(self, described: WorkflowExecutionDescription) -> O | None:
        answer: O | None = await described.memo_value(self.key, None, type_hint=self.output)
        return answer


# --- the incident: one per failed node (workflows/remediation.py) ------------------------------
INCIDENT = Workflow("GpuRemediation", RemediationInput, RemediationResult)  # `WorkflowType=` in queries
INCIDENT_REPORT = Signal("report", HealthReport)  # another report for the node (signal-with-start)
INCIDENT_CAPACITY = Signal("capacity", GrantNotice)  # coordinator -> held incident
INCIDENT_JOB_RECOVERED = Signal("job_recovered", JobRecoveryResult)  # job recovery -> each incident it answers
INCIDENT_APPROVE = Update("approve", Decision, str)
INCIDENT_ABORT = Update("abort", Decision, str)
INCIDENT_APPROVE_SIGNAL = Signal("approve", Decision)  # fire and forget: ignored unless awaiting approval
INCIDENT_ABORT_SIGNAL = Signal("abort", Decision)
INCIDENT_GIVE_BACK = Update("give_back", Decision, str)  # the borrowed inference node goes back now
INCIDENT_STATUS = Query("status", RemediationStatus)

# --- the cluster's coordinator (workflows/fleet.py) ----------------------------------------------
COORDINATOR = Workflow("FleetCoordinator", CoordinatorInput, type(None), carried=(bytes,))
FLEET_ADMIT = Update("admit", AdmitRequest, Admission)  # sent with start: the first incident starts it
FLEET_REQUEST_CAPACITY = Update("request_capacity", CapacityRequest, CapacityDecision)
# Many at once, decided in one workflow task, in order (a storm; activities/batching.py's Batcher).
FLEET_ADMIT_MANY = Update("admit_many", AdmitRequests, Admissions)  # also sent with start
FLEET_REQUEST_CAPACITY_MANY = Update("request_capacity_many", CapacityRequests, CapacityDecisions)
# Admissions with their capacity requests, one decision per incident (gpuheal.core.fleet.admitting;
# also sent with start). A coordinator without it: admit and admit_many, as before.
FLEET_ADMIT_AND_REQUEST_MANY = Update("admit_and_request_many", AdmitBatch, AdmitBatchAnswers)
FLEET_CONFIRM = Update("confirm", CapacityRequest, CapacityDecision)
FLEET_RELEASE = Update("release", str, str)  # the incident id (incidents of an earlier release)
FLEET_RELEASE_RUN = Update("release_run", ReleaseRequest, str)  # what that incident run holds
FLEET_CONTAIN = Update("contain", CapacityRequest, CapacityDecision)  # a held incident's containment drain
FLEET_PAUSE = Update("pause", OperatorAction, str)
FLEET_RESUME = Update("resume", OperatorAction, str)
FLEET_SET_MODE = Update("set_mode", ModeChange, str)
FLEET_SET_POLICY = Update("set_policy", PolicyChange, str)
FLEET_CONFIGURE = Update("configure", ConfiguredPolicy, str)  # a worker's configured policy, at its start
FLEET_OVERRIDE = Update("override", Override, str)
FLEET_DOMAIN_DECISION = Update("domain_decision", DomainDecision, str)
FLEET_RETURN_NODE = Update("return_node", NodeReturn, str)  # `gpuheal return`: a left node resumed
# `gpuheal rollout` -> the coordinator: a workflow task, so a quiet coordinator sees the new
# current build at once and moves to it (a build without the handler still gets the task).
FLEET_WAKE = Signal("wake", str)
# A worker of this release, at its start, to a coordinator it finds on the cluster's queue (a run
# of the release before, taken over): it continues as new onto its own queue now. (A signal: a
# build without the handler keeps it.)
FLEET_MOVE = Signal("move_to_own_queue", str)
FLEET_STATUS = Query("status", FleetStatus)
FLEET_POLICY = Query("current_policy", VersionedPolicy)
FLEET_VIEW = Memo("fleet", FleetView)  # what `gpuheal fleet` shows, written as it decides
# What the operators' levers read (`gpuheal policy`, `gpuheal domain`), written as they change.
FLEET_POLICY_MEMO = Memo("policy", VersionedPolicy)
FLEET_DOMAINS = Memo("domains", OpenDomains)
FLEET_STATE_FORMAT = Memo("state_format", int)  # what its continue-as-new carries (core.fleet.packing)

# --- a domain failing as a whole (workflows/fleet.py) --------------------------------------------
DOMAIN_INCIDENT = Workflow("DomainIncident", DomainIncidentInput, DomainIncidentResult)
DOMAIN_DECIDE = Update("decide", DomainDecision, str)

# --- one failure of one job (workflows/job_recovery.py) ------------------------------------------
JOB_RECOVERY = Workflow("JobRecovery", JobRecoveryInput, JobRecoveryResult)
RECOVERY_JOIN = Signal("join", RecoveryJoin)  # incident -> recovery (signal-with-start)
RECOVERY_STATUS = Query("status", JobRecoveryStatus)

# Each workflow type and the messages its handlers declare (tests/test_messages.py checks them).
HANDLERS: dict[Workflow[Any, Any], tuple[Update[Any, Any] | Signal[Any] | Query[Any], ...]] = {
    INCIDENT: (
        INCIDENT_REPORT,
        INCIDENT_CAPACITY,
        INCIDENT_JOB_RECOVERED,
        INCIDENT_APPROVE,
        INCIDENT_ABORT,
        INCIDENT_APPROVE_SIGNAL,
        INCIDENT_ABORT_SIGNAL,
        INCIDENT_GIVE_BACK,
        INCIDENT_STATUS,
    ),
    COORDINATOR: (
        FLEET_ADMIT,
        FLEET_ADMIT_MANY,
        FLEET_ADMIT_AND_REQUEST_MANY,
        FLEET_REQUEST_CAPACITY,
        FLEET_REQUEST_CAPACITY_MANY,
        FLEET_CONFIRM,
        FLEET_RELEASE,
        FLEET_RELEASE_RUN,
        FLEET_CONTAIN,
        FLEET_PAUSE,
        FLEET_RESUME,
        FLEET_SET_MODE,
        FLEET_SET_POLICY,
        FLEET_CONFIGURE,
        FLEET_OVERRIDE,
        FLEET_DOMAIN_DECISION,
        FLEET_RETURN_NODE,
        FLEET_WAKE,
        FLEET_MOVE,
        FLEET_STATUS,
        FLEET_POLICY,
    ),
    DOMAIN_INCIDENT: (DOMAIN_DECIDE,),
    JOB_RECOVERY: (RECOVERY_JOIN, RECOVERY_STATUS),
}
