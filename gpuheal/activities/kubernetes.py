"""Kubernetes activities, for Slurm clusters whose nodes are also Kubernetes nodes.

Through the official `kubernetes` client, as against any cluster: a kubeconfig (the sandbox's,
or a ServiceAccount's) or the in-cluster config. The RBAC they need is infra/k8s/rbac.yaml:
nodes get/list/watch/patch/delete, pods list, pods/eviction create, events create.

The Slurm drain always comes first (the workflow orders it): evicting pods tells Slurm nothing.
Each activity reads the node before it acts, so a retry after a crash or an apiserver outage
does nothing twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from gpuheal.activities import interface as act
from gpuheal.activities.interface import implements
from gpuheal.clients.kube import POOL_LABEL, call, node_ready
from gpuheal.core.errors import UNKNOWN_NODE
from gpuheal.core.models.incident import BorrowPolicy
from gpuheal.core.models.kubernetes import (
    BorrowedNode,
    BorrowRequest,
    BorrowResult,
    CordonRequest,
    CordonResult,
    EvictRequest,
    EvictResult,
    KubeEvent,
    KubeNodeRef,
    MapNodeRequest,
)

TAINT_KEY = "gpuheal.io/gpu-failure"
INCIDENT_ANNOTATION = "gpuheal.io/incident"
CORDONED_BY_US = "gpuheal.io/cordoned-by-gpuheal"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
BORROWED_BY = "gpuheal.io/borrowed-by"  # label (selectable): the incident, on a borrowed node
BORROWED_FROM = "gpuheal.io/borrowed-from"  # annotation: the pool it goes back to
BORROW_TRIES = 3  # choices lost to another incident's precondition before "nothing to borrow"


class KubernetesActivities:
    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.policy = client.PolicyV1Api(api)

    @implements(act.MAP_KUBE_NODE)
    async def map_kube_node(self, req: MapNodeRequest) -> KubeNodeRef:
        """The Kubernetes Node behind a Slurm node: by label when configured, else same name."""
        slurm = req.ref.node
        if req.node_label:
            nodes = await call(self.core.list_node, label_selector=f"{req.node_label}={slurm}")
            names = [n.metadata.name for n in nodes.items]
        else:
            try:
                names = [(await call(self.core.read_node, slurm)).metadata.name]
            except ApiException as err:
                if err.status != 404:
                    raise
                names = []
        if len(names) != 1:
            how = f"label {req.node_label}={slurm}" if req.node_label else f"name {slurm}"
            raise ApplicationError(
                f"expected one Kubernetes node with {how}, found {len(names)}: {names}",
                type=UNKNOWN_NODE,
                non_retryable=True,
            )
        return KubeNodeRef(slurm_node=slurm, kube_node=names[0], incident_id=req.ref.incident_id)

    @implements(act.CORDON_AND_TAINT_NODE)
    async def cordon_and_taint_node(self, req: CordonRequest) -> CordonResult:
        name, incident = req.node.kube_node, req.node.incident_id
        node = await call(self.core.read_node, name)
        annotations = node.metadata.annotations or {}
        if annotations.get(INCIDENT_ANNOTATION) == incident:
            return CordonResult(
                node=name, cordoned_by_others=annotations.get(CORDONED_BY_US) != "true", already_done=True
            )
        by_others = bool(node.spec.unschedulable)
        effects = ["NoSchedule", *(["NoExecute"] if req.no_execute else [])]
        taints = [t for t in (node.spec.taints or []) if t.key != TAINT_KEY]
        taints += [client.V1Taint(key=TAINT_KEY, value=label_safe(incident), effect=e) for e in effects]
        await call(
            self.core.patch_node,
            name,
            {
                "metadata": {
                    "annotations": {INCIDENT_ANNOTATION: incident, CORDONED_BY_US: "false" if by_others else "true"}
                },
                "spec": {"unschedulable": True, "taints": [t.to_dict() for t in taints]},
            },
        )
        return CordonResult(node=name, cordoned_by_others=by_others, already_done=False)

    @implements(act.EVICT_PODS)
    async def evict_pods(self, req: EvictRequest) -> EvictResult:
        """Evict every pod on the node through the Eviction API (PodDisruptionBudgets apply).
        A 429 is retried until the deadline; then the pod is deleted (policy `delete`) or
        reported as blocked for the workflow to hold."""
        return await self._evict_node(req.node.kube_node, req.deadline_s, req.delete_when_blocked, req.poll_interval_s)

    async def _evict_node(
        self, name: str, deadline_s: float, delete_when_blocked: bool = False, poll_interval_s: float = 1.0
    ) -> EvictResult:
        deadline = time.monotonic() + deadline_s
        evicted: set[str] = set()
        kept: set[str] = set()
        retries = 0
        while True:
            pods = await call(self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={name}")
            blocked = []
            for pod in pods.items:
                key = f"{pod.metadata.namespace}/{pod.metadata.name}"
                if _stays(pod):
                    kept.add(key)
                    continue
                if pod.metadata.deletion_timestamp is not None:
                    evicted.add(key)  # on its way out (an earlier attempt evicted it)
                    continue
                body = client.V1Eviction(
                    metadata=client.V1ObjectMeta(name=pod.metadata.name, namespace=pod.metadata.namespace)
                )
                try:
                    await call(
                        self.core.create_namespaced_pod_eviction, pod.metadata.name, pod.metadata.namespace, body
                    )
                    evicted.add(key)
                except ApiException as err:
                    if err.status == 404:
                        evicted.add(key)
                    elif err.status == 429:  # a PodDisruptionBudget says not now
                        blocked.append(key)
                    else:
                        raise
            if not blocked:
                return EvictResult(
                    evicted=tuple(sorted(evicted)), kept=tuple(sorted(kept)), blocked=(), retries_429=retries
                )
            if time.monotonic() >= deadline:
                deleted: list[str] = []
                if delete_when_blocked:
                    for key in blocked:
                        ns, pod_name = key.split("/", 1)
                        await call(self.core.delete_namespaced_pod, pod_name, ns)
                        deleted.append(key)
                    blocked = []
                return EvictResult(
                    evicted=tuple(sorted(evicted)),
                    kept=tuple(sorted(kept)),
                    blocked=tuple(blocked),
                    deleted=tuple(deleted),
                    retries_429=retries,
                )
            retries += 1
            activity.heartbeat({"blocked_by_pdb": blocked, "retries": retries})
            await asyncio.sleep(min(poll_interval_s * 2 ** min(retries, 4), 10))

    # --- borrowing from inference ------------------------------------------------------------

    @implements(act.BORROW_INFERENCE_NODE)
    async def borrow_inference_node(self, req: BorrowRequest) -> BorrowResult:
        """A Ready node of the inference pool whose pods can go without any Deployment there
        dropping below its PodDisruptionBudget or the configured floor: cordoned, its pods evicted
        through the Eviction API, relabelled into the failed node's pool. Read before acting: a
        node this incident already borrowed is returned as is."""
        mine = await call(self.core.list_node, label_selector=f"{BORROWED_BY}")
        for n in mine.items:
            if (n.metadata.labels or {}).get(BORROWED_BY) == label_safe(req.incident_id):
                pool = (n.metadata.annotations or {}).get(BORROWED_FROM, req.policy.pool)
                return BorrowResult(node=n.metadata.name, from_pool=pool, already_done=True)
        failed = await call(self.core.read_node, req.failed.kube_node)
        training_pool = (failed.metadata.labels or {}).get(POOL_LABEL, "default")
        for _ in range(BORROW_TRIES):
            choice, _chosen_at, why = await self._borrowable(req.policy)
            if choice is None:
                return BorrowResult(node=None, why=why)
            # Read again just before taking it: the scan above is long, and a kubelet's status
            # update meanwhile must not read as another incident's claim.
            now = await call(self.core.read_node, choice)
            free = not now.spec.unschedulable and BORROWED_BY not in (now.metadata.labels or {})
            if free and await self._take(choice, now.metadata.resource_version, req):
                break
            why = f"other incidents took each node chosen first ({BORROW_TRIES} tries)"
        else:
            return BorrowResult(node=None, why=why)
        evicted = await self._evict_node(choice, req.deadline_s)
        if evicted.blocked:  # a PDB changed its mind meanwhile: give it back untouched
            await self._return_node(choice, req.policy.pool)
            return BorrowResult(node=None, why=f"evictions blocked on {choice}: {list(evicted.blocked)}")
        await call(
            self.core.patch_node,
            choice,
            {"metadata": {"labels": {POOL_LABEL: training_pool}}, "spec": {"unschedulable": False}},
        )
        return BorrowResult(node=choice, evicted=evicted.evicted, from_pool=req.policy.pool)

    async def _take(self, name: str, version: str, req: BorrowRequest) -> bool:
        """Cordon and mark the node as this incident's, only if it is as it was when chosen (a
        resourceVersion precondition): of two incidents choosing one node, one gets it."""
        patch = {
            "metadata": {
                "resourceVersion": version,
                "labels": {BORROWED_BY: label_safe(req.incident_id)},
                "annotations": {BORROWED_FROM: req.policy.pool, INCIDENT_ANNOTATION: req.incident_id},
            },
            "spec": {"unschedulable": True},
        }
        try:
            await call(self.core.patch_node, name, patch)
        except ApiException as err:
            if err.status == 409:  # changed since it was read: choose again
                return False
            raise
        return True

    async def _borrowable(self, policy: BorrowPolicy) -> tuple[str | None, str, str]:
        """The inference node with the fewest pods whose owners can spare them (with the
        resourceVersion it was chosen at), or why none."""
        nodes = await call(self.core.list_node, label_selector=f"{POOL_LABEL}={policy.pool}")
        ready = [
            n
            for n in nodes.items
            if node_ready(n) and not n.spec.unschedulable and BORROWED_BY not in (n.metadata.labels or {})
        ]
        if not ready:
            return None, "", f"no Ready node in pool {policy.pool}"
        reasons = []
        best: tuple[int, str, str] | None = None
        for n in ready:
            name = n.metadata.name
            pods = await self._workload_pods(name)
            refusal = await self._refusal(pods, policy)
            if refusal:
                reasons.append(f"{name}: {refusal}")
            elif best is None or len(pods) < best[0]:
                best = (len(pods), name, n.metadata.resource_version)
        if best is None:
            return None, "", "; ".join(reasons)
        return best[1], best[2], ""

    async def _workload_pods(self, node: str) -> list[Any]:
        pods = await call(self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}")
        return [p for p in pods.items if not _stays(p) and p.metadata.deletion_timestamp is None]

    async def _refusal(self, pods: list[Any], policy: BorrowPolicy) -> str:
        """Why these pods cannot go now (a Deployment would drop below its floor or its PDB)."""
        by_owner: dict[tuple[str, str], int] = {}
        for pod in pods:
            owner = await self._deployment_of(pod)
            if owner is not None:
                by_owner[owner] = by_owner.get(owner, 0) + 1
        for (ns, name), count in by_owner.items():
            dep = await call(self.apps.read_namespaced_deployment, name, ns)
            ready = dep.status.ready_replicas or 0
            if ready - count < policy.floor:
                return f"Deployment {ns}/{name} would have {ready - count} ready, under its floor {policy.floor}"
        for pod in pods:
            for pdb in (await call(self.policy.list_namespaced_pod_disruption_budget, pod.metadata.namespace)).items:
                selector = pdb.spec.selector.match_labels or {}
                labels = pod.metadata.labels or {}
                if selector and all(labels.get(k) == v for k, v in selector.items()):
                    if (pdb.status.disruptions_allowed or 0) < 1:
                        return f"PodDisruptionBudget {pdb.metadata.name} allows no disruption now"
        return ""

    async def _deployment_of(self, pod: Any) -> tuple[str, str] | None:
        for ref in pod.metadata.owner_references or []:
            if ref.kind == "ReplicaSet":
                rs = await call(self.apps.read_namespaced_replica_set, ref.name, pod.metadata.namespace)
                for up in rs.metadata.owner_references or []:
                    if up.kind == "Deployment":
                        return pod.metadata.namespace, up.name
        return None

    @implements(act.GIVE_BACK_NODE)
    async def give_back_node(self, node: BorrowedNode) -> str:
        """Back to its inference pool (relabelled, uncordoned): its Deployments schedule there
        again. Only a node this incident borrowed."""
        n = await call(self.core.read_node, node.node)
        if (n.metadata.labels or {}).get(BORROWED_BY) != label_safe(node.incident_id):
            return f"{node.node} is not borrowed by this incident (already given back?)"
        await self._return_node(node.node, node.from_pool)
        return f"{node.node} back in inference pool {node.from_pool}"

    async def _return_node(self, name: str, pool: str) -> None:
        await call(
            self.core.patch_node,
            name,
            {
                "metadata": {
                    "labels": {POOL_LABEL: pool, BORROWED_BY: None},
                    "annotations": {BORROWED_FROM: None, INCIDENT_ANNOTATION: None},
                },
                "spec": {"unschedulable": False},
            },
        )

    @implements(act.UNCORDON_NODE)
    async def uncordon_node(self, ref: KubeNodeRef) -> str:
        """Undo our cordon and taint after a passed health check; never someone else's cordon."""
        node = await call(self.core.read_node, ref.kube_node)
        annotations = node.metadata.annotations or {}
        ours = annotations.get(INCIDENT_ANNOTATION) == ref.incident_id
        taints = [t.to_dict() for t in (node.spec.taints or []) if t.key != TAINT_KEY]
        we_cordoned = ours and annotations.get(CORDONED_BY_US) == "true"
        patch: dict[str, Any] = {
            "metadata": {"annotations": {INCIDENT_ANNOTATION: None, CORDONED_BY_US: None}},
            "spec": {"taints": taints or None, **({"unschedulable": False} if we_cordoned else {})},
        }
        await call(self.core.patch_node, ref.kube_node, patch)
        if we_cordoned:
            return f"{ref.kube_node} uncordoned"
        return f"{ref.kube_node} left cordoned: it was cordoned before this incident"

    @implements(act.POST_NODE_EVENT)
    async def post_node_event(self, ev: KubeEvent) -> None:
        """A Kubernetes Event on the node, so `kubectl describe node` tells the incident's story.
        The name is derived from the workflow run and reason: a retry finds it and stops."""
        run_id = activity.info().workflow_run_id
        digest = hashlib.sha1(f"{ev.node.incident_id}/{run_id}/{ev.reason}".encode()).hexdigest()[:12]
        now = datetime.now(UTC)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=f"{ev.node.kube_node}.gpuheal.{digest}", namespace="default"),
            involved_object=client.V1ObjectReference(kind="Node", name=ev.node.kube_node, uid=ev.node.kube_node),
            reason=ev.reason,
            message=f"{ev.node.incident_id}: {ev.message}"[:1000],
            type="Warning" if ev.warning else "Normal",
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            source=client.V1EventSource(component="gpuheal"),
        )
        try:
            await call(self.core.create_namespaced_event, "default", body)
        except ApiException as err:
            if err.status != 409:
                raise


def _stays(pod: Any) -> bool:
    if MIRROR_ANNOTATION in (pod.metadata.annotations or {}):
        return True
    return any(o.kind == "DaemonSet" for o in (pod.metadata.owner_references or []))


def label_safe(value: str) -> str:
    """A label or taint value of an incident id: at most 63 characters, alphanumeric at both ends."""
    return value[-63:].strip("-.") or "incident"
