"""The coordinator's state as it is carried across continue-as-new: compact and compressed.

Temporal refuses a continue-as-new input over 2 MiB (and terminates the run; a coordinator
recreated from nothing starts tripped). A 10,000-node fleet's worst week (10,000 arrivals, 2,000
held, 2,000 out) is about 4 MB as JSON; with the repeat window's books compact
(gpuheal.core.fleet.repeats) and the JSON compressed, it is carried as a few hundred KB of binary
payload (tests/test_state_bounds.py measures it). Pure and deterministic: the same state packs
to the same bytes."""

from __future__ import annotations

import bz2
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from gpuheal.core.fleet import repeats
from gpuheal.core.fleet.models import FleetState, OpenIncidents

# The formats of the coordinator's carried state: 1, whole JSON in CoordinatorInput.state (every
# build before PACKED); 2, packed here; 3, packed, its input saying the coordinator runs on its own
# queue (CoordinatorInput.on_own_queue, issue 36), which a build before refuses (it also serves no
# coordinator workflow there). A build declares what it reads and writes in its Worker
# Deployment version's metadata (gpuheal.clients.deployment), and `gpuheal rollout` refuses a
# build that cannot read what the coordinator's build writes: rolled back onto it, the
# coordinator would fail every workflow task (no admissions, no grants).
WRITES = 3
READS = frozenset({1, 2, 3})
# What a packed state starts with: its format, so a build that cannot read it says so; then its
# codec. bz2 packs a fleet's week a fifth smaller than zlib (460 against 590 KB), at about 12 MB/s
# against zlib's 40: it is used up to BZ2_MOST_JSON, a bigger state goes through zlib.
MAGIC = b"gpuheal-fleet-state/1\n"
Codec = tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]
CODECS: dict[bytes, Codec] = {b"bz2\n": (bz2.compress, bz2.decompress), b"zlib\n": (zlib.compress, zlib.decompress)}
BZ2_MOST_JSON = 4 * 1024 * 1024
# ...in a workflow task, though, bz2 only up to QUICK_JSON (about 40 ms on a quiet core). The SDK
# fails a workflow task that holds its thread past 2 s, and a storm's load stretches a task many
# times over: a 10,000-report run's continue-as-new packed 2 to 3 MB of JSON through bz2 in its
# task (0.2 to 0.3 s quiet), passed the 2 s on every attempt, and decided nothing for 13 minutes
# (issue 36, run D). From the coordinator's PACK_BESIDE marker the state is packed by a local
# activity (pack_beside, beside the task; bz2 and zlib let go of the GIL), or in the task, past
# QUICK_JSON with zlib, when that was not carried (pack(quick=True)).
QUICK_JSON = 512 * 1024
# ...and what a local activity packed is carried only up to BESIDE_MOST: its result is recorded (a
# marker) in the same workflow task's completion as the continue-as-new that carries it again, so
# the task writes it twice, beside the updates it accepted (up to about 1.7 MB: design 014), and a
# completion past gRPC's 4 MiB gets the coordinator terminated. Past it, nothing comes back (a
# small marker) and the state is packed in the task (pack(quick=True)).
BESIDE_MOST = 1024 * 1024
# Never carry more than this: Temporal refuses a continue-as-new input over 2 MiB (and terminates
# the run). Past it, the repeat window's oldest days are forgotten first (repeats.shed), the
# books of what is out never; a state still too big is not carried (Pack.fits).
MOST_BYTES = 3 * 512 * 1024


class UnreadableState(ValueError):
    """The carried state is not in a format this build reads (a rollback past a format change)."""


@dataclass(frozen=True)
class Pack:
    data: bytes
    shed_days: int = 0  # days of the repeat window forgotten to fit

    def fits(self, most: int = MOST_BYTES) -> bool:
        return len(self.data) <= most


def prepare(state: FleetState, now: datetime) -> bytes:
    """The state as it is carried, before compression: arrivals past the short windows moved to
    the compact books, entries past the repeat window forgotten. Keys sorted: like names side by
    side compress better (their order means nothing)."""
    repeats.age(state, now)
    repeats.prune(state, now)
    state.past = dict(sorted(state.past.items()))
    return state.model_dump_json().encode()


def pack_text(text: bytes, quick: bool = False) -> bytes:
    """Prepared JSON compressed, behind its format and codec. `quick`: within a workflow task's
    time (QUICK_JSON)."""
    codec = b"bz2\n" if len(text) <= (QUICK_JSON if quick else BZ2_MOST_JSON) else b"zlib\n"
    return MAGIC + codec + CODECS[codec][0](text)


def pack_beside(text: bytes) -> bytes:
    """What the local activity returns: pack_text, or nothing past BESIDE_MOST."""
    data = pack_text(text)
    return data if len(data) <= BESIDE_MOST else b""


def pack(state: FleetState, now: datetime, most: int = MOST_BYTES, quick: bool = False) -> Pack:
    """The state to carry on (prepare, pack_text), shed to fit `most`."""
    shed = 0
    while True:
        data = pack_text(prepare(state, now), quick)
        if len(data) <= most or not repeats.shed(state):
            return Pack(data, shed)
        shed += 1


def unpack(data: bytes) -> FleetState:
    if not data.startswith(MAGIC):
        head = data[: len(MAGIC)].split(b"\n", 1)[0][:40]
        raise UnreadableState(f"the carried state is {head!r}, not {MAGIC.strip().decode()}: written by a newer build")
    rest = data[len(MAGIC) :]
    codec = rest[: rest.index(b"\n") + 1] if b"\n" in rest[:8] else b""
    if codec not in CODECS:
        raise UnreadableState(f"the carried state's codec {codec!r} is not one this build reads")
    return FleetState.model_validate_json(CODECS[codec][1](rest[len(codec) :]))


# The rebuild's listing of the open incidents, as its activity returns it (from the coordinator's
# REBUILD_PACKED marker): Temporal refuses an activity's result over 2 MiB, and 10,000 open
# incidents are 3.1 MB of JSON (0.3 MB compressed: tests/test_state_bounds.py). Unpacked, a
# recreated coordinator of a fleet that size could never rebuild, and nothing would be granted.
LISTING = b"gpuheal-open-incidents/1\n"


def pack_listing(found: OpenIncidents) -> bytes:
    return LISTING + zlib.compress(found.model_dump_json().encode())


def unpack_listing(data: bytes) -> OpenIncidents:
    if not data.startswith(LISTING):
        head = data[: len(LISTING)].split(b"\n", 1)[0][:40]
        raise UnreadableState(f"the listing is {head!r}, not {LISTING.strip().decode()}")
    try:
        return OpenIncidents.model_validate_json(zlib.decompress(data[len(LISTING) :]))
    except (zlib.error, ValueError) as err:  # (pydantic's ValidationError is a ValueError)
        raise UnreadableState(f"the listing is not readable: {str(err)[:200]}") from err
