"""The Kubernetes-native provider, for Slurm-on-Kubernetes clusters (Slinky and the like).

Deleting the Node (or its Cluster API Machine) makes the node group create a new one; the
provider waits, heartbeating, for a new Ready node in the same pool that has joined Slurm.
A GPU reset or a reboot is not a Kubernetes operation: it goes to GPUHEAL_REPAIR_HOOK when one
is set (an exec hook that, say, calls the BMC), and otherwise the workflow replaces the node.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity

from gpuheal.clients import kube, proc
from gpuheal.clients.slurm import SlurmBackend
from gpuheal.core.errors import SettingsError
from gpuheal.core.models import ActionClass, HealthCheckResult, RepairResult, ReplacementResult
from gpuheal.providers.base import ProviderContext, unsupported_repair
from gpuheal.providers.exec_hook import ExecHookProvider, repair_hook

MACHINE_ANNOTATION = "cluster.x-k8s.io/machine"


class KubernetesProvider:
    def __init__(
        self,
        slurm: SlurmBackend,
        api: client.ApiClient,
        pool_label: str = kube.POOL_LABEL,
        timeout_s: float = 900,
        repairer: ExecHookProvider | None = None,
    ) -> None:
        self._slurm = slurm
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._pool_label = pool_label
        self._timeout = timeout_s
        self._repairer = repairer

    async def repair(self, node: str, action: ActionClass) -> RepairResult:
        if self._repairer is None:
            return unsupported_repair(node, action, "the kubernetes")
        return await self._repairer.repair(node, action)

    async def replace(self, node: str, incident_id: str) -> ReplacementResult:
        # A replacement is a node created after this replacement began (its first attempt, so a
        # retry after a crash still recognises it) that was not in the pool before.
        since = _first_attempt_time()
        try:
            failed = await kube.call(self._core.read_node, node)
        except ApiException as err:
            if err.status != 404:
                raise
            failed = None  # deleted by an earlier attempt: only the wait is left
        pool = None
        known: set[str] = set()  # nodes of the pool that were there before: never "the new one"
        if failed is not None:
            pool = (failed.metadata.labels or {}).get(self._pool_label)
            selector = f"{self._pool_label}={pool}" if pool else self._pool_label
            known = {n.metadata.name for n in (await kube.call(self._core.list_node, label_selector=selector)).items}
            machine = (failed.metadata.annotations or {}).get(MACHINE_ANNOTATION)
            if machine:  # Cluster API: the MachineSet makes a new Machine
                await kube.call(
                    self._custom.delete_namespaced_custom_object,
                    "cluster.x-k8s.io",
                    "v1beta1",
                    machine.split("/")[0],
                    "machines",
                    machine.split("/")[-1],
                )
            else:
                await kube.call(self._core.delete_node, node)
        new = await self._wait_new_node(pool, since, known)
        return ReplacementResult(failed_node=node, new_node=new, already_done=False)

    async def _wait_new_node(self, pool: str | None, since: datetime, known: set[str]) -> str:
        deadline = time.monotonic() + self._timeout
        selector = f"{self._pool_label}={pool}" if pool else self._pool_label
        while time.monotonic() < deadline:
            in_slurm = await self._slurm.nodes()
            nodes = await kube.call(self._core.list_node, label_selector=selector)
            for n in nodes.items:
                name = n.metadata.name
                created = n.metadata.creation_timestamp
                fresh = name not in known and n.metadata.deletion_timestamp is None and created >= since
                if fresh and kube.node_ready(n) and name in in_slurm and in_slurm[name].state in {"idle", "mixed"}:
                    return str(name)
            proc.heartbeat(f"waiting for the node group of pool {pool} to bring a new node")
            await asyncio.sleep(2)
        raise TimeoutError(f"no new Ready node in pool {pool} joined Slurm within {self._timeout:.0f} s")

    async def decommission(self, node: str, reason: str) -> str:
        return f"{node} was deleted from Kubernetes at replacement"

    async def adopt(self, node: str) -> str:
        """Relabelled into the training pool, the node gets its slurmd from the Slurm operator
        (Slinky's NodeSet); wait until Slurm has it."""
        deadline = time.monotonic() + self._timeout
        while time.monotonic() < deadline:
            info = (await self._slurm.nodes()).get(node)
            if info is not None and info.state in {"idle", "mixed", "allocated"}:
                return f"{node} joined Slurm"
            proc.heartbeat(f"waiting for {node} to join Slurm")
            await asyncio.sleep(2)
        raise TimeoutError(f"{node} did not join Slurm within {self._timeout:.0f} s")

    async def release(self, node: str, reason: str) -> str:
        if node in await self._slurm.nodes():
            await self._slurm.update_node(node, "drain", reason)  # the operator removes its slurmd
        return f"{node} drained in Slurm; its slurmd goes with the training label"

    async def check_health(self, node: str) -> HealthCheckResult:
        n = await kube.call(self._core.read_node, node)
        ready = kube.node_ready(n)
        return HealthCheckResult(node=node, healthy=ready, detail="Ready" if ready else "NotReady")


def _first_attempt_time() -> datetime:
    if activity.in_activity():
        return activity.info().scheduled_time - timedelta(seconds=5)  # allow for clock skew
    return datetime.now(UTC) - timedelta(seconds=5)  # called outside an activity (tests, tools)


def build(ctx: ProviderContext) -> KubernetesProvider:
    if ctx.kube is None:
        raise SettingsError("GPUHEAL_PROVIDER=kubernetes needs GPUHEAL_KUBECONFIG or GPUHEAL_K8S_IN_CLUSTER=1")
    return KubernetesProvider(ctx.slurm, ctx.kube, timeout_s=ctx.timeout_s, repairer=repair_hook(ctx))
