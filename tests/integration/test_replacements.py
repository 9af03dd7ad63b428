"""Replacements and borrowing that cannot collide, on the real kube-apiserver (kwok Nodes) and the
Slurm sandbox, under the worker's own RBAC. The cloud's node group (and Cluster API's MachineSet)
is played by the test, as in test_kubernetes.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpuheal.activities.kubernetes import KubernetesActivities
from gpuheal.clients.kube import POOL_LABEL, REPLACES_ANNOTATION
from gpuheal.clients.slurm.cli import SlurmCli
from gpuheal.core.models.incident import BorrowPolicy
from gpuheal.core.models.kubernetes import BorrowRequest, KubeNodeRef
from gpuheal.core.settings import Settings
from gpuheal.providers.base import NoSpareCapacity
from gpuheal.providers.kubernetes import MACHINE_ANNOTATION, KubernetesProvider
from infra.sandbox import SLURM_SCRIPT
from infra.sandbox.kube import KubeSandbox
from infra.sandbox.stack import Sandbox

pytestmark = pytest.mark.integration


def provider(slurm: Sandbox, kube: KubeSandbox, timeout_s: float) -> KubernetesProvider:
    return KubernetesProvider(SlurmCli(str(slurm.slurm_conf)), kube.api(kube.worker_kubeconfig), timeout_s=timeout_s)


def gone(kube: KubeSandbox, *names: str) -> None:
    core: Any = kube.core()
    kube.wait(lambda: not {n.metadata.name for n in core.list_node().items} & set(names), f"{names} deleted")


def bring(slurm: Sandbox, kube: KubeSandbox, name: str, pool: str = "h100") -> None:
    """The node group's new node: a Ready Node in `pool` whose slurmd joins Slurm."""
    kube.add_node(name, pool=pool)
    slurm.run(SLURM_SCRIPT, "start-node", name)


async def test_two_incidents_racing_for_one_new_node_get_one_each(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings
) -> None:
    """gpu02 and gpu03 fail at once and one new node comes: one incident reserves it, the other
    says "no capacity" (not a timeout) and remembers its pool; on its next try, with its failed
    Node long gone, a fresh node of another pool is not taken for it, the next one of its own is."""
    a, b = provider(slurm, kube, 30), provider(slurm, kube, 30)
    race = [
        asyncio.create_task(a.replace("gpu02", "gpuheal-c-gpu02")),
        asyncio.create_task(b.replace("gpu03", "gpuheal-c-gpu03")),
    ]
    await asyncio.to_thread(gone, kube, "gpu02", "gpu03")
    await asyncio.to_thread(bring, slurm, kube, "gpu05")
    outcomes = await asyncio.gather(*race, return_exceptions=True)
    won = [o for o in outcomes if not isinstance(o, BaseException)]
    lost = [o for o in outcomes if isinstance(o, NoSpareCapacity)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    assert won[0].new_node == "gpu05" and won[0].pool == "h100"
    core: Any = kube.core()
    holder = core.read_node("gpu05").metadata.annotations[REPLACES_ANNOTATION]
    assert holder == f"gpuheal-c-{won[0].failed_node}"
    searched = lost[0].searched
    assert searched is not None and searched.pool == "h100" and searched.since is not None

    loser = provider(slurm, kube, 60)
    failed = "gpu03" if won[0].failed_node == "gpu02" else "gpu02"
    again = asyncio.create_task(loser.replace(failed, f"gpuheal-c-{failed}", searched))
    await asyncio.to_thread(bring, slurm, kube, "gpu06", "l40s")  # fresh, Ready, in Slurm: wrong pool
    await asyncio.sleep(5)  # two of its polls
    assert not again.done()
    await asyncio.to_thread(bring, slurm, kube, "gpu04")
    result = await asyncio.wait_for(again, 60)
    assert (result.new_node, result.pool) == ("gpu04", "h100")


async def test_a_cluster_api_machine_is_deleted_under_the_workers_rbac(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings
) -> None:
    """A Node with a Machine: the provider deletes the Machine (the rule is in both manifests), and
    Cluster API's MachineSet, played here, makes the new one."""
    ext: Any = k8s.ApiextensionsV1Api(kube.api())
    custom: Any = k8s.CustomObjectsApi(kube.api())
    _ensure_machine_crd(kube, ext)
    machine = {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "metadata": {"name": "m-gpu03"}}
    custom.create_namespaced_custom_object("cluster.x-k8s.io", "v1beta1", "default", "machines", machine)
    core: Any = kube.core()
    core.patch_node("gpu03", {"metadata": {"annotations": {MACHINE_ANNOTATION: "default/m-gpu03"}}})

    def machine_set() -> None:
        def deleted() -> bool:
            try:
                custom.get_namespaced_custom_object("cluster.x-k8s.io", "v1beta1", "default", "machines", "m-gpu03")
            except ApiException as err:
                return err.status == 404
            return False

        kube.wait(deleted, "Machine m-gpu03 deleted by the provider")
        core.delete_node("gpu03")  # the Machine's Node goes with it
        bring(slurm, kube, "gpu05")

    group = asyncio.create_task(asyncio.to_thread(machine_set))
    result = await asyncio.wait_for(provider(slurm, kube, 90).replace("gpu03", "gpuheal-c-gpu03"), 120)
    await group
    assert result.new_node == "gpu05"


def _ensure_machine_crd(kube: KubeSandbox, ext: Any) -> None:
    """Cluster API's Machine type (its real group, version and kind; the schema left open)."""
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "machines.cluster.x-k8s.io"},
        "spec": {
            "group": "cluster.x-k8s.io",
            "scope": "Namespaced",
            "names": {"plural": "machines", "singular": "machine", "kind": "Machine", "listKind": "MachineList"},
            "versions": [
                {
                    "name": "v1beta1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }
    try:
        ext.create_custom_resource_definition(crd)
    except ApiException as err:
        if err.status != 409:
            raise

    def established() -> bool:
        conditions = ext.read_custom_resource_definition("machines.cluster.x-k8s.io").status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    kube.wait(established, "the Machine CRD established")


async def test_two_incidents_borrowing_at_once_never_take_one_node(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings
) -> None:
    """Both choose inf01, the only inference node, before either takes it: the resourceVersion
    precondition gives it to one; the other hears there is nothing to borrow."""
    kube.add_node("inf01", pool="inference")
    acts = KubernetesActivities(kube.api(kube.worker_kubeconfig))
    both_chose = asyncio.Barrier(2)
    choose = acts._borrowable
    first_choices = [2]

    async def choose_together(policy: BorrowPolicy) -> Any:
        chosen = await choose(policy)
        if first_choices[0] > 0:  # the race, made certain: both read before either writes
            first_choices[0] -= 1
            await both_chose.wait()
        return chosen

    acts._borrowable = choose_together  # type: ignore[method-assign]

    def request(node: str) -> BorrowRequest:
        failed = KubeNodeRef(slurm_node=node, kube_node=node, incident_id=f"gpuheal-c-{node}")
        return BorrowRequest(incident_id=f"gpuheal-c-{node}", failed=failed, policy=BorrowPolicy(pool="inference"))

    results = await asyncio.gather(
        acts.borrow_inference_node(request("gpu02")), acts.borrow_inference_node(request("gpu03"))
    )
    assert sorted(str(r.node) for r in results) == ["None", "inf01"], results
    core: Any = kube.core()
    labels = core.read_node("inf01").metadata.labels
    winner = next(r for r in results if r.node == "inf01")
    assert labels[POOL_LABEL] == "h100" and winner.evicted == ()
