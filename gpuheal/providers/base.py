"""The provider interface: how a platform repairs a node or gets a new one.

The workflow only says *what* (reset this GPU, replace that node); a provider knows *how* on one
platform. Every method is idempotent per incident: it reads the current state (and its own
record of what it did for the incident) before it acts, so a retried activity never takes a
second spare. Long waits call :func:`clients.proc.heartbeat`, and the activities' timeouts come
from ``RemediationSettings.provider_timeout_s``, the same bound a provider waits for.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from temporalio import activity

from gpuheal.clients.slurm import SlurmBackend
from gpuheal.core.models.base import ActionClass
from gpuheal.core.models.replacement import HealthCheckResult, RepairResult, ReplacementResult
from gpuheal.core.settings import ProviderSettings

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

# Keeps a new node from taking jobs until its GPUs are validated (a maintenance reservation on
# it), called with its name. A provider that brings the node into Slurm itself calls it before
# the node joins; the replacement activity calls it for any other, as soon as it is known.
Hold = Callable[[str], Awaitable[None]]


class NodeProvider(Protocol):
    async def repair(self, node: str, action: ActionClass) -> RepairResult:
        """Reset the GPU or reboot the node. ``repaired=False`` when the platform cannot."""
        ...

    async def replace(
        self, node: str, key: str, earlier: ReplacementResult | None = None, hold: Hold | None = None
    ) -> ReplacementResult:
        """Bring a healthy node into the cluster in place of `node`; returns it once it serves.
        `key` is the incident run's (:func:`run_key`): what the provider records its choice under.
        Raises NoSpareCapacity when there is none to be had. `earlier` is this incident run's
        last try (its pool and start), for a try after the failed node is gone. `hold`, when
        given, is called with the new node's name before it joins Slurm, where the provider can."""
        ...

    async def decommission(self, node: str, reason: str) -> str:
        """Take `node` out of the cluster for good (it goes for repair or RMA)."""
        ...

    async def check_health(self, node: str) -> HealthCheckResult: ...

    async def adopt(self, node: str) -> str:
        """A node borrowed from inference joins Slurm (its slurmd runs); returns once it serves."""
        ...

    async def release(self, node: str, reason: str) -> str:
        """A borrowed node leaves Slurm again (its jobs have moved off), for the inference side."""
        ...


class NoSpareCapacity(RuntimeError):
    """No node to replace with, now. `searched` is what the next try goes on from."""

    def __init__(self, why: str, searched: ReplacementResult | None = None) -> None:
        super().__init__(why)
        self.searched = searched


def run_key(incident_id: str, run_id: str | None = None) -> str:
    """What a provider records its choice under: the incident's run, never only its node's id
    (an incident id names a node, and its next failure is a new run that needs a new spare).
    The run is the incident's first (`run_id`, sent by the workflow), which a Temporal reset
    keeps: a reset run finds the spare its first run took. A request from a release that sent
    none falls back to the activity's own run."""
    run = run_id or (activity.info().workflow_run_id if activity.in_activity() else "")
    return f"{incident_id}/{run}" if run else incident_id


@dataclass
class ProviderContext:
    """What a provider may use, built once by the worker."""

    settings: ProviderSettings
    timeout_s: float  # RemediationSettings.provider_timeout_s: the activities' timeouts agree with it
    slurm: SlurmBackend
    kube: ApiClient | None = None  # the worker's Kubernetes identity, when Kubernetes is on


def unsupported_repair(node: str, action: ActionClass, provider: str) -> RepairResult:
    return RepairResult(
        action=action,
        repaired=False,
        detail=f"{provider} provider cannot {action.value} {node} (set GPUHEAL_REPAIR_HOOK for that): replacing it",
    )
