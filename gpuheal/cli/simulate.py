"""`gpuheal simulate`: what a fleet gains, and what a candidate policy would have done.

Offline (no Temporal): a trace (generated from published rates, or `--trace FILE`) through the
real policy and coordinator decisions (gpuheal.core.simulate) for gpuheal and the two Slurm-alone
models, printing the effective-training-time ratio, GPU-hours lost, nodes out at once and
incidents held. With `--recorded`: this cluster's own closed incidents, from Temporal's
visibility and their results, replayed under the candidate policy (`--policy FILE`, all or part
of a policy, merged over the cluster's current one): what it would have held, replaced,
escalated, and the budget it would have used, beside what each incident did.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import UTC, datetime

from gpuheal.core import policy, queries
from gpuheal.core import search_attributes as sa
from gpuheal.core.fleet import policy_file
from gpuheal.core.fleet.policy import FleetPolicy
from gpuheal.core.messages import INCIDENT
from gpuheal.core.models.result import RemediationResult
from gpuheal.core.settings import Settings
from gpuheal.core.simulate import traces
from gpuheal.core.simulate.models import MODEL_WORDS, MODELS, Fleet, ModelResult, Timings
from gpuheal.core.simulate.run import simulate
from gpuheal.core.simulate.traces import Failure, TraceError


def timings_from(args: argparse.Namespace) -> Timings:
    overrides: dict[str, float] = {}
    for item in args.set:
        name, _, value = item.partition("=")
        if name not in Timings.model_fields:
            raise SystemExit(
                f"gpuheal simulate: --set {item!r}: no timing {name!r} ({', '.join(Timings.model_fields)})"
            )
        try:
            overrides[name] = float(value)
        except ValueError:
            raise SystemExit(f"gpuheal simulate: --set {item!r}: {value!r} is not a number of seconds") from None
    try:
        return Timings.from_bench(args.timings, **overrides) if args.timings else Timings.model_validate(overrides)
    except ValueError as err:
        raise SystemExit(f"gpuheal simulate: {err}") from None


def candidate(args: argparse.Namespace, base: FleetPolicy) -> FleetPolicy:
    if args.policy is None:
        return base
    try:
        return policy_file.merged(base, policy_file.read(args.policy), source=str(args.policy))
    except policy_file.PolicyFileError as err:
        raise SystemExit(f"gpuheal simulate: {err}") from None


def fleet_from(args: argparse.Namespace, nodes: int, rack_size: int = 32) -> Fleet:
    from gpuheal.core.fleet.policy import check_limit, limit_of

    try:
        check_limit(args.spares)
    except ValueError as err:
        raise SystemExit(f"gpuheal simulate: --spares: {err}") from None
    spares = limit_of(args.spares, nodes)
    job_nodes = args.job_nodes or max(1, nodes - spares)
    if nodes < 1 or job_nodes > nodes - spares:
        raise SystemExit(f"gpuheal simulate: {nodes} nodes with {spares} spares cannot run jobs of {job_nodes}")
    return Fleet(nodes=nodes, job_nodes=job_nodes, spares=spares, rack_size=rack_size)


async def run_simulation(settings: Settings, args: argparse.Namespace) -> int:
    if not (0 < args.days < math.inf and 0 < args.rate_scale < math.inf):
        raise SystemExit("gpuheal simulate: --days and --rate-scale must be positive and finite")
    timings = timings_from(args)
    if args.recorded:
        return await what_if(settings, args, timings)
    fleet = fleet_from(args, args.nodes)
    try:
        trace = (
            traces.read(args.trace)
            if args.trace
            else traces.generate(
                args.nodes, args.days, rate_per_gpu_day=traces.LLAMA3_RATE * args.rate_scale, seed=args.seed
            )
        )
        results = simulate(trace, fleet, args.days, timings, candidate(args, FleetPolicy()), MODELS, args.seed)
    except (TraceError, ValueError) as err:
        raise SystemExit(f"gpuheal simulate: {err}") from None
    if args.write_trace:
        args.write_trace.write_text(traces.to_csv(trace))
    if args.json:
        print(json.dumps([r.model_dump(mode="json", exclude={"decisions"}) for r in results], indent=1))
        return 0
    source = args.trace or f"generated: Llama 3's published rate x{args.rate_scale:g}, seed {args.seed}"
    print(
        f"{fleet.nodes} nodes ({fleet.jobs} job(s) of {fleet.job_nodes}, {fleet.spares} spares), "
        f"{args.days:g} days, {len(trace)} interruptions ({sum(f.seen for f in trace)} seen by a GPU health "
        f"check); trace: {source}"
    )
    print(table(results))
    return 0


def table(results: list[ModelResult]) -> str:
    rows = [
        "| model | effective training | GPU-hours lost | mean downtime | nodes out at once (max) | held | "
        "breaker trips | replaced |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| {MODEL_WORDS[r.model]} | {r.effective_training:.2%} | {r.gpu_hours_lost:,.0f} | "
            f"{r.mean_downtime_s / 60:.1f} min | {r.max_nodes_out} | {r.held} | {r.breaker_trips} | {r.replaced} |"
        )
    return "\n".join(rows)


async def recorded(settings: Settings, since: datetime) -> list[tuple[Failure, RemediationResult]]:
    """The cluster's closed incidents with a result, oldest first, each as the failure it began with."""
    from gpuheal.clients.temporal import connect

    client = await connect(settings.temporal)
    query = queries.where(
        queries.of_type(INCIDENT),
        queries.eq(sa.CLUSTER, settings.require_cluster()),
        queries.not_status("Running"),
        queries.after(queries.START_TIME, since),
    )
    found: list[RemediationResult] = []
    async for wf in client.list_workflows(query):
        try:
            found.append(await INCIDENT.handle(client, wf.id, run_id=wf.run_id).result(follow_runs=False))
        except Exception as err:  # failed or terminated: no record of what it began with
            print(f"  {wf.id} ({wf.run_id}): no result ({err}); left out", file=sys.stderr)
    found.sort(key=lambda r: r.failure_observed_at)
    if not found:
        return []
    t0 = found[0].failure_observed_at
    out = []
    for r in found:
        worst = policy.triage_all(r.reports).action  # the report the incident acted on
        first = next((x for x in r.reports if policy.triage(x).action == worst), r.reports[0])
        at = (r.failure_observed_at - t0).total_seconds()
        took = max(0.0, (r.closed_at - r.failure_observed_at).total_seconds())  # how long it kept the node
        f = Failure(
            at_s=at, node=r.node, cause="recorded", xid=first.xid, signal=first.signal, gpu=first.gpu or 0, took_s=took
        )
        out.append((f, r))
    return out


async def what_if(settings: Settings, args: argparse.Namespace, timings: Timings) -> int:
    from gpuheal.cli.incident import parse_since

    since = datetime.now(UTC) - parse_since(args.since)
    incidents = await recorded(settings, since)
    if not incidents:
        print(f"no closed incident in cluster {settings.cluster} started within {args.since}")
        return 0
    current, base = await current_policy(settings)
    chosen = candidate(args, current)
    # A recorded incident starts at its report (its detection is in the record already).
    timings = timings.model_copy(update={"detect_s": 0.0})
    changes = policy_file.differences(current, chosen)
    # Long enough for the last one to be decided, held to its bound and handed on, and closed.
    longest = max((f.took_s or 0.0) for f, _ in incidents)
    span_days = (incidents[-1][0].at_s + chosen.max_hold_s + timings.person_s + longest + 3600) / 86400
    fleet = fleet_from(args, args.nodes, rack_size=0)  # the incidents' racks are not recorded
    try:
        (result,) = simulate([f for f, _ in incidents], fleet, span_days, timings, chosen, ("gpuheal",), args.seed)
    except ValueError as err:  # more nodes in the record than --nodes says the cluster has
        raise SystemExit(f"gpuheal simulate: {err}") from None
    if args.json:
        print(result.model_dump_json(indent=1))
        return 0
    print(
        f"cluster {settings.cluster}: {len(incidents)} closed incidents since {since:%Y-%m-%d %H:%M}, "
        f"{fleet.nodes} nodes"
    )
    print(f"candidate policy: {base}, " + ("with " + "; ".join(changes) if changes else "unchanged"))
    print("| when (UTC) | node | report | what it did | candidate: action | decision | waited | budget used |")
    print("|---|---|---|---|---|---|---|---|")
    decided = {d.failure: d for d in result.decisions}
    for i, (f, r) in enumerate(incidents):
        report = f"XID {f.xid}" if f.xid else f.signal
        d = decided.get(i)
        if d is None:  # in the simulation its node was still out from an earlier incident
            print(
                f"| {r.failure_observed_at:%m-%d %H:%M:%S} | {f.node} | {report} | {r.action.value} -> {r.outcome} "
                "| - | joined the node's open incident | - | - |"
            )
            continue
        print(
            f"| {r.failure_observed_at:%m-%d %H:%M:%S} | {f.node} | {report} | {r.action.value} -> {r.outcome} | "
            f"{d.action} | {d.decision}: {d.reason[:60]} | {d.waited_s:.0f} s | {d.budget_used} |"
        )
    print(
        f"would have: held {result.held}, replaced {result.replaced}, tripped the breaker {result.breaker_trips} "
        f"times; budget used at most {result.max_budget_used} (domain escalation is not simulated: the incidents' "
        "racks are not recorded)"
    )
    return 0


async def current_policy(settings: Settings) -> tuple[FleetPolicy, str]:
    """The cluster's policy now (its coordinator's memo, or its query for a release before it),
    else the configured one."""
    from gpuheal.clients.temporal import connect
    from gpuheal.core import ids
    from gpuheal.core.messages import FLEET_POLICY, FLEET_POLICY_MEMO

    client = await connect(settings.temporal)
    try:
        handle = client.get_workflow_handle(ids.coordinator_id(settings.require_cluster()))
        versioned = await FLEET_POLICY_MEMO.read(handle) or await FLEET_POLICY.ask(handle)
    except Exception as err:
        return settings.fleet, f"this process's configured policy (the coordinator did not answer: {err})"
    return versioned.policy, f"the cluster's policy version {versioned.version} ({versioned.changed_by})"
