"""The coordinator's state as it is carried across continue-as-new: compact and compressed.

Temporal refuses a continue-as-new input over 2 MiB (and terminates the run; a coordinator
recreated from nothing starts tripped). A 10,000-node fleet's worst week (10,000 arrivals, 2,000
held, 2,000 out) is about 4 MB as JSON; with the repeat window's books compact
(gpuheal.core.fleet.repeats) and the JSON compressed, it is carried as a few hundred KB of binary
payload (tests/test_state_bounds.py measures it). Pure and deterministic: the same state packs
to the same bytes."""

from __future__ import annotations

import zlib
from datetime import datetime

from gpuheal.core.fleet import repeats
from gpuheal.core.fleet.models import FleetState

# The formats of the coordinator's carried state: 1, whole JSON in CoordinatorInput.state (every
# build before PACKED); 2, packed here. A build declares what it reads and writes in its Worker
# Deployment version's metadata (gpuheal.clients.deployment), and `gpuheal rollout` refuses a
# build that cannot read what the coordinator's build writes: rolled back onto it, the
# coordinator would fail every workflow task (no admissions, no grants).
WRITES = 2
READS = frozenset({1, 2})
# What a packed state starts with: its format, so a build that cannot read it says so.
MAGIC = b"gpuheal-fleet-state/1\n"
LEVEL = 6  # zlib: level 9 saves ~2% more at three times the CPU of a workflow task


class UnreadableState(ValueError):
    """The carried state is not in a format this build reads (a rollback past a format change)."""


# Never carry more than this (Temporal refuses 2 MiB): past it, the repeat window's oldest days
# are forgotten first (repeats.shed), the books of what is out never.
MOST_BYTES = 3 * 512 * 1024


def pack(state: FleetState, now: datetime, most: int = MOST_BYTES) -> bytes:
    """The state to carry on: entries past the repeat window forgotten, then compressed. Keys
    sorted: like names side by side compress better (their order means nothing)."""
    repeats.prune(state, now)
    while True:
        state.past = dict(sorted(state.past.items()))
        packed = MAGIC + zlib.compress(state.model_dump_json().encode(), LEVEL)
        if len(packed) <= most or not repeats.shed(state):
            return packed


def unpack(data: bytes) -> FleetState:
    if not data.startswith(MAGIC):
        head = data[: len(MAGIC)].split(b"\n", 1)[0][:40]
        raise UnreadableState(f"the carried state is {head!r}, not {MAGIC.strip().decode()}: written by a newer build")
    return FleetState.model_validate_json(zlib.decompress(data[len(MAGIC) :]))
