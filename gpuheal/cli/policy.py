"""`gpuheal policy show | diff FILE | apply FILE --operator --reason`: the cluster's policy as a
file (gpuheal.core.fleet.policy_file). A file may say part of it; what it does not say stays. `diff`
exits 0 when the file changes nothing and 1 when it would (as diff(1)); `apply` records the
change in the coordinator's history with operator, reason and the new version, and a file that
is not a valid policy is refused, naming the field, with nothing changed."""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from pathlib import Path

from temporalio.client import WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from gpuheal.clients.temporal import connect
from gpuheal.core import ids
from gpuheal.core.fleet import policy_file
from gpuheal.core.fleet.policy import PolicyChange
from gpuheal.core.messages import FLEET_POLICY, FLEET_POLICY_MEMO, FLEET_SET_POLICY
from gpuheal.core.settings import Settings

READ_TIMEOUT = timedelta(seconds=5)  # a describe: the server alone answers it


async def policy(settings: Settings, args: argparse.Namespace) -> int:
    client = await connect(settings.temporal)
    handle = client.get_workflow_handle(ids.coordinator_id(settings.require_cluster()))
    try:
        # From the memo (the server answers: a storm's busy coordinator refuses queries); a
        # coordinator of a release before it publishes nothing there and is asked.
        current = await FLEET_POLICY_MEMO.read(handle, rpc_timeout=READ_TIMEOUT) or await FLEET_POLICY.ask(handle)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            print(f"no coordinator for cluster {settings.cluster!r} yet (the first one starts it)", file=sys.stderr)
        else:
            print(f"the coordinator of cluster {settings.cluster!r} did not answer: {err}", file=sys.stderr)
        return 1
    if args.verb == "show":
        print(f"# cluster {settings.cluster}: policy version {current.version}, by {current.changed_by}")
        print(f"# at {current.at:%Y-%m-%d %H:%M:%S}: {current.reason}")
        print(policy_file.render(current.policy), end="")
        return 0
    try:
        new = policy_file.merged(current.policy, policy_file.read(Path(args.file)), source=args.file)
    except policy_file.PolicyFileError as err:
        print(err, file=sys.stderr)
        return 2
    changes = policy_file.differences(current.policy, new)
    if args.verb == "diff":
        print("\n".join(changes) if changes else f"no change to policy version {current.version}")
        return 1 if changes else 0
    if not changes:
        print(f"no change: policy version {current.version} stands")
        return 0
    print("\n".join(changes))
    change = PolicyChange(operator=args.operator, reason=args.reason, policy=new, expected_version=current.version)
    try:
        print(await FLEET_SET_POLICY.execute(handle, change))
    except WorkflowUpdateFailedError as err:  # refused: changed meanwhile
        print(f"refused: {err.cause or err}", file=sys.stderr)
        return 1
    return 0
