"""The coordinator's state packed beside its workflow task (a local activity): a storm's state is
megabytes of JSON, and bz2 on it in the task itself passed the SDK's 2 s bound on a loaded worker
(gpuheal.core.fleet.packing.QUICK_JSON). Pure: no I/O, nothing to retry but the packing."""

from __future__ import annotations

import asyncio

from gpuheal.activities import interface as act
from gpuheal.activities.interface import implements
from gpuheal.core.fleet import packing


class StatePacking:
    @implements(act.PACK_FLEET_STATE)
    async def pack_fleet_state(self, text: bytes) -> bytes:
        """The prepared state (packing.prepare) compressed, in a thread: bz2 and zlib let go of
        the GIL, so the worker's workflow tasks and pollers go on meanwhile. Nothing (b"") past
        packing.BESIDE_MOST: the coordinator then packs in its task."""
        return await asyncio.to_thread(packing.pack_beside, text)
