"""A node of a Cluster API Machine, on the real kube-apiserver (with its garbage collector), as
Cluster API writes it: a MachineSet owning the Machine (its controller owner reference), the
Machine's status naming its Node (name and UID), and on the Node the Machine's *name* and its
namespace as annotations. The provider deletes the Machine under the worker's own RBAC (a Role in
the namespaces it is configured for) and the MachineSet, played here, brings the new node. A Node
whose annotations name a Machine elsewhere, or one that is not its own, deletes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpuheal.clients.slurm.cli import SlurmCli
from gpuheal.core.settings import Settings
from gpuheal.providers.base import NoSpareCapacity
from gpuheal.providers.cluster_api import GROUP, MACHINE_ANNOTATION, NAMESPACE_ANNOTATION
from gpuheal.providers.kubernetes import KubernetesProvider
from infra.sandbox.kube import KubeSandbox
from infra.sandbox.stack import Sandbox
from tests.integration.test_replacements import bring

pytestmark = pytest.mark.integration

VERSION = "v1beta1"
OURS = "default"  # the namespace the worker may delete Machines in (infra/k8s/rbac.yaml's Role)
THEIRS = "other-team"


@pytest.fixture
def capi(kube: KubeSandbox, k8s_settings: Settings) -> Iterator[Any]:
    """Cluster API's Machine and MachineSet types, and a namespace the worker was never given."""
    ext: Any = k8s.ApiextensionsV1Api(kube.api())
    for kind, plural in (("Machine", "machines"), ("MachineSet", "machinesets")):
        _ensure_crd(kube, ext, kind, plural)
    core: Any = kube.core()
    try:
        core.create_namespace({"metadata": {"name": THEIRS}})
    except ApiException as err:
        if err.status != 409:
            raise
    custom: Any = k8s.CustomObjectsApi(kube.api())
    yield custom
    for ns in (OURS, THEIRS):
        for plural in ("machines", "machinesets"):
            custom.delete_collection_namespaced_custom_object(GROUP, VERSION, ns, plural)


def provider(slurm: Sandbox, kube: KubeSandbox, timeout_s: float) -> KubernetesProvider:
    return KubernetesProvider(
        SlurmCli(str(slurm.slurm_conf)),
        kube.api(kube.worker_kubeconfig),
        timeout_s=timeout_s,
        machine_namespaces=(OURS,),
    )


def machine_of(custom: Any, core: Any, node: str, ns: str, name: str, *, points_at: str | None = None) -> None:
    """A MachineSet and its Machine for `node`, as Cluster API makes them; the Node annotated as
    Cluster API annotates it. `points_at`: the Machine's status names that Node instead."""
    owner = custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        ns,
        "machinesets",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "MachineSet",
            "metadata": {"name": f"{name}-set"},
            "spec": {"clusterName": "gpu"},
        },
    )
    machine = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Machine",
        "metadata": {
            "name": name,
            "labels": {f"{GROUP}/cluster-name": "gpu", f"{GROUP}/set-name": f"{name}-set"},
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "MachineSet",
                    "name": f"{name}-set",
                    "uid": owner["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"clusterName": "gpu", "bootstrap": {"dataSecretName": f"{name}-bootstrap"}},
    }
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, "machines", machine)
    target = core.read_node(points_at or node)
    status = {
        "status": {
            "nodeRef": {"apiVersion": "v1", "kind": "Node", "name": target.metadata.name, "uid": target.metadata.uid},
            "phase": "Running",
        }
    }
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, "machines", name, status)
    annotations = {
        MACHINE_ANNOTATION: name,
        NAMESPACE_ANNOTATION: ns,
        f"{GROUP}/cluster-name": "gpu",
        f"{GROUP}/owner-kind": "MachineSet",
        f"{GROUP}/owner-name": f"{name}-set",
    }
    core.patch_node(node, {"metadata": {"annotations": annotations}})


def exists(custom: Any, ns: str, name: str) -> bool:
    try:
        custom.get_namespaced_custom_object(GROUP, VERSION, ns, "machines", name)
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


async def test_the_nodes_machine_is_deleted_and_its_machine_set_brings_a_new_node(
    slurm: Sandbox, kube: KubeSandbox, capi: Any
) -> None:
    core: Any = kube.core()
    machine_of(capi, core, "gpu03", OURS, "md-0-7xk2p")

    def machine_set() -> None:
        kube.wait(lambda: not exists(capi, OURS, "md-0-7xk2p"), "the Machine deleted by the provider")
        core.delete_node("gpu03")  # Cluster API deletes the Machine's Node with it
        bring(slurm, kube, "gpu05")

    played = asyncio.create_task(asyncio.to_thread(machine_set))
    result = await asyncio.wait_for(provider(slurm, kube, 90).replace("gpu03", "gpuheal-c-gpu03/r1"), 120)
    await played
    assert result.new_node == "gpu05"
    assert exists(capi, OURS, "md-0-7xk2p") is False


async def test_a_node_naming_a_machine_elsewhere_deletes_nothing(slurm: Sandbox, kube: KubeSandbox, capi: Any) -> None:
    """gpu02's annotations (its kubelet may write them) aim at a Machine in a namespace the worker
    was not given, one that even names gpu02: refused, and the worker's RBAC could not either."""
    core: Any = kube.core()
    machine_of(capi, core, "gpu02", THEIRS, "prod-db-0")
    with pytest.raises(NoSpareCapacity, match=r"no Machine in the namespaces .*\(default\).*replace gpu02 by hand"):
        await provider(slurm, kube, 10).replace("gpu02", "gpuheal-c-gpu02/r1")
    assert exists(capi, THEIRS, "prod-db-0") and core.read_node("gpu02").metadata.deletion_timestamp is None
    worker: Any = k8s.CustomObjectsApi(kube.api(kube.worker_kubeconfig))
    with pytest.raises(ApiException) as refused:
        worker.delete_namespaced_custom_object(GROUP, VERSION, THEIRS, "machines", "prod-db-0")
    assert refused.value.status == 403


async def test_a_machine_of_another_node_is_never_taken_for_this_ones(
    slurm: Sandbox, kube: KubeSandbox, capi: Any
) -> None:
    """gpu02 names, in the worker's own namespace, the Machine of gpu03: its status says it is
    gpu03's, so gpu02's replacement deletes nothing."""
    core: Any = kube.core()
    machine_of(capi, core, "gpu02", OURS, "md-0-gpu03", points_at="gpu03")
    with pytest.raises(NoSpareCapacity, match="has it as its node"):
        await provider(slurm, kube, 10).replace("gpu02", "gpuheal-c-gpu02/r1")
    assert exists(capi, OURS, "md-0-gpu03")


def _ensure_crd(kube: KubeSandbox, ext: Any, kind: str, plural: str) -> None:
    """Cluster API's type (its real group, version, kind and status subresource; the schema open)."""
    name = f"{plural}.{GROUP}"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
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
        conditions = ext.read_custom_resource_definition(name).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    kube.wait(established, f"the {kind} CRD established")
