"""What an arrival counts for in the repeat window: its node, and each of its GPUs by serial and
by UUID (gpuheal.core.fleet.repeats counts them; gpuheal.core.fleet.index indexes by them). Pure."""

from __future__ import annotations

from collections.abc import Iterable

UUID_KEY_CHARS = 12  # hex digits of a GPU UUID: 48 bits, unique across any fleet


def uuid_key(uuid: str) -> str:
    return uuid.removeprefix("GPU-").replace("-", "")[:UUID_KEY_CHARS]


def named(node: str, gpu_uuids: Iterable[str], gpu_serials: Iterable[str]) -> list[tuple[str, str]]:
    """What an arrival counts for, each key once with what a notice calls it: its node, each GPU's
    serial (a board keeps its record when it moves) and each GPU's UUID (reports of one GPU may
    name either: the agent both, dcgm-exporter the UUID only)."""
    found = {f"node:{node}": node}
    found.update({f"serial:{s}": f"GPU serial {s}" for s in gpu_serials})
    found.update({f"uuid:{uuid_key(u)}": f"GPU {u}" for u in gpu_uuids})
    return list(found.items())


def keys(node: str, gpu_uuids: Iterable[str], gpu_serials: Iterable[str]) -> tuple[str, ...]:
    return tuple(key for key, _ in named(node, gpu_uuids, gpu_serials))
