"""The incident's state, in one model: what its handlers read and write, what `status` shows and
what its close reports. The workflow holds one IncidentState; its helpers take it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from temporalio import workflow

from gpuheal.workflows.incident.ledger import JobLedger

with workflow.unsafe.imports_passed_through():
    from gpuheal.core import policy, render
    from gpuheal.core.fleet.models import CapacityDecision, GrantNotice, Placement
    from gpuheal.core.fleet.policy import FleetPolicy, VersionedPolicy
    from gpuheal.core.models.base import ActionClass, NodeAt, Stage
    from gpuheal.core.models.incident import Decision, RecordedDecision, RemediationSettings
    from gpuheal.core.models.kubernetes import BorrowedNode, CordonResult, KubeNodeRef
    from gpuheal.core.models.replacement import EarlierReplacement, ReplacementResult
    from gpuheal.core.models.report import HealthReport
    from gpuheal.core.models.result import RemediationResult, StageRecord
    from gpuheal.core.models.slurm import DrainResult, NodeRef, ValidationResult
    from gpuheal.core.policy import Triage
    from gpuheal.core.rma import RmaEvidence


@dataclass
class IncidentState:
    ref: NodeRef
    reports: list[HealthReport]
    # The run part of its notices' keys: each run tells its own (follow_up.notice_key). Its
    # holdings stay its first run id's: a follow-up run continues that chain (the coordinator's).
    notice_key: str = ""
    duplicates: int = 0  # reports received again (signal-with-start re-delivers the first)
    notices: dict[str, int] = field(default_factory=dict)  # how often each event was told (its keys)

    # Where it is: the stage now, every stage so far, and a line per stage for the UI.
    stage: Stage = Stage.TRIAGE
    stages: list[StageRecord] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    action: ActionClass | None = None  # set at triage; a later, more severe report escalates it
    planned: bool = False  # the plan was read for the last time: a more severe report follows up
    # The early steps went side by side (remediation.EARLY_STEPS_SIDE_BY_SIDE): a more severe
    # report escalates the run in any stage until the plan is set (the cordon beside the
    # checkpoint wait is the last stage started, and not one ESCALATABLE names).
    escalates_until_planned: bool = False

    # Set when the coordinator admits the incident: the worker's settings, the cluster's policy
    # (recorded in history by the admission's result), where the node sits, a repeat offender.
    settings: RemediationSettings = field(default_factory=RemediationSettings)
    policy: VersionedPolicy | None = None
    placement: Placement | None = None
    repeat: str | None = None
    admitted_as_application_fault: bool = False  # what its last admission told the coordinator
    # Its capacity request, decided with its admission (capacity.ADMIT_WITH_REQUEST): the answer
    # its first request takes instead of asking again.
    admitted_decision: CapacityDecision | None = None
    capacity_asked: bool = False  # its admission asked for capacity (the worker may not have passed it on)
    not_in_service: str | None = None  # Slurm has the node, not in service (FUTURE): why, as it said
    burn_in: str | None = None  # an application fault one too many for its GPU: why (ladder.py)
    burn_in_verdict: Literal["passed", "failed"] | None = None
    rma: RmaEvidence | None = None  # what goes to the vendor (gathered at the close)
    kube: KubeNodeRef | None = None  # set when the node is also a Kubernetes node
    earlier: EarlierReplacement | None = None  # a late report for a node gpuheal replaced

    # Answers that handlers bring in (signals and updates).
    grant: GrantNotice | None = None  # the coordinator: a held incident may go (or is dismissed)
    held_for: str = ""
    awaiting_approval: bool = False
    decision: RecordedDecision | None = None
    give_back_by: Decision | None = None  # an operator asked for the borrowed node back
    follow_up: HealthReport | None = None  # the first report that outgrew the plan (follow_up.py)

    # What it has done: the facts its close reports.
    drain: DrainResult | None = None
    cordon: CordonResult | None = None
    jobs: JobLedger = field(default_factory=JobLedger)
    replacement: ReplacementResult | None = None
    new_node_verdict: ValidationResult | None = None  # the replacement's burn-in, where validation is on
    rejected: tuple[str, ...] = ()  # new nodes whose GPUs failed validation: drained, never taken again
    unvalidated: str | None = None  # a new node whose burn-in gave no verdict: kept drained, no other tried
    borrowed: BorrowedNode | None = None
    capacity_back_at: datetime | None = None
    node_at: NodeAt = render.UNTOUCHED
    result: RemediationResult | None = None

    @property
    def first_report(self) -> HealthReport:
        """The report that started the incident (its failure time is the MTTR's start)."""
        return self.reports[0]

    @property
    def cluster_policy(self) -> FleetPolicy:
        return self.policy.policy if self.policy is not None else FleetPolicy()

    @property
    def observing(self) -> bool:
        return self.cluster_policy.mode == "observe"

    def current_action(self) -> ActionClass:
        if self.action is not None:
            return self.action
        return policy.as_admitted(policy.triage_all(self.reports).action, self.repeat)

    def reason(self) -> str:
        verdict = policy.triage_all(self.reports)
        kept = self._kept_out(verdict)
        return f"{kept[1]} (this time: {verdict.reason})" if kept else verdict.reason

    def drain_why(self) -> str:
        """The reason as a drain gives it to Slurm: a word for why the node is out where it is
        more than the failure (one kept for a burn-in, or as a repeat offender, is not the
        application's to resume), the failure, then the rest. A reason is cut at Slurm's length
        (policy.drain_reason), and Slurm logs nothing for a drain with the reason the node has:
        what tells this failure from the node's last comes before any cut."""
        verdict = policy.triage_all(self.reports)
        kept = self._kept_out(verdict)
        if kept is None:
            return verdict.reason
        tag, why = kept
        return f"{tag}: {verdict.reason}; {why.removeprefix(f'{tag}: ')}"

    def _kept_out(self, verdict: Triage) -> tuple[str, str] | None:
        """Why the node is out beyond this failure, as (a word for it, the whole why): its
        burn-in, or its repeats (an ignored report makes no repeat offender). One rule for the
        reason and the drain's."""
        if self.burn_in:
            return "burn-in", self.burn_in
        if self.repeat and verdict.action != ActionClass.IGNORE:
            return policy.REPEAT_OFFENDER, self.repeat
        return None
