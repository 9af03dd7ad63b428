"""`gpuheal return NODE --operator NAME --reason TEXT`: a node an incident left drained, back in
service; the coordinator counts it until it sees Slurm show it back. Apart from gpuheal.cli.fleet
because it talks to Slurm too (its client may load aiohttp, which the light commands never do)."""

from __future__ import annotations

import argparse
import sys

from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from gpuheal.cli.fleet import _update
from gpuheal.clients.slurm import SlurmBackend, SlurmError, build_slurm
from gpuheal.clients.temporal import connect
from gpuheal.core import ids, policy
from gpuheal.core.fleet.models import NodeReturn
from gpuheal.core.messages import FLEET_RETURN_NODE, INCIDENT
from gpuheal.core.models.base import check_node_name
from gpuheal.core.search_attributes import STAGE
from gpuheal.core.settings import Settings

# What a Slurm call may raise when Slurm refuses, does not know the node, or does not answer (the
# clients' own timeouts are SlurmErrors; a command that cannot be started is an OSError).
SLURM_FAILED = (SlurmError, LookupError, OSError, TimeoutError)


async def return_node(settings: Settings, args: argparse.Namespace) -> int:
    """Return a node an incident left drained (it printed this command): tell the coordinator,
    then resume it in Slurm. The coordinator refuses a node an open incident holds or has in line
    (its incident gives it back) and starts the node's cooldown, so no new incident is granted it
    before the resume; it keeps counting the node until it sees Slurm show it back (seconds after
    the resume), so a resume that fails frees nothing. The resume is made only if Slurm still
    shows the drain read before. Refused too: a node drained by someone else (theirs to undo),
    and one that failed its burn-in unless --force (it is for the vendor)."""
    node = check_node_name(args.node)
    ret = NodeReturn(node=node, operator=args.operator, reason=args.reason)  # validated before anything
    slurm = build_slurm(settings.slurm)
    try:
        before = await slurm.node(node)
    except SLURM_FAILED as err:
        print(f"{node}: Slurm did not say how it is ({err}): nothing done", file=sys.stderr)
        return 1
    incident = ids.incident_id(settings.require_cluster(), node)
    # A replacement's new node kept out (its burn-in gave no verdict) is drained in the name of the
    # incident it was to replace a node for: that drain, and only that kind, is gpuheal's too.
    drainer = policy.draining_incident(before.reason, ids.incident_prefix(settings.require_cluster()))
    if before.drained and drainer is not None and policy.UNVALIDATED in before.reason:
        incident = drainer
    if before.drained and not policy.is_our_drain(before.reason, incident):
        print(f"{node} is drained by someone else ({before.reason!r}): not gpuheal's to return", file=sys.stderr)
        return 1
    if before.drained and policy.failed_validation_detail(before.reason, incident) is not None and not args.force:
        print(f"{node} failed its GPU validation ({before.reason!r}): it is for the vendor; --force to return it")
        return 1
    if (stage := await _open(settings, incident)) is not None:  # read from Temporal, not the books
        print(
            f"{node}: its incident {incident} is open ({stage}): abort or finish it, not return its node",
            file=sys.stderr,
        )
        return 1
    code = await _update(settings, FLEET_RETURN_NODE, ret)  # refused (raises) if an open incident has it
    if not before.drained:
        return code
    try:
        now = await slurm.node(node)
        if now.drained and now.reason == before.reason:
            await slurm.update_node(node, "resume")
            print(f"{node} resumed in Slurm")
            return code
    except SLURM_FAILED as err:
        # Refused, gone, or no answer in time (the clients' timeouts are SlurmErrors): what Slurm
        # shows now says which; the resume may have landed though its answer did not.
        return await _say_after_failure(slurm, node, err)
    print(f"{node} not resumed: Slurm's drain changed meanwhile ({now.reason!r})", file=sys.stderr)
    return 1


async def _open(settings: Settings, incident: str) -> str | None:
    """The stage of `incident` if it is running, else None. The coordinator's books may lag the
    incidents (a recreated one rebuilds from visibility): a node whose incident is open is that
    incident's to give back, whatever the books say (issue 37's hour returned two such nodes)."""
    try:
        described = await INCIDENT.handle(await connect(settings.temporal), incident).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    if described.status != WorkflowExecutionStatus.RUNNING:
        return None
    return described.typed_search_attributes.get(STAGE) or "running"


async def _say_after_failure(slurm: SlurmBackend, node: str, err: BaseException) -> int:
    try:
        after = await slurm.node(node)
    except SLURM_FAILED as again:
        print(
            f"{node}: Slurm did not answer ({err}; {again}): `gpuheal status {node}`, and again if drained",
            file=sys.stderr,
        )
        return 1
    if not after.drained:
        print(f"{node} resumed in Slurm (its answer was lost: {err})")
        return 0
    print(
        f"{node} not resumed: {err}; still drained ({after.reason!r}): run this again once Slurm takes it",
        file=sys.stderr,
    )
    return 1
