"""The Kubernetes-native provider, for Slurm-on-Kubernetes clusters (Slinky and the like).

Deleting the Node (or its Cluster API Machine, gpuheal/providers/cluster_api.py) makes the node
group create a new one; the
provider waits, heartbeating, for a new Ready node in the same pool that has joined Slurm, and
reserves it for the incident run (an annotation under a resourceVersion precondition).
A GPU reset or a reboot is not a Kubernetes operation: it goes to GPUHEAL_REPAIR_HOOK when one
is set (an exec hook that, say, calls the BMC), and otherwise the workflow replaces the node.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.service import RPCError

from gpuheal.clients import kube, proc, runs
from gpuheal.clients.slurm import SlurmBackend
from gpuheal.core.errors import SettingsError
from gpuheal.core.models.base import ActionClass
from gpuheal.core.models.replacement import HealthCheckResult, RepairResult, ReplacementResult
from gpuheal.providers import cluster_api
from gpuheal.providers.base import Hold, NoSpareCapacity, ProviderContext, unsupported_repair
from gpuheal.providers.exec_hook import ExecHookProvider, repair_hook

CLAIM_RECHECK_S = 30.0  # how often a search asks Temporal about one claim's run


class KubernetesProvider:
    def __init__(
        self,
        slurm: SlurmBackend,
        api: client.ApiClient,
        pool_label: str = kube.POOL_LABEL,
        timeout_s: float = 900,
        repairer: ExecHookProvider | None = None,
        machine_namespaces: tuple[str, ...] = (),
        machine_cluster: str | None = None,
    ) -> None:
        self._slurm = slurm
        self._core = client.CoreV1Api(api)
        self._machines = cluster_api.Machines(api, machine_namespaces, machine_cluster)
        self._pool_label = pool_label
        self._timeout = timeout_s
        self._repairer = repairer

    async def repair(self, node: str, action: ActionClass) -> RepairResult:
        if self._repairer is None:
            return unsupported_repair(node, action, "the kubernetes")
        return await self._repairer.repair(node, action)

    async def replace(
        self, node: str, key: str, earlier: ReplacementResult | None = None, hold: Hold | None = None
    ) -> ReplacementResult:
        """Delete the failed Node (or its Machine), then reserve the first new Node of its pool.

        A replacement is a Node of the failed node's pool that was not there when this incident
        run's search began: on its first try, any Node the pool's list did not name; on a later
        try (the failed Node gone), one created after the newest Node the pool had then, by the
        apiserver's own clock (`since`: no skew with the worker's). It is *reserved* by annotating
        it with this run under a resourceVersion precondition, so two incidents never take one
        Node. No new Node within the provider's bound is "no capacity" (the workflow's capacity
        wait goes on from there), not an error retried for hours."""
        memory = earlier or _heartbeat_memory(node)
        pool, since = (memory.pool, memory.since) if memory is not None else (None, None)
        failed_uid = memory.failed_uid if memory is not None else None
        rejected = memory.rejected if memory is not None else ()
        known: set[str] | None = None  # the pool's nodes at the first try: never "the new one"
        try:
            failed = await kube.call(self._core.read_node, node)
        except ApiException as err:
            if err.status != 404:
                raise
            failed = None  # deleted by an earlier try: only the wait is left
        if failed is not None and failed_uid is not None and failed.metadata.uid != failed_uid:
            failed = None  # a new Node under the failed one's name (fixed hostnames): the replacement
        if failed is not None:
            if memory is None or since is None:  # the first try: what the pool has now is "before"
                pool = (failed.metadata.labels or {}).get(self._pool_label, "")
                before = (await kube.call(self._core.list_node, label_selector=self._selector(pool))).items
                known = {n.metadata.name for n in before}
                since = max(n.metadata.creation_timestamp for n in before)  # the failed node is among them
                failed_uid = failed.metadata.uid
            # Remembered before the delete: a crash right after it still knows where to look.
            searched = _searched(node, pool, since, failed_uid, rejected)
            proc.heartbeat({"searched": searched.model_dump(mode="json")})
            try:
                await self._delete(failed)
            except cluster_api.Refused as err:  # nothing deleted: no new node will come
                raise NoSpareCapacity(f"{err}: replace {node} by hand", searched) from err
        searched = _searched(node, pool, since, failed_uid, rejected)
        if pool is None or since is None:
            # The Node went before any try of this run read its pool (a person deleted it): any
            # fresh node of any pool could be taken for it. Say so instead of guessing.
            raise NoSpareCapacity(
                f"{node} is gone from Kubernetes and its pool is unknown: replace it by hand", searched
            )
        new = await self._reserve_new_node(searched, known, key)
        return searched.model_copy(update={"new_node": new})

    async def _delete(self, failed: Any) -> None:
        if failed.metadata.deletion_timestamp is not None:
            return  # on its way out already (its Machine's deletion drains it, then deletes it)
        if cluster_api.managed(failed):  # its MachineSet makes a new Machine (and Node)
            await self._machines.delete_machine_of(failed)
            return
        try:
            await kube.call(self._core.delete_node, failed.metadata.name)
        except ApiException as err:
            if err.status != 404:
                raise

    def _selector(self, pool: str) -> str:
        return f"{self._pool_label}={pool}" if pool else f"!{self._pool_label}"

    async def _reserve_new_node(self, searched: ReplacementResult, known: set[str] | None, key: str) -> str:
        pool, since = searched.pool or "", searched.since
        assert since is not None
        deadline = time.monotonic() + self._timeout
        crashed: set[str] = set()  # claim holders whose run crashed out
        asked: dict[str, float] = {}  # claim holder -> when it may be asked again
        while time.monotonic() < deadline:
            in_slurm = await self._slurm.nodes()
            nodes = await kube.call(self._core.list_node, label_selector=self._selector(pool))
            for n in sorted(nodes.items, key=lambda n: str(n.metadata.name)):
                name = str(n.metadata.name)
                if name in searched.rejected:
                    continue  # this run's, but its GPUs failed validation: it stays reserved, drained
                holder = (n.metadata.annotations or {}).get(kube.REPLACES_ANNOTATION)
                if holder == key:
                    return name  # this run reserved it on an earlier try
                if n.spec.unschedulable or kube.REJECTED_LABEL in (n.metadata.labels or {}):
                    continue  # cordoned, or its burn-in failed (or said nothing): never a spare
                new = name not in known if known is not None else n.metadata.creation_timestamp > since
                # Idle only: a node already running a job (mixed) took it unvalidated, and a
                # burn-in (--exclusive) would wait behind it to no verdict.
                serving = name in in_slurm and in_slurm[name].state == "idle"
                ready = n.metadata.deletion_timestamp is None and kube.node_ready(n)
                if not (new and ready and serving):
                    continue
                if holder is not None:
                    # Asked at most every CLAIM_RECHECK_S per holder (a storm's load on Temporal);
                    # a crash is for good, so once seen it is not asked again.
                    if holder not in crashed and time.monotonic() >= asked.get(holder, 0.0):
                        asked[holder] = time.monotonic() + CLAIM_RECHECK_S
                        if await _claim_is_stale(holder):
                            crashed.add(holder)
                    if holder not in crashed:
                        continue  # another incident run's, open or ended its own way
                if await self._claim(n, key):  # (over a stale claim: the precondition still decides)
                    return name
            # The pool and start ride on the heartbeat: a retry after a crash goes on from them.
            proc.heartbeat(
                {
                    "waiting": f"for the node group of pool {pool or '(unlabelled)'} to bring a new node",
                    "searched": searched.model_dump(mode="json"),
                }
            )
            await asyncio.sleep(2)
        raise NoSpareCapacity(
            f"no new Ready node in pool {pool or '(unlabelled)'} joined Slurm within {self._timeout:.0f} s", searched
        )

    async def _claim(self, n: Any, key: str) -> bool:
        """Annotate the Node as this run's, only if nobody changed it since it was read."""
        patch = {
            "metadata": {"resourceVersion": n.metadata.resource_version, "annotations": {kube.REPLACES_ANNOTATION: key}}
        }
        try:
            await kube.call(self._core.patch_node, n.metadata.name, patch)
        except ApiException as err:
            if err.status == 409:  # another incident (or anything) changed it first: look again
                return False
            raise
        return True

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


def _searched(
    node: str, pool: str | None, since: datetime | None, uid: str | None, rejected: tuple[str, ...] = ()
) -> ReplacementResult:
    return ReplacementResult(failed_node=node, new_node=None, pool=pool, since=since, failed_uid=uid, rejected=rejected)


async def _claim_is_stale(holder: str) -> bool:
    """A claim (INCIDENT/RUN) whose incident run crashed out (terminated, failed) holds nothing:
    it must not keep its spare from every later incident. One that completed stands (its node
    went into service, or was rejected and is marked so). Unknowable (no Temporal here, no run
    in the claim, Temporal not answering): it stands."""
    incident, _, run = holder.partition("/")
    if not run or not activity.in_activity():
        return False
    try:
        return await runs.run_crashed_out(activity.client(), incident, run, activity.info().workflow_id or "")
    except RPCError:
        return False


def _heartbeat_memory(node: str) -> ReplacementResult | None:
    """What an earlier attempt of this activity heartbeated about its search (its pool, start)."""
    if not activity.in_activity():
        return None
    for detail in activity.info().heartbeat_details:
        if isinstance(detail, dict) and isinstance(detail.get("searched"), dict):
            searched = ReplacementResult.model_validate(detail["searched"])
            if searched.failed_node == node:
                return searched
    return None


def build(ctx: ProviderContext) -> KubernetesProvider:
    if ctx.kube is None:
        raise SettingsError("GPUHEAL_PROVIDER=kubernetes needs GPUHEAL_KUBECONFIG or GPUHEAL_K8S_IN_CLUSTER=1")
    return KubernetesProvider(
        ctx.slurm,
        ctx.kube,
        timeout_s=ctx.timeout_s,
        repairer=repair_hook(ctx),
        machine_namespaces=ctx.settings.machine_namespaces(),
        machine_cluster=ctx.settings.capi_cluster,
    )
