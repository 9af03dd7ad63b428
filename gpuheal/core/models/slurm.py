"""The Slurm side of an incident's activities: a node and its jobs, the validation run, the drain,
the checkpoint ask and wait, the requeue.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from gpuheal.core.models.base import ClusterName, Frozen, NodeName


class NodeRef(Frozen):
    cluster: ClusterName
    node: NodeName
    incident_id: str


class ValidateRequest(Frozen):
    node: NodeRef
    job: str  # the batch script
    timeout_s: float
    run_id: str | None = None  # the incident's first run: its reservation's name (ReplaceRequest.run_id)


class ValidationResult(Frozen):
    passed: bool
    detail: str
    job_id: int | None = None
    by_others: bool = False  # someone else drained it meanwhile: no verdict, theirs to decide
    # The burn-in never ran to an end (pending behind a job at its bound, refused, cancelled,
    # Slurm unreachable): says nothing of the GPUs. The node is kept drained for a person, never
    # condemned (no rejection, no RMA).
    no_verdict: bool = False

    @model_serializer(mode="wrap")
    def _set_fields_only(self, handler: SerializerFunctionWrapHandler) -> Any:
        """Read the same as before by a worker of the release before (its model forbids unknown
        fields): `no_verdict` goes only where it is set."""
        data = handler(self)
        if isinstance(data, dict) and not self.no_verdict:
            data.pop("no_verdict", None)
        return data

    @property
    def ran_and_failed(self) -> bool:
        return not (self.passed or self.by_others or self.no_verdict)


class NodeInfo(Frozen):
    name: str
    state: str
    flags: tuple[str, ...] = ()
    reason: str = ""
    partitions: tuple[str, ...] = ()

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags or self.state in {"drained", "draining"}


class JobProgress(Frozen):
    """What a job last said about its training progress (gpuheal.core.progress is the contract)."""

    step: int
    checkpoint_step: int
    checkpoint_at: float | None = None
    restart: int = 0
    signal: str | None = None  # the signal that makes it checkpoint now (its opt-in), e.g. USR1
    notify: str | None = None  # where its owner wants to hear (beside the Slurm user)


class JobSnapshot(Frozen):
    job_id: int
    name: str
    state: str
    # Flags beside the state (Slurm 23.11+ lists them with it): a requeued job is PENDING with
    # COMPLETING until its old run has ended, and takes no update before that.
    state_flags: tuple[str, ...] = ()
    state_reason: str = ""  # why a pending job waits (Slurm's Reason=, e.g. BeginTime, Resources)
    nodes: str
    node_count: int = 1
    requeueable: bool
    restart_count: int
    excluded_nodes: str = ""
    required_nodes: str = ""
    user: str = ""  # the job's owner (Slurm user name)
    mail_user: str = ""  # --mail-user, where Slurm reports it
    account: str = ""  # the Slurm account the job runs under (a team, for owner routes)
    submit_time: int = 0  # unix time (with the id and restart count: one failure of one job)
    submit_line: str = ""  # the sbatch command line, where Slurm reports it (26.05+): --signal
    progress: JobProgress | None = None

    @property
    def this_runs_progress(self) -> JobProgress | None:
        """The progress line if the run now going wrote it; None when there is none yet, or the
        comment is still an earlier run's (it survives a requeue: its restart count is behind)."""
        line = self.progress
        return line if line is not None and line.restart == self.restart_count else None


class DrainRequest(Frozen):
    node: NodeRef
    reason: str = Field(min_length=1, max_length=200)


class DrainResult(Frozen):
    node: str
    drained_by_us: bool
    already_drained: bool
    previous_reason: str = ""


class JobList(Frozen):
    jobs: tuple[JobSnapshot, ...] = ()


class CheckpointAsk(Frozen):
    """One job asked to checkpoint now, with the signal it asked for."""

    job_id: int
    signal: str = Field(pattern=r"^[A-Z0-9]{2,8}$")  # e.g. USR1
    batch_only: bool = True  # the batch script (B: in --signal, and the progress contract), else its steps
    signalled_at: float = 0.0  # unix time just before the signal went


class CheckpointRequest(Frozen):
    node: str
    asks: tuple[CheckpointAsk, ...]


class CheckpointSent(Frozen):
    asks: tuple[CheckpointAsk, ...] = ()  # those signalled (still running), with the time


class CheckpointOutcome(Frozen):
    job_id: int
    signal: str | None  # None: not signalled (it did not say it handles a signal)
    confirmed: bool
    step: int | None = None
    after_s: float = 0.0
    detail: str


class CheckpointWait(Frozen):
    asks: tuple[CheckpointAsk, ...]
    deadline_at: float  # unix time: the grace ends here, confirmed or not
    unconfirmed_wait_s: float  # a job that publishes no progress is not waited for longer
    poll_interval_s: float = 0.2


class CheckpointResult(Frozen):
    outcomes: tuple[CheckpointOutcome, ...] = ()


class RequeueRequest(Frozen):
    job: JobSnapshot
    failed_node: NodeName
    also_failed: tuple[NodeName, ...] = ()  # the job's other failed nodes (a multi-node job)
    exclude_failed_node: bool = True
    # Nodes gpuheal excluded for this job after earlier failures: let back in where healthy again.
    release_nodes: tuple[NodeName, ...] = ()
    # The job's cluster: where set (recoveries from this release on), every node with an open
    # incident there is excluded too, not only the failed ones: a node failing in the same storm
    # whose drain has not come yet would take the job and fail it again.
    cluster: str = ""


class RequeueResult(Frozen):
    job_id: int
    requeued: bool
    already_requeued: bool = False
    reason: str = ""
    ended_state: str = ""  # it had ended (COMPLETED, FAILED, ...) before it could be requeued
    # Nodes excluded because an open incident was on them (RequeueRequest.cluster): a later
    # recovery of the job lets it back on those that are healthy again.
    avoided: tuple[str, ...] = ()
    restart_count_before: int = 0
    step_at_failure: int | None = None
    checkpoint_step: int | None = None
    checkpoint_at: float | None = None
    node_count: int = 1
