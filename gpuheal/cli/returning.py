"""`gpuheal return NODE --operator NAME --reason TEXT`: a node an incident left drained, back in
service and out of the books at once. Apart from gpuheal.cli.fleet because it talks to Slurm too
(its client may load aiohttp, which the light commands never do)."""

from __future__ import annotations

import argparse
import sys

from gpuheal.cli.fleet import _coordinator, _update
from gpuheal.clients.slurm import build_slurm
from gpuheal.core import ids, policy
from gpuheal.core.fleet.models import NodeReturn
from gpuheal.core.messages import FLEET_RETURN_NODE, FLEET_STATUS
from gpuheal.core.models.base import check_node_name
from gpuheal.core.settings import Settings


async def return_node(settings: Settings, args: argparse.Namespace) -> int:
    """Return a node an incident left drained (it printed this command): resume it in Slurm and
    tell the coordinator at once, so the slot it held frees now, not at the next look. Refused
    for a node an open incident holds (its incident gives it back) or that Slurm shows drained
    by someone else (their drain is theirs to undo)."""
    node = check_node_name(args.node)
    ret = NodeReturn(node=node, operator=args.operator, reason=args.reason)  # validated before anything
    client, fleet_id = await _coordinator(settings)
    handle = client.get_workflow_handle(fleet_id)
    st = await FLEET_STATUS.ask(handle)
    held = [g for g in (*st.out_of_service, *st.containing) if g.node == node]
    if held:
        print(f"{node} is held by open incident {held[0].incident_id}: abort or finish it instead", file=sys.stderr)
        return 1
    slurm = build_slurm(settings.slurm)
    info = await slurm.node(node)
    incident = ids.incident_id(settings.require_cluster(), node)
    if info.drained and not policy.is_our_drain(info.reason, incident):
        print(f"{node} is drained by someone else ({info.reason!r}): not gpuheal's to return", file=sys.stderr)
        return 1
    if info.drained:
        await slurm.update_node(node, "resume")
    return await _update(settings, FLEET_RETURN_NODE, ret)
