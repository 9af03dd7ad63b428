"""Borrowed inference nodes whose incident run crashed out without giving them back (terminated,
failed): given back by the cluster's coordinator, at each of its looks.

An incident gives its borrowed node back itself on every ending it reaches (its jobs moved off
first; or it keeps it, for a person, while a job Slurm may not requeue still runs there). A run
that never reaches one leaves the node in the training pool, labelled as its own, and nobody else
would ever return it: the inference side stays a node short for good. So each look of the
coordinator lists the nodes labelled borrowed, asks Temporal whether the run written on each
(`gpuheal.io/borrowed-run`, its first run) crashed out (gpuheal.clients.runs), and for those: drains the
node in Slurm (in the incident's name, so no new job lands there), and, once Slurm shows no job
on it, returns it to its inference pool. A job still running there is never killed: the node
waits, drained, for the next look. Each step reads before it acts.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from temporalio import activity

from gpuheal.activities import interface as act
from gpuheal.activities.borrowing import (
    BORROWED_BY,
    BORROWED_FROM,
    BORROWED_RUN,
    INCIDENT_ANNOTATION,
    return_node,
)
from gpuheal.activities.interface import implements
from gpuheal.clients import runs
from gpuheal.clients.kube import call
from gpuheal.clients.slurm import SlurmBackend
from gpuheal.core import policy
from gpuheal.core.models.kubernetes import BorrowedGiveBack

GOES_BACK = f"{policy.GIVES_BACK}: its incident run ended without returning it"


class BorrowedNodes:
    def __init__(self, slurm: SlurmBackend, api: client.ApiClient | None, node_label: str | None = None) -> None:
        self._slurm = slurm
        self._core = client.CoreV1Api(api) if api is not None else None
        self._node_label = node_label  # GPUHEAL_K8S_NODE_LABEL: the Slurm name on the Node, else its name

    @implements(act.GIVE_BACK_BORROWED_OF_ENDED_RUNS)
    async def give_back_borrowed_of_ended_runs(self, cluster: str) -> BorrowedGiveBack:
        """What was given back, and what waits (drained) for its jobs to end."""
        if self._core is None:  # no Kubernetes here: nothing is ever borrowed
            return BorrowedGiveBack()
        nodes = await call(self._core.list_node, label_selector=BORROWED_BY)
        given: list[str] = []
        waiting: list[str] = []
        asker = activity.info().workflow_id or ""
        in_slurm = await self._slurm.nodes()
        for n in nodes.items:
            annotations = n.metadata.annotations or {}
            incident = annotations.get(INCIDENT_ANNOTATION)
            if not incident or not await runs.run_crashed_out(
                activity.client(), incident, annotations.get(BORROWED_RUN), asker
            ):
                continue  # its run goes on, or ended its own way (gave it back, or kept it for a person)
            name = str(n.metadata.name)
            slurm_name = (n.metadata.labels or {}).get(self._node_label) if self._node_label else name
            if slurm_name is None or not await self._empty(slurm_name, incident, in_slurm):
                waiting.append(name)  # (a Slurm name it cannot tell is never taken for "none runs there")
                continue
            await return_node(self._core, name, annotations.get(BORROWED_FROM, ""))
            given.append(name)
        return BorrowedGiveBack(given_back=tuple(given), waiting=tuple(waiting))

    async def _empty(self, name: str, incident: str, in_slurm: dict[str, Any]) -> bool:
        """Drained in the incident's name (no new job starts there) and running none now."""
        info = in_slurm.get(name)
        if info is None:
            return True  # out of Slurm already: nothing runs there
        if not info.drained:
            await self._slurm.update_node(name, "drain", policy.drain_reason(incident, GOES_BACK))
        return not await self._slurm.jobs_on_node(name)
