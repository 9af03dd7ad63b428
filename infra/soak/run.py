"""One soak from start to verdict: the world up, the load and the faults for `minutes` with the
operator at work, a settling time for incidents to end, then the records gathered, checked and
reported. The world is stopped whatever happened.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from gpuheal.clients.temporal import connect
from gpuheal.core.settings import Settings
from infra.sandbox.temporal import TemporalKind
from infra.soak import collect, faults, load, report
from infra.soak.acts import Acts, acts, open_incidents
from infra.soak.invariants import Records, check
from infra.soak.world import KUBE_CLUSTER, World

SETTLE_LOOK_S = 10.0
# The records are read after an hour's run: a machine that stalls for a minute (the hour on
# e06ed70: the VM's vCPUs starved, PostgreSQL timed out logins) must not lose them. Reading is
# read-only, so it is tried again.
GATHER_TRIES, GATHER_PAUSE_S = 5, 30.0
# What a look that may answer next time fails with (a client-side timeout reads CANCELLED); a
# query Temporal refuses (INVALID_ARGUMENT, PERMISSION_DENIED) stops the soak instead.
PASSING = {
    RPCStatusCode.CANCELLED,
    RPCStatusCode.DEADLINE_EXCEEDED,
    RPCStatusCode.UNAVAILABLE,
    RPCStatusCode.RESOURCE_EXHAUSTED,
}


def say(text: str) -> None:
    print(f"soak {time.strftime('%H:%M:%S')}: {text}", flush=True)


async def soak(
    minutes: float, seed: int, settle: float, root: Path, temporal: TemporalKind, out: Path | None, ports: str = "soak"
) -> int:
    world = World(root, temporal, ports)
    # Stopped as `make test`'s trap or CI stops it (SIGTERM): cancelled, so the world is stopped.
    me = asyncio.current_task()
    assert me is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, me.cancel)
    sampler = collect.Sampler(world, root / "samples.jsonl")
    try:
        say(f"starting the world under {root} (Temporal: {temporal})")
        world.start()
        client = await connect(Settings.from_env(world.temporal.env()).temporal)
        shape = load.Shape(
            minutes,
            nodes={c.name: c.nodes for c in world.clusters.values()},
            racks={c.name: c.racks for c in world.clusters.values()},
        )
        failures = load.schedule(seed, shape)
        dealt = faults.schedule(seed, minutes, list(world.clusters), KUBE_CLUSTER)
        say(f"seed {seed}: {len(failures)} alerts and {len(dealt)} faults over {minutes:g} min")
        sampler.start()
        begun = time.time()
        doing = Acts(world, client, begun, seed)
        load_end = begun + minutes * 60
        async with asyncio.TaskGroup() as acting:  # one that raises cancels the others
            acting.create_task(doing.send(failures))
            acting.create_task(doing.inflict(dealt))
            acting.create_task(doing.operate(load_end))
        say(f"the load is over; up to {settle:g} min for the incidents to end")
        operator = asyncio.create_task(doing.operate(time.time() + settle * 60))
        await settled(world, client, time.time() + settle * 60)
        operator.cancel()
        end = time.time()
        sampler.stop()
        done = acts(doing.path)
        quiet = [(a["cluster"], a["began"], a["at"]) for a in done if a.get("fault") == "stop_slurmctld"]
        records = await gathered(lambda: collect.gather(world, client, begun, end, soak_cancelled=set(), quiet=quiet))
        found = check(records)
        (root / "records.json").write_text(json.dumps(dataclasses.asdict(records), default=str))
        path = out or root / "soak.md"
        path.write_text(report.markdown(seed, minutes, settle, begun, end, records, found, done))
        # last: its presence says the checker and the report both finished (make test reads it so)
        (root / "verdicts.json").write_text(json.dumps({name: len(vs) for name, vs in found.items()}))
        broken = [name for name, vs in found.items() if vs]
        say(f"report: {path}; " + ("every invariant held" if not broken else f"BROKEN: {', '.join(broken)}"))
        return 1 if broken else 0
    finally:
        sampler.stop()
        world.stop()
        world.notices.stop()


async def gathered(read: Callable[[], Awaitable[Records]], pause_s: float = GATHER_PAUSE_S) -> Records:
    """The records, read again after a failure (said) up to GATHER_TRIES times."""
    for attempt in range(1, GATHER_TRIES + 1):
        try:
            return await read()
        except Exception as err:  # Temporal, the apiserver or Slurm not answering in time
            if attempt == GATHER_TRIES:
                raise
            say(f"reading the records failed ({type(err).__name__}: {err}); again in {pause_s:g} s")
            await asyncio.sleep(pause_s)
    raise AssertionError("unreachable")


async def settled(world: World, client: Client, until: float) -> None:
    """Until no incident is open but those waiting for a person, or `until`. A look that Temporal
    does not answer (restarting, or the machine stalled) is said, and looked again."""
    while time.time() < until:
        try:
            if await still_open(world, client) == 0:
                return
        except RPCError as err:
            if err.status not in PASSING:
                raise
            say(f"settling: Temporal did not answer ({err}); looking again")
        await asyncio.sleep(SETTLE_LOOK_S)
    say("settling time over with incidents still open: the checker names them")


async def still_open(world: World, client: Client) -> int:
    """The incidents open now but those waiting for a person's approval."""
    open_ = 0
    for name in world.clusters:
        async for w in client.list_workflows(open_incidents(name)):
            described = await client.get_workflow_handle(w.id).describe()
            stage = (described.search_attributes or {}).get("Stage") or [""]
            open_ += 0 if stage[0] == "approval" else 1
    return open_
