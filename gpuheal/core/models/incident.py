"""What an incident is started with and what it decides: its settings (approval, Kubernetes,
borrowing, job recovery), its input, and the decisions it records.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from gpuheal.core.envvars import section, setting
from gpuheal.core.models.base import ActionClass, Frozen, OperatorName, Verdict
from gpuheal.core.models.report import HealthReport


class ApprovalPolicy(Frozen):
    """Which action classes wait for a human, for how long, and what happens on silence."""

    required_for: tuple[ActionClass, ...] = setting(
        "GPUHEAL_APPROVAL_REQUIRED",
        (),
        "comma list of action classes that wait for a human (`replace_node,reboot_node`)",
    )
    timeout_s: float = setting("GPUHEAL_APPROVAL_TIMEOUT_S", 900.0, "how long to wait for approve / abort", gt=0)
    default_on_timeout: Verdict = setting(
        "GPUHEAL_APPROVAL_DEFAULT", "abort", "what silence means: `abort` or `approve`"
    )


class KubernetesPolicy(Frozen):
    """The Kubernetes half (Slurm on Kubernetes): present when the worker talks to a cluster."""

    node_label: str | None = setting(
        "GPUHEAL_K8S_NODE_LABEL",
        None,
        "Node label that holds the Slurm node name",
        unset="none: the names are equal",
        pattern=r"^[A-Za-z0-9./_-]{1,253}$",
    )
    no_execute: bool = setting(
        "GPUHEAL_K8S_NO_EXECUTE", False, "`1`: also taint NoExecute (evicts pods that do not tolerate it)"
    )
    drain_deadline_s: float = setting(
        "GPUHEAL_K8S_DRAIN_DEADLINE_S", 300.0, "how long PDB-blocked evictions are retried", gt=0
    )
    on_pdb_timeout: Literal["delete", "hold"] = setting(
        "GPUHEAL_K8S_ON_PDB_TIMEOUT",
        "hold",
        "then: `hold` the incident for a human's approve/abort, or `delete` the pod anyway "
        "(needs rbac-force-delete.yaml)",
    )


class BorrowPolicy(Frozen):
    """When no spare exists: borrow a GPU node from an inference pool in Kubernetes, never taking
    a Deployment there below its PodDisruptionBudget or below `floor` ready replicas."""

    pool: str = Field(
        pattern=r"^[A-Za-z0-9._-]{1,63}$",
        description="no spare: borrow a node from the inference pool with this `gpuheal.io/pool` label",
        json_schema_extra={"env": "GPUHEAL_BORROW_POOL", "unset": "none: no borrowing"},
    )
    floor: int = setting(
        "GPUHEAL_BORROW_FLOOR", 1, "never take an inference Deployment below this many ready replicas", ge=0
    )
    give_back_wait_s: float = setting(
        "GPUHEAL_BORROW_GIVE_BACK_WAIT_S",
        86400.0,
        "how long a borrowed node may wait, drained, for its last jobs to leave before it goes back"
        " (it never goes back with a job on it: past this, a person decides)",
        gt=0,
    )


# Declared once, held twice: by the incident's settings and by the job recovery's it passes on.
def _verify_timeout_s() -> Any:
    return setting(
        "GPUHEAL_VERIFY_TIMEOUT_S", 1800.0, "how long a requeued job may take to train past its checkpoint", gt=0
    )


def _gpus_per_node() -> Any:
    return setting("GPUHEAL_GPUS_PER_NODE", 8, "GPUs per node, for the GPU-time-lost figure", ge=1)


class JobRecoverySettings(Frozen):
    gather_s: float = setting(
        "GPUHEAL_JOB_GATHER_S", 2.0, "a job recovery waits this long for incidents on the job's other nodes", ge=0
    )
    verify_timeout_s: float = _verify_timeout_s()
    start_wait_s: float = setting(
        "GPUHEAL_JOB_START_WAIT_S",
        7200.0,
        "a requeued job's verify deadline counts from when it runs again; it may wait this long in Slurm"
        " first (for a replacement and its burn-in)",
        ge=0,
    )
    retry_budget: int = setting("GPUHEAL_JOB_RETRY_BUDGET", 3, "requeues by gpuheal of one job ...", ge=1)
    retry_window_s: float = setting(
        "GPUHEAL_JOB_RETRY_WINDOW_S", 24 * 3600.0, "... within this window; one more failure holds the job", gt=0
    )
    gpus_per_node: int = _gpus_per_node()


class RemediationSettings(Frozen):
    """The worker's configuration of how remediation runs (timeouts, grace, Kubernetes): the
    incident reads it from the worker when it is admitted, so its history records it. The
    cluster's policy (mode, budget, approval, breaker) is the coordinator's: gpuheal.core.fleet."""

    kubernetes: KubernetesPolicy | None = section(only_with=("GPUHEAL_KUBECONFIG", "GPUHEAL_K8S_IN_CLUSTER"))
    borrow: BorrowPolicy | None = section(only_with=("GPUHEAL_BORROW_POOL",))
    checkpoint_grace_s: float = setting(
        "GPUHEAL_CHECKPOINT_GRACE_S", 30.0, "at most this long for each signalled job to confirm a checkpoint", ge=0
    )
    checkpoint_unconfirmed_wait_s: float = setting(
        "GPUHEAL_CHECKPOINT_UNCONFIRMED_WAIT_S",
        5.0,
        "a signalled job that publishes no progress is waited for this long",
        ge=0,
    )
    verify_timeout_s: float = _verify_timeout_s()
    # No spare: retry the replacement every capacity_retry_s, for at most capacity_wait_s.
    capacity_wait_s: float = setting(
        "GPUHEAL_CAPACITY_WAIT_S", 1800.0, "no spare: how long to keep trying for a replacement", gt=0
    )
    capacity_retry_s: float = setting("GPUHEAL_CAPACITY_RETRY_S", 60.0, "... and how often", gt=0)
    jobs: JobRecoverySettings = JobRecoverySettings()
    # The repair and replace activities' timeouts are derived from it, so the two always agree.
    provider_timeout_s: float = setting(
        "GPUHEAL_PROVIDER_TIMEOUT_S", 900.0, "how long a provider may take to repair or replace a node", gt=0
    )
    gpus_per_node: int = _gpus_per_node()
    # Before a repaired node takes jobs again: a burn-in job through Slurm on it, in a maintenance
    # reservation only gpuheal's user may use (the provider's health check alone says "Ready").
    validate_job: str | None = setting(
        "GPUHEAL_VALIDATE_JOB",
        None,
        "a batch script Slurm runs on a repaired or new node before it takes jobs (exit 0: its GPUs pass;"
        " e.g. `dcgmi diag -r 2`)",
        unset="no burn-in: the provider's health check only",
    )
    validate_timeout_s: float = setting(
        "GPUHEAL_VALIDATE_TIMEOUT_S", 1800.0, "how long the validation may run before it counts as failed", gt=0
    )


class RemediationInput(Frozen):
    """A report says what failed, never how to remediate: the policy is the cluster's."""

    report: HealthReport
    # A follow-up run: the reports after `report` that came with it, and the run whose plan it
    # outgrew (a more severe report than that run's plan handles, after the plan was set).
    also: tuple[HealthReport, ...] = ()
    follows: str | None = None

    @model_serializer(mode="wrap")
    def _set_fields_only(self, handler: SerializerFunctionWrapHandler) -> Any:
        """A start reads the same as before to a worker of the release before (during a rolling
        upgrade or a rollback; its model forbids unknown fields): the follow-up's fields go only
        where they are set."""
        data = handler(self)
        if isinstance(data, dict):
            for name in ("also", "follows"):
                if not getattr(self, name):
                    data.pop(name, None)
        return data


class Decision(Frozen):
    """An operator's approve or abort."""

    operator: OperatorName
    reason: str = Field(min_length=1, max_length=500)


POLICY_OPERATOR = "gpuheal-policy"  # who decided when no person did in time (the policy's default)


class RecordedDecision(Frozen):
    verdict: Verdict
    operator: str
    reason: str
    at: datetime
    by_timeout: bool = False
