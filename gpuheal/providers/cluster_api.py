"""Cluster API: the Machine behind a Node, found from the Machine's side, and deleted so that its
MachineSet makes a new one.

Cluster API writes on each Node it manages the Machine's *name* (``cluster.x-k8s.io/machine``) and
its namespace (``cluster.x-k8s.io/cluster-namespace``). Both are Node annotations, which the
node's own kubelet may write: a compromised node could name any Machine. So they are only a hint.
The Machine deleted is one in a namespace the worker is configured for (GPUHEAL_CAPI_NAMESPACES,
where its Role grants get, list and delete on machines, nowhere else) whose ``status.nodeRef``
(written by Cluster API's controller) names this Node, and which a MachineSet controls (its owner
reference): deleting it brings a new Machine. Anything else is refused with the reason, and the
incident says to replace the node by hand; nothing is deleted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuheal.clients import kube

GROUP = "cluster.x-k8s.io"
MACHINE_ANNOTATION = f"{GROUP}/machine"  # on a Node: its Machine's name (Cluster API writes it)
NAMESPACE_ANNOTATION = f"{GROUP}/cluster-namespace"  # on a Node: its Cluster's (and Machine's) namespace
REPLACING_OWNERS = frozenset({"MachineSet"})  # controllers that make a new Machine for a deleted one
LIST_PAGE = 500


class Refused(Exception):
    """The Node is Cluster API's, but no Machine the worker may delete is provably its own."""


@dataclass(frozen=True)
class Machine:
    namespace: str
    name: str
    uid: str
    deleting: bool


def managed(node: Any) -> bool:
    """Cluster API says this Node is one of its Machines'."""
    return MACHINE_ANNOTATION in (node.metadata.annotations or {})


class Machines:
    """The worker's view of Cluster API's Machines, in the namespaces it may delete them in."""

    def __init__(self, api: client.ApiClient, namespaces: tuple[str, ...], cluster: str | None = None) -> None:
        self._custom = client.CustomObjectsApi(api)
        self._apis = client.ApisApi(api)
        self._namespaces = namespaces
        self._cluster = cluster  # GPUHEAL_CAPI_CLUSTER: the Cluster whose Machines these may be
        self._version: str | None = None

    async def delete_machine_of(self, node: Any) -> str:
        """Delete the Machine of `node` (once: one already being deleted is left to finish)."""
        machine = await self._machine_of(node)
        if not machine.deleting:
            options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=machine.uid))
            try:
                await kube.call(
                    self._custom.delete_namespaced_custom_object,
                    GROUP,
                    await self._served_version(),
                    machine.namespace,
                    "machines",
                    machine.name,
                    body=options,
                )
            except ApiException as err:
                if err.status != 404:  # gone meanwhile (an earlier try): its MachineSet is at work
                    raise
        return f"Machine {machine.namespace}/{machine.name} deleted: its MachineSet makes a new one"

    async def _machine_of(self, node: Any) -> Machine:
        annotations = node.metadata.annotations or {}
        hint, hinted_ns = annotations.get(MACHINE_ANNOTATION, ""), annotations.get(NAMESPACE_ANNOTATION)
        said = f"Machine {hint!r}" + (f" in namespace {hinted_ns!r}" if hinted_ns else "")
        if not self._namespaces:
            raise Refused(f"{node.metadata.name} is a Cluster API node ({said}) and GPUHEAL_CAPI_NAMESPACES is unset")
        # The hinted name first (one read per namespace), then every Machine there (a renamed hint).
        for ns in sorted(self._namespaces, key=lambda n: n != hinted_ns):
            found = await self._get(ns, hint) if hint else None
            if found is not None and _is_machine_of(found, node):
                return self._checked(found, ns)
        for ns in self._namespaces:
            async for found in self._list(ns):
                if _is_machine_of(found, node):
                    return self._checked(found, ns)
        allowed = ", ".join(self._namespaces)
        raise Refused(
            f"{node.metadata.name} is a Cluster API node ({said}), but no Machine in the namespaces gpuheal"
            f" may delete Machines in ({allowed}) has it as its node"
        )

    def _checked(self, machine: dict[str, Any], ns: str) -> Machine:
        """This Node's Machine, if it may be deleted: its Cluster's (where configured; required
        where its nodeRef names no UID, as in v1beta2: a Node name alone may be another
        Cluster's in a shared namespace) and a MachineSet's (deleting it brings a new one)."""
        meta, spec = machine.get("metadata") or {}, machine.get("spec") or {}
        name = str(meta.get("name"))
        if self._cluster is not None and spec.get("clusterName") != self._cluster:
            raise Refused(f"Machine {ns}/{name} is of Cluster {spec.get('clusterName')!r}, not {self._cluster!r}")
        if self._cluster is None and not ((machine.get("status") or {}).get("nodeRef") or {}).get("uid"):
            raise Refused(
                f"Machine {ns}/{name} names its Node without a UID (v1beta2): set GPUHEAL_CAPI_CLUSTER to the"
                " Cluster whose Machines gpuheal may delete"
            )
        owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
        if (
            owner is None
            or owner.get("kind") not in REPLACING_OWNERS
            or not str(owner.get("apiVersion")).startswith(f"{GROUP}/")
        ):
            who = f"{owner.get('kind')} {owner.get('name')}" if owner else "nothing"
            raise Refused(
                f"Machine {ns}/{name} is controlled by {who}, not a MachineSet: deleting it brings no new one"
            )
        return Machine(namespace=ns, name=name, uid=str(meta.get("uid")), deleting=bool(meta.get("deletionTimestamp")))

    async def _get(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await kube.call(
                self._custom.get_namespaced_custom_object, GROUP, await self._served_version(), ns, "machines", name
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return found

    async def _list(self, ns: str) -> Any:
        token: str | None = None
        while True:
            page = await kube.call(
                self._custom.list_namespaced_custom_object,
                GROUP,
                await self._served_version(),
                ns,
                "machines",
                limit=LIST_PAGE,
                **({"_continue": token} if token else {}),
            )
            for item in page.get("items", []):
                yield item
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return

    async def _served_version(self) -> str:
        """The group's preferred version as this apiserver serves it (v1beta2 since Cluster API
        1.11, v1beta1 before): both carry status.nodeRef and the owner references read here."""
        if self._version is None:
            groups = await kube.call(self._apis.get_api_versions)
            group = next((g for g in groups.groups or [] if g.name == GROUP), None)
            if group is None:
                raise Refused("Cluster API is not installed here (no cluster.x-k8s.io API group)")
            self._version = str(group.preferred_version.version)
        return self._version


def _is_machine_of(machine: dict[str, Any], node: Any) -> bool:
    """The Machine's status (Cluster API's controller writes it) names this Node: by name, and by
    UID where the version keeps one (v1beta1 does; v1beta2 names the Node only)."""
    ref = (machine.get("status") or {}).get("nodeRef") or {}
    return ref.get("name") == node.metadata.name and ref.get("uid") in (None, node.metadata.uid)
