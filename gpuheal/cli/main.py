"""`gpuheal`: report failures, steer incidents, run the worker, the webhook and the node agent.

The top floor: it imports whatever it runs, and only when it runs it, so `gpuheal report --help`
answers without loading pydantic, the Temporal SDK or a Kubernetes client.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuheal", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("report", help="report a GPU failure: starts or joins the node's remediation")
    r.add_argument("--node", required=True)
    r.add_argument("--xid", type=int)
    r.add_argument("--signal", help="non-XID health signal, e.g. gpu_lost")
    r.add_argument("--gpu", type=int)
    r.add_argument("--cluster", help="cluster name (default: GPUHEAL_CLUSTER)")
    r.add_argument("--summary", default="")

    for verb in ("approve", "abort"):
        d = sub.add_parser(verb, help=f"{verb} an incident that awaits approval")
        d.add_argument("target", help="node name or incident id (gpuheal-CLUSTER-NODE)")
        d.add_argument("--operator", required=True)
        d.add_argument("--reason", required=True)

    g = sub.add_parser("give-back", help="give a node borrowed from inference back now (its jobs move off)")
    g.add_argument("target", help="the incident's node name or id (the failed node, not the borrowed one)")
    g.add_argument("--operator", required=True)
    g.add_argument("--reason", required=True)

    f = sub.add_parser("fleet", help="the cluster: mode, breaker, budget used and left, held incidents")
    f.add_argument(
        "--live", action="store_true", help="ask the coordinator for every line (a query: refused while it is busy)"
    )
    for verb, what in (("pause", "trip the circuit breaker by hand"), ("resume", "reset the circuit breaker")):
        b = sub.add_parser(verb, help=what)
        b.add_argument("--operator", required=True)
        b.add_argument("--reason", required=True)
    m = sub.add_parser("mode", help="set the cluster's mode: observe, approve or auto")
    m.add_argument("mode", choices=["observe", "approve", "auto"])
    m.add_argument("--operator", required=True)
    m.add_argument("--reason", required=True)
    o = sub.add_parser("override", help="let a held incident go now, past the disruption budget")
    o.add_argument("target", help="node name or incident id")
    o.add_argument("--operator", required=True)
    o.add_argument("--reason", required=True)
    rt = sub.add_parser("return", help="resume a node an incident left drained, and free its slot in the budget now")
    rt.add_argument("node")
    rt.add_argument("--operator", required=True)
    rt.add_argument("--reason", required=True)
    rt.add_argument("--force", action="store_true", help="return a node that failed its GPU validation too")
    dm = sub.add_parser("domain", help="decide a domain incident: release or dismiss its node incidents")
    dm.add_argument("decision", choices=["release", "dismiss"])
    dm.add_argument("domain", help="e.g. gpuheal.io/rack=r7")
    dm.add_argument("--operator", required=True)
    dm.add_argument("--reason", required=True)
    sub.add_parser("versions", help="the cluster's worker builds: which is current, which still have open incidents")
    ro = sub.add_parser("rollout", help="make a worker build current: new incidents start on it (docs/production.md)")
    ro.add_argument("build_id", help="the build (its workers' GPUHEAL_BUILD_ID)")
    ro.add_argument("--operator", required=True)
    ro.add_argument("--reason", required=True)
    po = sub.add_parser("policy", help="the cluster's policy as a file: show it, diff a file against it, apply one")
    verbs = po.add_subparsers(dest="verb", required=True)
    verbs.add_parser("show", help="the current policy, as a file `apply` takes")
    verbs.add_parser("diff", help="what FILE would change (exit 1 if anything)").add_argument("file")
    ap = verbs.add_parser("apply", help="apply FILE (all or part of a policy) as a recorded, versioned change")
    ap.add_argument("file")
    ap.add_argument("--operator", required=True)
    ap.add_argument("--reason", required=True)
    hi = sub.add_parser("history", help="a node's (or a GPU's) incidents: when, which XID, what was done, how it ended")
    hi.add_argument("node", nargs="?", help="the node (omit with --serial)")
    hi.add_argument("--serial", help="a GPU board's serial instead: its incidents on whichever node it was in")

    li = sub.add_parser("incidents", help="open and recent incidents, one line each (or --json)")
    li.add_argument("--node", help="only this node's")
    li.add_argument("--stage", help="only those in this stage now (e.g. held, approval, close)")
    li.add_argument("--outcome", help="only those closed with this outcome (resolved, aborted, escalated, ...)")
    li.add_argument("--open", action="store_true", help="only open incidents")
    li.add_argument("--since", default="7d", help="started within this long: 30m, 24h, 7d (default 7d)")
    li.add_argument("--limit", type=int, default=50)
    li.add_argument("--json", action="store_true", help="one JSON array, for scripts")

    pm = sub.add_parser("postmortem", help="a closed incident's record: Markdown, HTML and a timeline picture")
    pm.add_argument("target", help="node name or incident id")
    pm.add_argument("--out", default=".", help="directory for INCIDENT.md, .html and .svg (default: here)")

    s = sub.add_parser("status", help="an incident's stage, timeline and result")
    s.add_argument("target", help="node name or incident id")

    w = sub.add_parser("worker", help="run the Temporal worker (needs GPUHEAL_CLUSTER and GPUHEAL_PROVIDER)")
    w.add_argument("--metrics-port", type=int, default=9464)
    w.add_argument("--sdk-metrics-port", type=int, default=9465)

    h = sub.add_parser("webhook", help="serve the Alertmanager webhook")
    h.add_argument("--host", default="127.0.0.1")
    h.add_argument("--port", type=int, default=8088)

    a = sub.add_parser("agent", help="node health agent: NVML + kernel-log XIDs -> metrics, reports")
    a.add_argument("--node", required=True, help="this node's Slurm name")
    a.add_argument("--metrics-port", type=int, default=9410)
    a.add_argument("--kmsg", default="/dev/kmsg", help="kernel log to follow ('none' to disable)")
    a.add_argument("--poll-s", type=float, default=10.0, help="NVML health polling interval")
    a.add_argument("--report-to", help="gpuheal webhook URL for direct reports (token from env)")

    sim = sub.add_parser("simulate", help="a failure trace through the policy: goodput for gpuheal and Slurm alone")
    sim.add_argument(
        "--nodes", type=int, default=2048, help="fleet size in nodes (default 2048: Llama 3's 16,384 GPUs)"
    )
    sim.add_argument("--days", type=float, default=54.0, help="how long (default 54: Llama 3's run)")
    sim.add_argument("--job-nodes", type=int, default=0, help="nodes per job (default: one job over the fleet)")
    sim.add_argument("--spares", default="1%", help="idle spare nodes, a count or a share (default 1%%)")
    sim.add_argument("--rate-scale", type=float, default=1.0, help="the published failure rate times this")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--trace", type=Path, help="a recorded trace, CSV or JSON (at_s,node,cause,xid,signal,gpu,took_s)")
    sim.add_argument("--write-trace", type=Path, help="write the trace used, as CSV")
    sim.add_argument("--policy", type=Path, help="a candidate policy file (all or part of one)")
    sim.add_argument("--timings", type=Path, help="measured timings, JSON (bench/results/mttr.json)")
    sim.add_argument(
        "--set", action="append", default=[], metavar="NAME=SECONDS", help="one timing, e.g. person_s=1800"
    )
    sim.add_argument("--recorded", action="store_true", help="this cluster's closed incidents under --policy")
    sim.add_argument("--since", default="30d", help="with --recorded: incidents started within this long")
    sim.add_argument("--json", action="store_true", help="the results as JSON")

    c = sub.add_parser("healthcheck", help="one-shot GPU check for Slurm's HealthCheckProgram")
    c.add_argument("--node", required=True)
    c.add_argument("--expect-gpus", type=int, default=0, help="GPUs this node must have")
    c.add_argument("--report-to", help="gpuheal webhook URL (token from GPUHEAL_WEBHOOK_TOKEN)")
    for command in sub.choices.values():
        _add_cluster_option(command)
    return p


def _add_cluster_option(parser: argparse.ArgumentParser) -> None:
    """`--cluster NAME` on every command (its own subcommands' too): with several clusters on one
    Temporal, an operator names the one meant instead of trusting GPUHEAL_CLUSTER."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for action in subs:
        for child in action.choices.values():
            _add_cluster_option(child)
    if not subs and "--cluster" not in parser._option_string_actions:
        parser.add_argument("--cluster", help="the cluster (Slurm's ClusterName; default: GPUHEAL_CLUSTER)")


# command -> (module, function); a module is imported only when its command runs, so that the
# short commands (gpuheal.cli.incident) never load what the long-running ones (gpuheal.cli.serve)
# need.
COMMANDS = {
    "report": ("gpuheal.cli.incident", "report_failure"),
    "approve": ("gpuheal.cli.incident", "decide"),
    "abort": ("gpuheal.cli.incident", "decide"),
    "status": ("gpuheal.cli.incident", "show_status"),
    "incidents": ("gpuheal.cli.incident", "list_incidents"),
    "postmortem": ("gpuheal.cli.postmortem", "write_postmortem"),
    "give-back": ("gpuheal.cli.incident", "give_back"),
    "fleet": ("gpuheal.cli.fleet", "show_fleet"),
    "pause": ("gpuheal.cli.fleet", "pause"),
    "resume": ("gpuheal.cli.fleet", "resume"),
    "mode": ("gpuheal.cli.fleet", "set_mode"),
    "override": ("gpuheal.cli.fleet", "override"),
    "return": ("gpuheal.cli.returning", "return_node"),
    "domain": ("gpuheal.cli.fleet", "decide_domain"),
    "history": ("gpuheal.cli.fleet", "node_history"),
    "policy": ("gpuheal.cli.policy", "policy"),
    "versions": ("gpuheal.cli.versions", "show_versions"),
    "rollout": ("gpuheal.cli.versions", "rollout"),
    "worker": ("gpuheal.cli.serve", "worker"),
    "webhook": ("gpuheal.cli.serve", "webhook"),
    "agent": ("gpuheal.cli.serve", "agent"),
    "healthcheck": ("gpuheal.cli.serve", "healthcheck"),
    "simulate": ("gpuheal.cli.simulate", "run_simulation"),
}
# The node's own processes: they report to the webhook and never talk to Temporal, so the
# Temporal client configuration is not theirs to fail on.
NO_TEMPORAL = frozenset({"agent", "healthcheck"})


def run(argv: list[str] | None = None) -> int:
    """Parse, run, and map the errors a user can cause to one line and an exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import asyncio
    import importlib
    import inspect

    from gpuheal.cli.errors import explain
    from gpuheal.clients.temporal import resolve
    from gpuheal.core.settings import LOCAL_TEMPORAL_ADDRESS, Settings

    # (before the settings parse: an error in them is explained with the address too)
    address = os.environ.get("GPUHEAL_TEMPORAL_ADDRESS") or os.environ.get("TEMPORAL_ADDRESS") or LOCAL_TEMPORAL_ADDRESS
    try:
        chosen = getattr(args, "cluster", None)  # validated as GPUHEAL_CLUSTER is
        settings = Settings.from_env({**os.environ, "GPUHEAL_CLUSTER": chosen} if chosen else os.environ)
        if args.command not in NO_TEMPORAL:
            # the address and namespace the SDK's profile names, for messages and the Web UI's links
            settings = settings.model_copy(update={"temporal": resolve(settings.temporal)})
            address = settings.temporal.address or address
        module, name = COMMANDS[args.command]
        command = getattr(importlib.import_module(module), name)
        result = command(settings, args)
        return int(asyncio.run(result) if inspect.iscoroutine(result) else result)
    except Exception as err:
        answer = explain(err, getattr(args, "target", None) or getattr(args, "node", None), address)
        if answer is None:
            raise
        print("\n".join(answer.lines), file=sys.stderr)
        return answer.code


def main(argv: list[str] | None = None) -> int:
    rc = run(argv)
    # The SDK's native threads can abort interpreter finalisation ("PyGILState_Release", SIGABRT)
    # after any command that used a Temporal client, a gracefully stopped worker included; the
    # command's work is done and flushed by now, so skip finalisation and keep its exit code.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    sys.exit(main())
