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
from gpuheal.activities.borrowing import INCIDENT_ANNOTATION as INCIDENT_ANNOTATION  # (re-exported: a Node's mark)
from gpuheal.activities.borrowing import BorrowingActivities, stays
from gpuheal.activities.borrowing import label_safe as label_safe
from gpuheal.activities.interface import implements
from gpuheal.clients.kube import (
    REJECTED,
    REJECTED_ANNOTATION,
    REJECTED_LABEL,
    REPLACES_ANNOTATION,
    UNVALIDATED,
    call,
)
from gpuheal.core.errors import UNKNOWN_NODE
from gpuheal.core.models.kubernetes import (
    CordonRequest,
    CordonResult,
    EvictRequest,
    EvictResult,
    KubeEvent,
    KubeNodeRef,
    MapNodeRequest,
    RejectNodeRequest,
)

TAINT_KEY = "gpuheal.io/gpu-failure"
CORDONED_BY_US = "gpuheal.io/cordoned-by-gpuheal"


class KubernetesActivities(BorrowingActivities):
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

    @implements(act.MARK_REJECTED_NODE)
    async def mark_rejected_node(self, req: RejectNodeRequest) -> str:
        """Slurm has it drained (for the vendor, or for a person: no verdict); Kubernetes must not
        schedule on it either. Cordoned, tainted and labelled with the verdict (why in an
        annotation); this run's claim on it is cleared, the label and the cordon now keep every
        provider off it. Read first: a retry does it once."""
        name, verdict = req.node.kube_node, UNVALIDATED if req.no_verdict else REJECTED
        node = await call(self.core.read_node, name)
        if (node.metadata.labels or {}).get(REJECTED_LABEL) == verdict:
            return f"{name} already cordoned and labelled {REJECTED_LABEL}={verdict}"
        taints = [t for t in (node.spec.taints or []) if t.key != TAINT_KEY]
        taints.append(client.V1Taint(key=TAINT_KEY, value=label_safe(req.node.incident_id), effect="NoSchedule"))
        why = f"{req.node.incident_id}: {req.detail}"[:1000]
        patch = {
            "metadata": {
                "labels": {REJECTED_LABEL: verdict},
                "annotations": {REJECTED_ANNOTATION: why, REPLACES_ANNOTATION: None},
            },
            "spec": {"unschedulable": True, "taints": [t.to_dict() for t in taints]},
        }
        await call(self.core.patch_node, name, patch)
        return f"{name} cordoned, tainted and labelled {REJECTED_LABEL}={verdict}"

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
                if stays(pod):
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
