"""The sandbox's node group under several workers: each worker process has its own provider, all
share one record of which incident run took which spare. Chosen at once by many incidents on
two "workers" (two threads, each its own event loop and provider), no spare goes to two runs,
and a run asking again gets its own spare back."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from gpuheal.core.models.slurm import NodeInfo
from gpuheal.providers.sandbox import SandboxProvider

SPARES = [f"spare{i:02d}" for i in range(12)]


class SlowListing:
    """Slurm's node list, slow enough that the choices overlap."""

    async def nodes(self) -> dict[str, NodeInfo]:
        await asyncio.sleep(0.01)
        return {}


def fleet(tmp_path: Path) -> Path:
    """The sandbox's slurm.conf with its spares, written once: a worker reads it, never writes it
    (two writing it at once let one read it empty, and find no spare)."""
    conf = "".join(f"NodeName={s} CPUs=1 State=FUTURE\n" for s in SPARES)
    (tmp_path / "slurm.conf").write_text(conf)
    return tmp_path


def provider(sandbox_dir: Path) -> SandboxProvider:
    return SandboxProvider(SlowListing(), sandbox_dir, Path("/bin/false"))  # type: ignore[arg-type]


def test_two_workers_choosing_at_once_never_share_a_spare(tmp_path: Path) -> None:
    chosen: dict[str, list[tuple[str, str]]] = {"a": [], "b": []}

    fleet(tmp_path)

    def worker(name: str, runs: list[str]) -> None:
        p = provider(tmp_path)

        async def all_at_once() -> list[Any]:
            return await asyncio.gather(*(p._choose_spare(f"gpu-{r}", r, None) for r in runs))

        picks = asyncio.run(all_at_once())
        chosen[name] = [(r, spare) for r, (spare, _) in zip(runs, picks, strict=True)]

    runs = [f"run{i}" for i in range(len(SPARES))]
    threads = [
        threading.Thread(target=worker, args=("a", runs[0::2])),
        threading.Thread(target=worker, args=("b", runs[1::2])),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    spares = [spare for picks in chosen.values() for _, spare in picks]
    assert sorted(spares) == SPARES  # every spare once, none twice

    # A retried run (its worker died after choosing) gets the spare recorded for it.
    again = asyncio.run(provider(tmp_path)._choose_spare("gpu-run3", "run3", None))
    assert again == (dict(chosen["b"])["run3"], True)
