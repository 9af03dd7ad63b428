"""Borrowing a node from an inference pool while a replacement is awaited, and giving it back
(the Kubernetes activities' share of it: gpuheal/activities/kubernetes.py serves them).

A borrow is three steps, each read before it is done: take (cordon and label the node as the
incident's, under a resourceVersion precondition), evict its pods through the Eviction API, then
relabel it into the training pool and uncordon it. A retry goes on from the step it reached; a
borrow whose tries ran out gives back what it took; a node whose run crashed out is given back by
the coordinator (activities/borrowed.py).
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuheal.activities import interface as act
from gpuheal.activities.interface import implements
from gpuheal.clients.kube import POOL_LABEL, call, node_ready
from gpuheal.core.models.incident import BorrowPolicy
from gpuheal.core.models.kubernetes import BorrowedNode, BorrowRequest, BorrowResult, EvictResult

INCIDENT_ANNOTATION = "gpuheal.io/incident"  # on a Node: the incident that cordoned or borrowed it
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
BORROWED_BY = "gpuheal.io/borrowed-by"  # label (selectable): the incident, on a borrowed node
BORROWED_FROM = "gpuheal.io/borrowed-from"  # annotation: the pool it goes back to
BORROWED_RUN = "gpuheal.io/borrowed-run"  # annotation: the incident's first run (activities/borrowed.py)
BORROWED_INTO = "gpuheal.io/borrowed-into"  # annotation: the training pool it joins (a retry's, if it must)
BORROW_TRIES = 3  # choices lost to another incident's precondition before "nothing to borrow"


class BorrowingActivities:
    """Mixed into KubernetesActivities: its clients, and its eviction."""

    core: client.CoreV1Api
    apps: client.AppsV1Api
    policy: client.PolicyV1Api

    async def _evict_node(
        self, name: str, deadline_s: float, delete_when_blocked: bool = False, poll_interval_s: float = 1.0
    ) -> EvictResult:
        raise NotImplementedError

    @implements(act.BORROW_INFERENCE_NODE)
    async def borrow_inference_node(self, req: BorrowRequest) -> BorrowResult:
        """A Ready node of the inference pool whose pods can go without any Deployment there
        dropping below its PodDisruptionBudget or the configured floor: cordoned, its pods evicted
        through the Eviction API, relabelled into the failed node's pool. Three steps (take,
        evict, relabel and uncordon), each read before it is done: a retry that finds a node this
        incident took goes on from the step it reached (an apiserver error between two left it
        cordoned in the inference pool), and answers `already_done` only for one it finished."""
        mine = await call(self.core.list_node, label_selector=f"{BORROWED_BY}")
        for n in mine.items:
            if (n.metadata.labels or {}).get(BORROWED_BY) == label_safe(req.incident_id):
                into = (n.metadata.annotations or {}).get(BORROWED_INTO) or await self._training_pool(req)
                return await self._finish_borrow(n, into or "default", req)
        training_pool = await self._training_pool(req)
        if training_pool is None:
            return BorrowResult(node=None, why=f"{req.failed.kube_node} is gone and the pool it was in is unknown")
        for _ in range(BORROW_TRIES):
            choice, _chosen_at, why = await self._borrowable(req.policy)
            if choice is None:
                return BorrowResult(node=None, why=why)
            # Read again just before taking it: the scan above is long, and a kubelet's status
            # update meanwhile must not read as another incident's claim.
            now = await call(self.core.read_node, choice)
            free = not now.spec.unschedulable and BORROWED_BY not in (now.metadata.labels or {})
            if free and await self._take(choice, now.metadata.resource_version, req, training_pool):
                break
            why = f"other incidents took each node chosen first ({BORROW_TRIES} tries)"
        else:
            return BorrowResult(node=None, why=why)
        return await self._finish_borrow(await call(self.core.read_node, choice), training_pool, req)

    async def _training_pool(self, req: BorrowRequest) -> str | None:
        """The pool a borrowed node joins: the failed node's, as the incident knows it, else as
        its Node is labelled (None: the Node is gone, and with it its pool)."""
        if req.training_pool is not None:
            return req.training_pool
        try:
            failed = await call(self.core.read_node, req.failed.kube_node)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return str((failed.metadata.labels or {}).get(POOL_LABEL, "default"))

    @implements(act.RETURN_UNFINISHED_BORROW)
    async def return_unfinished_borrow(self, req: BorrowRequest) -> BorrowResult:
        """A borrow whose tries ran out: a node it took but never relabelled (cordoned, labelled as
        the incident's, in neither pool) goes back to its inference pool untouched, now; one it
        did relabel (the answer was lost) is the incident's borrowed node after all: its name is
        answered, and the incident adopts it and gives it back as any."""
        mine = await call(self.core.list_node, label_selector=f"{BORROWED_BY}={label_safe(req.incident_id)}")
        back = []
        for n in mine.items:
            annotations = n.metadata.annotations or {}
            if req.run_id and annotations.get(BORROWED_RUN) not in (None, req.run_id):
                continue  # another run's of this incident
            from_pool = annotations.get(BORROWED_FROM, req.policy.pool)
            if (n.metadata.labels or {}).get(POOL_LABEL) != from_pool:  # relabelled: on the training side
                return BorrowResult(node=n.metadata.name, from_pool=from_pool, already_done=True)
            await return_node(self.core, n.metadata.name, from_pool)
            back.append(n.metadata.name)
        return BorrowResult(
            node=None, why=f"back in pool {req.policy.pool}: {', '.join(back)}" if back else "nothing was taken"
        )

    async def _finish_borrow(self, n: Any, training_pool: str, req: BorrowRequest) -> BorrowResult:
        """From a node this incident took (cordoned, labelled as its): its pods evicted, then
        relabelled into the training pool and uncordoned. A node already there is done."""
        name, annotations = n.metadata.name, n.metadata.annotations or {}
        from_pool = annotations.get(BORROWED_FROM, req.policy.pool)
        if req.run_id and annotations.get(BORROWED_RUN) != req.run_id:  # an earlier run's: this run's now
            await call(self.core.patch_node, name, {"metadata": {"annotations": {BORROWED_RUN: req.run_id}}})
        if (n.metadata.labels or {}).get(POOL_LABEL) == training_pool:
            # Relabelled: done (its relabel uncordons it in the same patch). Cordoned since, it is
            # someone's doing (its own incident, a person's drain): never evicted from here.
            return BorrowResult(node=name, from_pool=from_pool, already_done=True)
        evicted = await self._evict_node(name, req.deadline_s)
        if evicted.blocked:  # a PDB changed its mind meanwhile: give it back untouched
            await self._return_node(name, from_pool)
            return BorrowResult(node=None, why=f"evictions blocked on {name}: {list(evicted.blocked)}")
        await call(
            self.core.patch_node,
            name,
            {"metadata": {"labels": {POOL_LABEL: training_pool}}, "spec": {"unschedulable": False}},
        )
        return BorrowResult(node=name, evicted=evicted.evicted, from_pool=from_pool)

    async def _take(self, name: str, version: str, req: BorrowRequest, training_pool: str) -> bool:
        """Cordon and mark the node as this incident's, only if it is as it was when chosen (a
        resourceVersion precondition): of two incidents choosing one node, one gets it."""
        patch = {
            "metadata": {
                "resourceVersion": version,
                "labels": {BORROWED_BY: label_safe(req.incident_id)},
                "annotations": {
                    BORROWED_FROM: req.policy.pool,
                    BORROWED_INTO: training_pool,
                    INCIDENT_ANNOTATION: req.incident_id,
                    BORROWED_RUN: req.run_id,
                },
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
        return [p for p in pods.items if not stays(p) and p.metadata.deletion_timestamp is None]

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
        await return_node(self.core, name, pool)


def stays(pod: Any) -> bool:
    """A pod that goes with its node, never evicted: a DaemonSet's, or a static (mirror) pod."""
    owners = pod.metadata.owner_references or []
    return any(o.kind == "DaemonSet" for o in owners) or MIRROR_ANNOTATION in (pod.metadata.annotations or {})


def label_safe(value: str) -> str:
    """A label or taint value of an incident id: at most 63 characters, alphanumeric at both ends."""
    return value[-63:].strip("-.") or "incident"


async def return_node(core: client.CoreV1Api, name: str, pool: str) -> None:
    """A borrowed node back in its inference pool: relabelled, uncordoned, our marks gone."""
    await call(
        core.patch_node,
        name,
        {
            "metadata": {
                "labels": {POOL_LABEL: pool, BORROWED_BY: None},
                "annotations": {
                    BORROWED_FROM: None,
                    BORROWED_INTO: None,
                    INCIDENT_ANNOTATION: None,
                    BORROWED_RUN: None,
                },
            },
            "spec": {"unschedulable": False},
        },
    )
