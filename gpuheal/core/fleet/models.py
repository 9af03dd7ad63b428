"""Fleet safety's messages and state: what incidents and operators send the cluster's
coordinator, what it answers, and what it keeps (FleetState, carried across continue-as-new).
Data only; the decisions over them are gpuheal.core.fleet, the coordinator's state changes
gpuheal.core.fleet.coordination."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SerializerFunctionWrapHandler, model_serializer

from gpuheal.core.fleet.policy import FleetPolicy, Mode, VersionedPolicy
from gpuheal.core.models.base import ActionClass, Frozen, NodeName, OperatorName, Severity, Stage
from gpuheal.core.models.incident import RemediationSettings

# What a notice tells operators to run for a node an incident left drained: it resumes the node
# and tells the coordinator at once (a bare `scontrol ... state=resume` frees the budget only at
# the next look for closed runs).
RETURN_COMMAND = "gpuheal return {node} --operator NAME --reason TEXT"


class SentWhereSet(Frozen):
    """A message whose fields in `WHERE_SET` are sent only where they differ from their defaults:
    newer fields (a worker of the release before forbids fields it does not know, and reads what
    it knows alike), and fields mostly at their defaults in a storm's thousand admissions (each
    is history; a reader of any release fills in the same default)."""

    WHERE_SET: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _set_fields_only(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            fields = type(self).model_fields
            for name in self.WHERE_SET:
                if getattr(self, name) == fields[name].default:
                    data.pop(name, None)
        return data


class Placement(SentWhereSet):
    """Where a node sits: its pool, its topology domains, and the sizes the shares are of."""

    node: NodeName
    cluster_size: int = Field(ge=1)
    pool: str = "default"
    pool_size: int = Field(default=1, ge=1)
    domains: dict[str, int] = {}  # domain name ("rack=r1") -> how many nodes it has
    WHERE_SET = ("pool", "pool_size", "domains")


class Admitting(SentWhereSet):
    """What the coordinator reads of an incident introducing itself (coordination.admit)."""

    incident_id: str
    run_id: str = ""  # one incident of the node (its workflow id is the node's, run after run)
    cluster: str
    placement: Placement
    action: ActionClass
    what: str  # the failure, for the breaker's and the escalation's notices
    gpu_uuids: tuple[str, ...] = ()
    gpu_serials: tuple[str, ...] = ()
    application_fault: bool = False  # policy.is_application_fault: counted towards no hardware verdict
    WHERE_SET = ("gpu_uuids", "gpu_serials", "application_fault")


class AdmitRequest(Admitting):
    """The `admit` and `admit_many` updates' request (every release so far)."""

    seed: FleetPolicy  # never read: the seed comes with the start (CoordinatorInput); kept for their models


class AdmitItem(SentWhereSet):
    """One incident in `admit_and_request_many` (issue 36): its admission and, where its action
    takes capacity, its capacity request, decided in one update. No seed, and its policy is
    answered only when it is not the one the worker already holds (`known_policy`)."""

    admit: Admitting
    ask_capacity: bool = False  # decide its capacity request too (if the admitted action takes any)
    contain_if_held: bool = False  # as CapacityRequest.contain_if_held (the policy decides if it drains)
    known_policy: str = ""  # policy.policy_key of the policy this worker holds: not sent back
    WHERE_SET = ("ask_capacity", "contain_if_held", "known_policy")


class Admission(Frozen):
    """What the cluster says to a new incident: its policy and what it knows of the node."""

    policy: VersionedPolicy
    repeat_offender: str | None = None  # why the node (or GPU) must be replaced this time
    domain_incident: str | None = None  # the node's domain is failing as a whole: held there
    breaker: str | None = None  # tripped: why


class AdmitAsk(SentWhereSet):
    """An incident introducing itself to its cluster's coordinator."""

    incident_id: str
    run_id: str = ""
    cluster: str
    node: NodeName
    action: ActionClass
    what: str
    gpu_uuids: tuple[str, ...] = ()
    gpu_serials: tuple[str, ...] = ()
    application_fault: bool = False
    # A rejected spare (ids.rejected_spare_run): it counts for the breaker and its node's repeats,
    # never towards a domain's escalation (bad spares of one batch are not a failing rack).
    no_domains: bool = False
    # Its capacity request too, if its admitted action takes capacity (the coordinator decides it
    # in the same update, unless it is still rebuilding: then the incident asks as before).
    ask_capacity: bool = False
    contain_if_held: bool = False  # as CapacityRequest's
    WHERE_SET = ("no_domains", "ask_capacity", "contain_if_held")


class CapacityRequest(SentWhereSet):
    cluster: str
    incident_id: str
    placement: Placement
    action: ActionClass
    # The incident's run (its first run id): what it holds is its run's, never its node's, so a
    # later incident on the same node does not find an earlier, dead run's grant as its own.
    run_id: str = ""
    # If held, may its node be contained (the policy drains held nodes, and it is not drained
    # yet)? Answered in the same decision (CapacityDecision.contained), not by an update of its own.
    contain_if_held: bool = False
    WHERE_SET = ("contain_if_held",)  # (a coordinator of the release before: activities/fleet.py asks without)


# Requests in one batched update: 20 admissions (each answer carries the policy, ~1 KB) or
# capacity requests stay far below Temporal's payload limit (2 MB) and decide in one short task:
# a batch of 20 beside 950 held took 0.04 s (coordination.request_many serves the line once, and
# only when something was freed), so well inside the SDK's 2 s deadlock bound even on a starved CPU.
BATCH_MOST = 20
# admit_and_request_many's batches: compact (no seed, no policy repeated), so a storm's line goes
# in tens of updates, not hundreds. 200 new incidents beside 950 held decided in 280 ms of one
# workflow task, measured on these 2 cores while a storm benchmark ran; the SDK's deadlock bound
# (2 s) is for the whole task, which may bring one batch from each worker: 100 leaves room for
# several. A storm's batches are far smaller (bench/results/storm.md).
ADMIT_BATCH_MOST = 100


class AdmitRequests(Frozen):
    """Admissions one worker sends together: those that queued while its updates were in flight."""

    requests: tuple[AdmitRequest, ...]


class Admissions(Frozen):
    answers: tuple[Admission, ...]  # in the requests' order


class RunRef(Frozen):
    """One incident run that holds something of the coordinator's (a grant, a place in line)."""

    incident_id: str
    run_id: str = ""  # "" for what coordinators of an earlier release recorded: the latest run
    node: str = ""


class RunRefs(Frozen):
    runs: tuple[RunRef, ...] = ()


class OpenIncident(Frozen):
    """A running incident of the cluster, as visibility and its status query show it: what a
    recreated coordinator rebuilds its grants and its line from."""

    incident_id: str
    run_id: str
    placement: Placement
    stage: Stage
    contained: bool = False  # held, with its node drained as containment
    takes_capacity: bool = True  # its action drains or repairs (an application restart takes none)
    since: datetime | None = None  # when it started: a rebuilt line keeps the order of arrival


class OpenIncidents(Frozen):
    incidents: tuple[OpenIncident, ...] = ()
    # How the coordinator's earlier run ended ("Terminated at 2026-12-01 12:00:00"), if it had
    # one: then this one is a recreation, not the cluster's first.
    earlier_run: str = ""
    left: tuple[OpenIncident, ...] = ()  # nodes Slurm shows drained by an incident no longer open
    drains_unread: str = ""  # why Slurm's drains could not be listed (the rebuild trips the breaker)


class ReleaseRequest(Frozen):
    cluster: str
    incident_id: str
    run_id: str = ""  # "" from incidents of an earlier release: whatever the incident holds
    left_drained: bool = False  # it ends with its node still drained by it: counted until back
    placement: Placement | None = None  # its node: a release the books do not know still counts it left


class CapacityDecision(SentWhereSet):
    granted: bool
    reason: str
    position: int | None = None  # in line, while held
    already: bool = False
    # Asked with contain_if_held and not granted: may its node be contained, and why (None: not
    # decided here; the incident asks the contain update, as before CONTAIN_WITH_REQUEST).
    contained: bool | None = None
    containment: str = ""
    # contained: read only by an incident that asked; the rest: mostly at their defaults
    WHERE_SET = ("contained", "containment", "position", "already")


class CapacityRequests(Frozen):
    """Capacity requests one worker sends together (as AdmitRequests)."""

    requests: tuple[CapacityRequest, ...]


class CapacityDecisions(Frozen):
    answers: tuple[CapacityDecision, ...]  # in the requests' order


class Admitted(SentWhereSet):
    """One answer of `admit_and_request_many`: an Admission, its policy left out when the worker
    holds it (AdmitItem.known_policy), and the capacity decision when it was asked and made."""

    policy: VersionedPolicy | None = None  # None: the one the item named as known
    repeat_offender: str | None = None
    domain_incident: str | None = None
    breaker: str | None = None
    decision: CapacityDecision | None = None
    WHERE_SET = ("policy", "repeat_offender", "domain_incident", "breaker", "decision")


class AdmitBatch(Frozen):
    """Admissions (with their capacity requests) one worker sends together."""

    requests: tuple[AdmitItem, ...]


class AdmitBatchAnswers(Frozen):
    answers: tuple[Admitted, ...]  # in the requests' order


class AdmitAnswer(SentWhereSet):
    admission: Admission
    settings: RemediationSettings  # the worker's (timeouts, grace, Kubernetes): not the policy
    placement: Placement
    # Its capacity request, decided with its admission (AdmitAsk.ask_capacity), when it was.
    decision: CapacityDecision | None = None
    WHERE_SET = ("decision",)


class Grant(Frozen):
    incident_id: str
    run_id: str = ""
    node: str
    pool: str
    domains: tuple[str, ...]
    at: datetime
    override: str | None = None  # operator: reason, when granted past the budget


class Held(Frozen):
    incident_id: str
    run_id: str = ""
    node: str
    placement: Placement
    since: datetime
    reason: str


class Arrival(Frozen):
    at: datetime
    incident_id: str
    run_id: str = ""
    node: str
    domains: tuple[str, ...]
    gpu_uuids: tuple[str, ...] = ()
    gpu_serials: tuple[str, ...] = ()


class Breaker(Frozen):
    tripped: bool = False
    at: datetime | None = None
    why: str = ""
    nodes: tuple[str, ...] = ()
    by: str = ""  # "gpuheal" (it tripped) or the operator who paused or resumed


class DomainIncident(Frozen):
    cluster: str
    domain: str
    incident_id: str  # the domain incident's workflow id
    nodes: tuple[str, ...]
    opened_at: datetime
    decided: Literal["", "release", "dismiss"] = ""
    decided_at: datetime | None = None  # from then on it holds nothing, and only newer reports count


class OperatorAction(Frozen):
    operator: OperatorName
    reason: str = Field(min_length=1, max_length=500)


class NodeReturn(Frozen):
    """An operator returned a node an incident left drained (`gpuheal return`): resumed in Slurm."""

    node: NodeName
    operator: OperatorName
    reason: str = Field(min_length=1, max_length=500)


class Override(Frozen):
    incident_id: str
    operator: OperatorName
    reason: str = Field(min_length=1, max_length=500)


class DomainDecision(Frozen):
    domain: str
    decision: Literal["release", "dismiss"]
    operator: OperatorName
    reason: str = Field(min_length=1, max_length=500)


class DomainDecisionFor(Frozen):
    cluster: str
    decision: DomainDecision


class GrantNotice(Frozen):
    """The coordinator to a held incident: go (granted), or stop (its domain incident dismissed it)."""

    granted: bool
    reason: str


class BudgetUse(Frozen):
    name: str
    used: int
    limit: int


class FleetState(BaseModel):
    """The coordinator's state: carried whole across continue-as-new."""

    cluster: str
    policy: VersionedPolicy
    breaker: Breaker = Breaker()
    grants: dict[str, Grant] = {}
    # Grants taken back before a replacement (breaker, domain incident): the node stays drained
    # and out of service, so it counts against every budget until its incident releases it.
    contained: dict[str, Grant] = {}
    # Held incidents' nodes drained as containment (nothing new lands on them): outside the
    # budget, within a bound of their own (the policy's containment_limit), none while tripped.
    containing: dict[str, Grant] = {}
    queue: list[Held] = []
    arrivals: list[Arrival] = []  # whole, within the windows that need them (repeats.age)
    # Older arrivals within the repeat window, compact: key ("node:N", "serial:S", "uuid:U") ->
    # (epoch seconds, run key), one per incident run (gpuheal.core.fleet.repeats).
    past: dict[str, list[tuple[int, str]]] = {}
    remediations: list[datetime] = []  # grants, for the rate
    last_release: dict[str, datetime] = {}  # node -> when gpuheal last gave it back (cooldown)
    domain_incidents: dict[str, DomainIncident] = {}
    decisions: int = 0
    # The sizes the shares are of, as the latest placements said ("cluster", "pool P", "domain D"),
    # so that what the coordinator shows is computed on the real cluster, not on one node.
    sizes: dict[str, int] = {}
    reaped_at: datetime | None = None  # when the coordinator last looked for closed runs
    # When it last asked Slurm whether the nodes left drained are back, for an incident held
    # meanwhile (reaping.left_check_due): a node an operator returned frees its slot within seconds.
    left_checked_at: datetime | None = None
    # Nodes closed runs left drained (node -> the grant): still out, still counted (gpuheal.core.fleet.reaping).
    left: dict[str, Grant] = {}
    # Left nodes an operator returned (`gpuheal return`) that no look has seen back yet: node ->
    # when. Still counted (in `left`): the command resumes them in Slurm after telling the
    # coordinator, and a resume can fail (reaping.left_check_due asks Slurm soon after).
    returning: dict[str, datetime] = {}
    configured: str = ""  # the digest of the last configuration a worker offered (steering.configure)
    # The digests offered before it, oldest first (at most steering.CONFIGURED_BEFORE_MOST): an older
    # worker restarting mid-rollout offers one of them again, and it is refused.
    configured_before: list[str] = []
    # A rule of the run deciding, not state: never carried, set by each coordinator run from its
    # patch (workflows/fleet.py; runs before it grant by the budget alone, to replay).
    _grants_within_all_out: bool = PrivateAttr(default=True)
    # Indexes over arrivals and queue (gpuheal.core.fleet.index): derived, never carried, and no
    # part of what a state is (two states with the same books are equal, indexed or not).
    _arrival_index: Any = PrivateAttr(default=None)
    _line_index: Any = PrivateAttr(default=None)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FleetState):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__ and self._rules() == other._rules()

    def _rules(self) -> dict[str, Any]:
        private = self.__pydantic_private__ or {}
        return {k: v for k, v in private.items() if k not in ("_arrival_index", "_line_index")}

    @property
    def grants_within_all_out(self) -> bool:
        """A grant keeps everything out (granted, taken back, left, contained while held) within
        the budget plus the containment bound, even when more are contained than the bound allows
        now (it was lowered, or a recreated coordinator found them drained)."""
        return self._grants_within_all_out

    def decide_grants_by_the_budget_alone(self) -> None:
        """As coordinators before GRANTS_WITHIN_ALL_OUT did (their histories replay so)."""
        self._grants_within_all_out = False

    def books(self) -> tuple[dict[str, Grant], dict[str, Grant], dict[str, Grant]]:
        """Where a run's hold on its node is kept (by incident id): granted, taken back, contained."""
        return self.grants, self.contained, self.containing


class OpenDomain(Frozen):
    """An open domain incident, in a line (its nodes counted, not listed: the memo stays small)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    domain: str
    incident_id: str
    nodes: int = 0


class OpenDomains(Frozen):
    """The domain incidents an operator may decide (`gpuheal domain`), as the coordinator's memo
    publishes them (read from the server: it answers while the coordinator is too busy)."""

    model_config = ConfigDict(frozen=True, extra="ignore")  # a newer coordinator's still reads

    incidents: tuple[OpenDomain, ...] = ()


class FleetStatus(SentWhereSet):
    model_config = ConfigDict(frozen=True, extra="ignore")  # a newer coordinator's answer still reads

    cluster: str
    mode: Mode
    policy_version: int
    breaker: Breaker
    out_of_service: tuple[Grant, ...]
    held: tuple[Held, ...]
    budget: tuple[BudgetUse, ...]
    domain_incidents: tuple[DomainIncident, ...]
    remediations_in_window: int
    containment: BudgetUse | None = None  # held nodes drained as containment, and their bound
    containing: tuple[Grant, ...] = ()
    left: tuple[Grant, ...] = ()  # drained by incident runs that closed without giving back: counted
    # Each list's whole length where the answer cut it (view.STATUS_MOST); empty: every list whole
    # (and from a release before the cut). A query's answer rides in a workflow task's completion,
    # which gRPC caps at 4 MB: 10,000 held were 3.5 MB.
    totals: dict[str, int] = {}
    WHERE_SET = ("totals",)  # (sent only when cut: a reader of the release before forbids it)


Note = tuple[str, Severity, str]  # a notice to the operators: event, severity, message


# --- the workflows' inputs (their names and messages: gpuheal.core.messages; ids: gpuheal.core.ids)


class CoordinatorInput(SentWhereSet):
    cluster: str
    seed: FleetPolicy
    # The starting worker's configuration digest (policy_file.digest, computed where the
    # configuration was read: what it set, not its defaults), so a restart of it changes nothing.
    seed_digest: str = ""
    state: FleetState | None = None  # carried across continue-as-new
    notes: tuple[Note, ...] = ()  # ... with the notices still on their way
    domains: tuple[DomainIncident, ...] = ()  # ... and the domain incidents not yet opened
    # Started (or carried) onto its own queue (ids.coordinator_queue), as this release starts it.
    # Unset: started on the cluster's queue by the release before; it moves (workflows/fleet.py).
    # (The queue is told by the input, not by workflow.info(): that names the worker's queue,
    # which a Replayer's is not.)
    on_own_queue: bool = False
    WHERE_SET = ("on_own_queue",)


class DomainIncidentInput(Frozen):
    cluster: str
    incident: DomainIncident
    decide_within_s: float = 3600.0
    default: Literal["release", "dismiss"] = "release"


class DomainIncidentResult(Frozen):
    domain: str
    nodes: tuple[str, ...]
    decision: DomainDecision
    coordinator: str
