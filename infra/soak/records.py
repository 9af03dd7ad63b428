"""What the systems recorded during a soak, as plain values, and the parsers of their real formats.

The checker (infra.soak.invariants) reads only these: slurmctld's log (drains, resumes, requeues,
allocations, and each training job's progress, which the job writes into its comment), Slurm
sampled every second, Temporal's histories of every run, the sandbox provider's spare record, and
the soak's own schedule of what it injected. Nothing here asks gpuheal what it did.

Times are seconds since the epoch (UTC): slurmctld logs its host's local time, which the soak
runs in UTC (`TZ=UTC` in the daemons' environment), and `log_clock_skew` checks it did: a log read
in another zone would put every event outside the soak and its checks would pass on nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

# How gpuheal names what it does, as Slurm shows it (docs/operating.md): a workflow id is
# "gpuheal-{cluster}-{node}" for an incident, and a drain's reason starts with the id and a colon.
ID_PREFIX = "gpuheal-"


def incident_workflow_id(cluster: str, node: str) -> str:
    return f"{ID_PREFIX}{cluster}-{node}"


def ours(reason: str, cluster: str) -> bool:
    """A drain reason gpuheal wrote for this cluster (an incident's or a domain incident's)."""
    head, colon, _ = reason.partition(":")
    return bool(colon) and head.startswith(f"{ID_PREFIX}{cluster}-")


# How gpuheal's give-back drains say why, after the incident id (gpuheal.core.policy.GIVES_BACK):
# written here again on purpose, so a give-back gpuheal words otherwise later counts against the
# bound until the checker is told of it.
GIVES_BACK = "borrowed node goes back"


def gives_back(reason: str, cluster: str) -> bool:
    """A drain gpuheal wrote to give a borrowed node back to its pool."""
    return ours(reason, cluster) and reason.partition(":")[2].strip().startswith(GIVES_BACK)


LogKind = Literal["reason", "drain", "resume", "down", "requeue", "allocate", "progress", "end", "cordon", "uncordon"]


@dataclass(frozen=True)
class LogEvent:
    """One line of slurmctld's log that the checker reads."""

    at: float
    cluster: str
    kind: LogKind
    node: str = ""  # reason, drain, resume, down: the node; allocate, end: the job's first node
    job: int = 0  # requeue, allocate, progress
    # reason: the reason; drain: the node's reason when it was drained; end: the job's state;
    # cordon, uncordon: the incident that set (or cleared) its annotation on the Kubernetes Node
    text: str = ""
    step: int = 0  # progress: the job's training step
    restart: int = 0  # progress: how many times the job restarted


@dataclass(frozen=True)
class NodeSample:
    """Slurm's nodes at one moment (the soak samples each cluster every second): the drained
    ones and the DOWN ones, each with its reason (a node in neither is in service, or FUTURE:
    out of the cluster)."""

    at: float
    cluster: str
    drained: Mapping[str, str]
    down: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Run:
    """One incident run, as Temporal's history of it says (its start, its close, its result)."""

    cluster: str
    workflow_id: str
    run_id: str
    node: str
    started: float
    closed: float | None  # None: still open at the end of the soak
    status: str  # Temporal's: COMPLETED, FAILED, TERMINATED, CANCELED, TIMED_OUT, CONTINUED_AS_NEW, RUNNING
    outcome: str = ""  # the result's outcome (COMPLETED runs)
    node_state: str = ""  # the result's node state
    job_fates: Mapping[int, str] = field(default_factory=dict)  # job id -> fate named in the result
    jobs_ended_by_it: frozenset[int] = frozenset()  # jobs the result says gpuheal itself ended
    waiting_for: str = ""  # open at the end: the person it waits for ("approval"), if any
    stage: str = ""  # its stage as it last said (gpuheal's `Stage` search attribute)
    bound_s: float = 0.0  # the longest it may stay open (the policy's hold and capacity bounds)
    borrows: tuple[str, ...] = ()  # what each of its borrow_node stages said (COMPLETED runs' results)

    chain: str = ""  # the key of its chain's first run (a continue-as-new chain is one incident)
    chain_started: float = 0.0  # when that first run began: the bound counts from there

    @property
    def key(self) -> str:
        return f"{self.workflow_id}/{self.run_id}"

    @property
    def incident(self) -> str:
        """The incident this run is part of: its chain's first run (itself when it has none)."""
        return self.chain or self.key

    def open_at(self, t: float) -> bool:
        return self.started <= t and (self.closed is None or t <= self.closed)


@dataclass(frozen=True)
class Grant:
    """A grant of the cluster's budget to an incident run, from the coordinator's history."""

    cluster: str
    run_key: str
    granted_at: float
    released_at: float | None


@dataclass(frozen=True)
class BreakerChange:
    """The coordinator's breaker, tripped or not, as its history records it; `operator` names who
    resumed it when an operator's resume made the change."""

    cluster: str
    at: float
    tripped: bool
    operator: str = ""


@dataclass(frozen=True)
class SpareGiven:
    """The sandbox provider's record: a spare node given to an incident run's replacement, when,
    and the spare it replaces when the run's first one failed its validation."""

    cluster: str
    run_key: str
    spare: str
    at: float = 0.0
    instead_of: str = ""


@dataclass(frozen=True)
class Bound:
    """From `at` on, the most nodes gpuheal's decisions may hold drained in the cluster (its
    budget plus its containment), as the policy in force then says."""

    cluster: str
    at: float
    most: int


@dataclass(frozen=True)
class JobEnd:
    """A job's state at the end of the soak (Slurm's), and whether the soak itself ended it."""

    cluster: str
    job: int
    state: str
    by_soak: bool = False


# slurmctld's log: "[2026-12-06T08:17:20.820] update_node: node gpu01 state set to DRAINING"
_LINE = re.compile(r"^\[(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)\] (?P<msg>.*)$")
_REASON = re.compile(r"^update_node: node (?P<node>\S+) reason set to: (?P<reason>.*)$")
_STATE = re.compile(r"^update_node: node (?P<node>\S+) state set to (?P<state>[A-Z_+]+)\s*$")
_REQUEUE = re.compile(r"^Requeuing JobId=(?P<job>\d+)")
_ALLOCATE = re.compile(r"^sched: Allocate JobId=(?P<job>\d+) NodeList=(?P<nodes>\S+)")
_PROGRESS = re.compile(
    r"^_update_job: setting comment to gpuheal step=(?P<step>\d+) .*?restart=(?P<restart>\d+).* for JobId=(?P<job>\d+)$"
)
_DRAIN_STATES = frozenset({"DRAIN", "DRAINED", "DRAINING"})
_RESUME_STATES = frozenset({"IDLE", "RESUME", "ALLOCATED", "MIXED", "UNDRAIN"})
_DOWN_STATES = frozenset({"DOWN", "FUTURE", "POWER_DOWN", "POWERED_DOWN"})


def _epoch(ts: str) -> float:
    return datetime.fromisoformat(ts).replace(tzinfo=UTC).timestamp()


def first_node(nodelist: str) -> str:
    """The first node of a Slurm hostlist ("gpu01", "gpu[01-03,07]", "a1,b2")."""
    head = re.match(r"^([^,\[]+)(?:\[([^\],-]+))?", nodelist)
    if head is None:
        return nodelist
    return head.group(1) + (head.group(2) or "")


def parse_slurmctld(lines: Iterable[str], cluster: str) -> list[LogEvent]:
    """The events of slurmctld's log the checker reads, in the log's order. A drain carries the
    reason set for its node last (slurmctld logs the reason, then the state, for one update)."""
    events: list[LogEvent] = []
    reasons: dict[str, str] = {}
    for raw in lines:
        line = _LINE.match(raw.rstrip("\n"))
        if line is None:
            continue
        at, msg = _epoch(line["ts"]), line["msg"]
        if m := _REASON.match(msg):
            reasons[m["node"]] = m["reason"]
            events.append(LogEvent(at, cluster, "reason", node=m["node"], text=m["reason"]))
        elif m := _STATE.match(msg):
            state = m["state"].split("+")[0]
            if state in _DRAIN_STATES:
                events.append(LogEvent(at, cluster, "drain", node=m["node"], text=reasons.get(m["node"], "")))
            elif state in _RESUME_STATES:
                reasons.pop(m["node"], None)
                events.append(LogEvent(at, cluster, "resume", node=m["node"]))
            elif state in _DOWN_STATES:
                events.append(LogEvent(at, cluster, "down", node=m["node"], text=reasons.get(m["node"], "")))
        elif m := _REQUEUE.match(msg):
            events.append(LogEvent(at, cluster, "requeue", job=int(m["job"])))
        elif m := _ALLOCATE.match(msg):
            events.append(LogEvent(at, cluster, "allocate", node=first_node(m["nodes"]), job=int(m["job"])))
        elif m := _PROGRESS.match(msg):
            events.append(
                LogEvent(at, cluster, "progress", job=int(m["job"]), step=int(m["step"]), restart=int(m["restart"]))
            )
    return events


def parse_spares(text: str, cluster: str) -> list[SpareGiven]:
    """The sandbox provider's log of spares given (provider/given.jsonl): a JSON line each time it
    chose a spare for a run, {"at", "key": "<workflow id>/<run id>", "spare", "instead_of"}."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        given = json.loads(line)
        if not isinstance(given, dict) or not {"at", "key", "spare"} <= given.keys():
            raise ValueError(f"line {n} of the provider's spare log is not a spare given: {line[:120]!r}")
        instead_of = str(given.get("instead_of") or "")
        out.append(SpareGiven(cluster, str(given["key"]), str(given["spare"]), float(given["at"]), instead_of))
    return out


# Slurm's jobcomp/filetxt log: a line each time a job's stay on its nodes ends (a requeue too,
# with the state it went back to), "JobId=4 UserId=... JobState=FAILED ... EndTime=... NodeList=gpu01 ..."
_JOBCOMP = re.compile(
    r"^JobId=(?P<job>\d+) .*?\bJobState=(?P<state>\S+) .*?\bEndTime=(?P<end>\S+) NodeList=(?P<nodes>\S+)"
)


def parse_jobcomp(lines: Iterable[str], cluster: str) -> list[LogEvent]:
    """Each end Slurm's job completion log records: when (its EndTime), the job, its state then,
    and the node it ran on. A job's last line is Slurm's account of how it ended."""
    out = []
    for raw in lines:
        if m := _JOBCOMP.match(raw.strip()):
            node, job = first_node(m["nodes"]), int(m["job"])
            out.append(LogEvent(_epoch(m["end"]), cluster, "end", node=node, job=job, text=m["state"]))
    return out


# How gpuheal marks a Node it cordoned (docs/slurm-kubernetes.md): an annotation naming the incident.
INCIDENT_ANNOTATION = "gpuheal.io/incident"


def parse_audit(lines: Iterable[str], cluster: str) -> list[LogEvent]:
    """What the apiserver's audit log (audit.k8s.io/v1 Events, a JSON line each) says was done to
    each Node: a patch that set gpuheal's incident annotation is a cordon by that incident, one
    that cleared it an uncordon. Only requests the apiserver carried out (a 2xx) count."""
    out = []
    for raw in lines:
        if not raw.strip():
            continue
        e = json.loads(raw)
        ref, status = e.get("objectRef") or {}, (e.get("responseStatus") or {}).get("code", 0)
        if (
            e.get("verb") != "patch"
            or ref.get("resource") != "nodes"
            or ref.get("subresource")
            or not 200 <= status < 300
        ):
            continue
        annotations = ((e.get("requestObject") or {}).get("metadata") or {}).get("annotations") or {}
        if INCIDENT_ANNOTATION not in annotations:
            continue
        incident = annotations[INCIDENT_ANNOTATION]
        at = datetime.fromisoformat(e["stageTimestamp"].replace("Z", "+00:00")).timestamp()
        kind: LogKind = "cordon" if incident else "uncordon"
        out.append(LogEvent(at, cluster, kind, node=ref.get("name", ""), text=incident or ""))
    return out


CLOCK_SKEW_S = 300.0  # a log's last line this far from its file's last write is in another zone


def log_clock_skew(lines: list[str], modified: float) -> float:
    """How far the log's last timestamp, read as UTC, is from when the file was last written (its
    mtime, the kernel's clock): about 0 when slurmctld logs in UTC, hours when it does not."""
    for raw in reversed(lines):
        if line := _LINE.match(raw.rstrip("\n")):
            return _epoch(line["ts"]) - modified
    if any(raw.strip() for raw in lines):  # lines, none of them slurmctld's format: read as nothing
        raise ValueError("no line of the log has slurmctld's timestamp ([YYYY-MM-DDThh:mm:ss.fff])")
    return 0.0
