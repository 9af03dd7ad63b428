"""What an operator names on the command line: an incident by its id, or by its node.

A module of its own, light on imports: `gpuheal override` and `gpuheal postmortem` take a target
too, and must not load the incident commands' Slurm client to read one. Every target is checked
here, once, before it reaches a workflow id, a query or a file name (`gpuheal postmortem` names
its files by the incident)."""

from __future__ import annotations

from gpuheal.core import ids
from gpuheal.core.models.base import check_node_name
from gpuheal.core.settings import Settings


def incident_id(settings: Settings, target: str) -> str:
    """An operator's target: an incident id as given, or a node name of this cluster (the cluster
    is asked for only then, so an id works without GPUHEAL_CLUSTER)."""
    if ids.is_gpuheal_id(target):
        return ids.check_id(target)
    return ids.incident_id(settings.require_cluster(), check_node_name(target))
