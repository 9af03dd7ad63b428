"""Node providers for Slurm-on-Kubernetes clusters, and a hook for cloud APIs.

- KubeSandboxProvider: the sandbox's "node group". A replacement is a new kwok Node in the failed
  node's pool plus the spare's slurmd; a removed node's Node object is deleted.
- KubernetesProvider: Kubernetes-native. Deleting the Node (or its Cluster API Machine) makes the
  node group create a new one; the provider waits for a new Ready node in the same pool that has
  joined Slurm. GPU reset and reboot are not Kubernetes operations: they go to a hook.
- ExecHookProvider: the documented hook for cloud APIs (README, "Providers"): an executable
  called as `HOOK replace NODE INCIDENT`, `HOOK repair NODE ACTION`, `HOOK decommission NODE
  REASON` or `HOOK health NODE`, printing one JSON object. It must be idempotent per incident.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.providers import SandboxProvider
from activities.slurm import SlurmClient, check_node_name
from gpuheal.models import ActionClass, HealthCheckResult, ReplacementResult

POOL_LABEL = "gpuheal.io/pool"
MACHINE_ANNOTATION = "cluster.x-k8s.io/machine"


async def _k8s(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(fn, *args, _request_timeout=15, **kwargs)


def kwok_node(name: str, pool: str) -> client.V1Node:
    """A Node that kwok keeps Ready (the annotation is kwok's selector in infra/k8s/cluster.sh)."""
    return client.V1Node(
        metadata=client.V1ObjectMeta(
            name=name,
            labels={POOL_LABEL: pool, "kubernetes.io/hostname": name, "type": "kwok"},
            annotations={"kwok.x-k8s.io/node": "fake"},
        )
    )


def node_ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))


async def wait_node_ready(core: client.CoreV1Api, name: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if node_ready(await _k8s(core.read_node, name)):
                return
        except ApiException as err:
            if err.status != 404:
                raise
        await asyncio.sleep(0.5)
    raise TimeoutError(f"Kubernetes node {name} not Ready within {timeout_s:.0f} s")


class KubeSandboxProvider(SandboxProvider):
    def __init__(self, slurm: SlurmClient, sandbox_dir: Path, script: Path, core: client.CoreV1Api) -> None:
        super().__init__(slurm, sandbox_dir, script)
        self._core = core

    async def replace(self, node: str, incident_id: str) -> ReplacementResult:
        new, already = await self._choose_spare(node, incident_id)
        failed = await _k8s(self._core.read_node, node)
        pool = (failed.metadata.labels or {}).get(POOL_LABEL, "default")
        try:
            await _k8s(self._core.create_node, kwok_node(new, pool))
        except ApiException as err:
            if err.status != 409:  # created by an earlier attempt
                raise
        await wait_node_ready(self._core, new)
        await self._start_spare(new)  # the new node's slurmd joins Slurm
        return ReplacementResult(failed_node=node, new_node=new, already_done=already)

    async def decommission(self, node: str, reason: str) -> str:
        msg = await super().decommission(node, reason)
        try:
            await _k8s(self._core.delete_node, node)
            return msg + f"; Kubernetes node {node} deleted"
        except ApiException as err:
            if err.status != 404:
                raise
            return msg + f"; Kubernetes node {node} already gone"


class KubernetesProvider:
    def __init__(self, slurm: SlurmClient, api: client.ApiClient, pool_label: str = POOL_LABEL) -> None:
        self._slurm = slurm
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._pool_label = pool_label

    async def repair(self, node: str, action: ActionClass) -> str:
        raise ApplicationError(
            f"{action} of {node} is not a Kubernetes operation: configure GPUHEAL_PROVIDER=exec with a hook",
            non_retryable=True,
        )

    async def replace(self, node: str, incident_id: str) -> ReplacementResult:
        # A replacement is a node created after this replacement began (its first attempt, so a
        # retry after a crash still recognises it) that was not in the pool before.
        since = _first_attempt_time()
        try:
            failed = await _k8s(self._core.read_node, node)
        except ApiException as err:
            if err.status != 404:
                raise
            failed = None  # deleted by an earlier attempt: only the wait is left
        pool = None
        known: set[str] = set()  # nodes of the pool that were there before: never "the new one"
        if failed is not None:
            pool = (failed.metadata.labels or {}).get(self._pool_label)
            selector = f"{self._pool_label}={pool}" if pool else self._pool_label
            known = {n.metadata.name for n in (await _k8s(self._core.list_node, label_selector=selector)).items}
            machine = (failed.metadata.annotations or {}).get(MACHINE_ANNOTATION)
            if machine:  # Cluster API: the MachineSet makes a new Machine
                await _k8s(
                    self._custom.delete_namespaced_custom_object,
                    "cluster.x-k8s.io",
                    "v1beta1",
                    machine.split("/")[0],
                    "machines",
                    machine.split("/")[-1],
                )
            else:
                await _k8s(self._core.delete_node, node)
        new = await self._wait_new_node(node, pool, since, known)
        return ReplacementResult(failed_node=node, new_node=new, already_done=False)

    async def _wait_new_node(
        self, failed: str, pool: str | None, since: datetime, known: set[str], timeout_s: float = 900
    ) -> str:
        deadline = time.monotonic() + timeout_s
        selector = f"{self._pool_label}={pool}" if pool else self._pool_label
        while time.monotonic() < deadline:
            in_slurm = await self._slurm.nodes()
            nodes = await _k8s(self._core.list_node, label_selector=selector)
            for n in nodes.items:
                name = n.metadata.name
                created = n.metadata.creation_timestamp
                fresh = name not in known and n.metadata.deletion_timestamp is None and created >= since
                if fresh and node_ready(n) and name in in_slurm and in_slurm[name].state in {"idle", "mixed"}:
                    return str(name)
            await asyncio.sleep(2)
        raise TimeoutError(f"no new Ready node in pool {pool} joined Slurm within {timeout_s:.0f} s")

    async def decommission(self, node: str, reason: str) -> str:
        return f"{node} was deleted from Kubernetes at replacement"

    async def check_health(self, node: str) -> HealthCheckResult:
        n = await _k8s(self._core.read_node, node)
        return HealthCheckResult(node=node, healthy=node_ready(n), detail="Ready" if node_ready(n) else "NotReady")


def _first_attempt_time() -> datetime:
    try:
        return activity.info().scheduled_time - timedelta(seconds=5)  # allow for clock skew
    except RuntimeError:  # called outside an activity (tests, tools)
        return datetime.now(UTC) - timedelta(seconds=5)


class ExecHookProvider:
    def __init__(self, hook: str, timeout_s: float = 900) -> None:
        self._hook = hook
        self._timeout = timeout_s

    async def _run(self, *args: str) -> dict[str, Any]:
        proc = await asyncio.create_subprocess_exec(
            self._hook, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await asyncio.wait_for(proc.communicate(), self._timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"provider hook {args[0]} failed ({proc.returncode}): {err.decode()[-500:]}")
        result: dict[str, Any] = json.loads(out or b"{}")
        return result

    async def repair(self, node: str, action: ActionClass) -> str:
        return str((await self._run("repair", check_node_name(node), action.value)).get("message", "repaired"))

    async def replace(self, node: str, incident_id: str) -> ReplacementResult:
        out = await self._run("replace", check_node_name(node), incident_id)
        return ReplacementResult(failed_node=node, new_node=check_node_name(str(out["new_node"])))

    async def decommission(self, node: str, reason: str) -> str:
        return str((await self._run("decommission", check_node_name(node), reason)).get("message", "removed"))

    async def check_health(self, node: str) -> HealthCheckResult:
        out = await self._run("health", check_node_name(node))
        return HealthCheckResult(node=node, healthy=bool(out["healthy"]), detail=str(out.get("detail", "")))
