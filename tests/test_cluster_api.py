"""Which Machine a Cluster API Node's replacement may delete (the checks on the Machine itself;
finding it on a real apiserver: tests/integration/test_cluster_api.py)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuheal.providers.cluster_api import GROUP, Machines, Refused

OWNER = {"apiVersion": f"{GROUP}/v1beta2", "kind": "MachineSet", "name": "md-0-abc", "controller": True}


def machine(uid: str | None = None, cluster: str = "gpu", owner: dict[str, Any] | None = OWNER) -> dict[str, Any]:
    ref = {"name": "gpu03", **({"uid": uid} if uid else {})}
    return {
        "metadata": {"name": "md-0-abc-x1", "uid": "m-1", "ownerReferences": [owner] if owner else []},
        "spec": {"clusterName": cluster},
        "status": {"nodeRef": ref},
    }


def machines(cluster: str | None) -> Machines:
    return Machines(None, ("capi",), cluster)  # type: ignore[arg-type]  (no call reaches the apiserver)


def test_a_v1beta2_machine_names_no_node_uid_so_its_cluster_must_be_configured() -> None:
    with pytest.raises(Refused, match="set GPUHEAL_CAPI_CLUSTER"):
        machines(None)._checked(machine(), "capi")
    assert machines("gpu")._checked(machine(), "capi").name == "md-0-abc-x1"
    with pytest.raises(Refused, match="of Cluster 'gpu', not 'other'"):  # another Cluster's, same namespace
        machines("other")._checked(machine(), "capi")


def test_a_v1beta1_machine_is_known_by_its_node_uid() -> None:
    assert machines(None)._checked(machine(uid="n-1"), "capi").uid == "m-1"


@pytest.mark.parametrize("owner", [None, {**OWNER, "kind": "KubeadmControlPlane"}, {**OWNER, "apiVersion": "x/v1"}])
def test_only_a_machine_set_brings_a_new_machine(owner: dict[str, Any] | None) -> None:
    with pytest.raises(Refused, match="not a MachineSet"):
        machines("gpu")._checked(machine(owner=owner), "capi")
