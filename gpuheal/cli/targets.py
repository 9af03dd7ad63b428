"""What an operator names on the command line: an incident by its id, or by its node.

A module of its own, light on imports: `gpuheal fleet override` and `gpuheal postmortem` take a
target too, and must not load the incident commands' Slurm client to read one."""

from __future__ import annotations

from gpuheal.core import ids
from gpuheal.core.settings import Settings


def incident_id(settings: Settings, target: str, cluster: str | None = None) -> str:
    """An operator's target: an incident id as given, or a node name of this cluster (the cluster
    is asked for only then, so an id works without GPUHEAL_CLUSTER)."""
    if ids.is_gpuheal_id(target):
        return target
    return ids.incident_id(cluster or settings.require_cluster(), target)
