"""Two sandboxes in one Slurm root (infra/slurm/sandbox.sh): `make test`'s tests and its soak
run the newer releases side by side in the same Debian root. One stopping must neither wait on
the other (no daemon of the other holds the root's lock) nor take the root from under it (its
munged, its mounts), and the last to stop releases the root."""

from __future__ import annotations

import time
from pathlib import Path

from infra.sandbox import NEWEST_SLURM
from infra.sandbox.slurm import root_path
from infra.sandbox.stack import Sandbox

STOP_S = 30.0  # a stop of one sandbox: seconds (its daemons at once), never a wait on another's


def in_root(root: Path) -> list[str]:
    """The command lines of the processes whose root directory is `root` (its munged, its daemons)."""
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if (p / "root").resolve() == root:
                    found.append((p / "cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
    return found


def test_one_sandbox_stops_beside_another_in_the_same_root_and_the_last_releases_it(tmp_path: Path) -> None:
    a = Sandbox.named("detect", tmp_path / "a")
    b = Sandbox.named("bench", tmp_path / "b")
    for sb in (a, b):
        sb.use_slurm(NEWEST_SLURM)
    root = root_path(NEWEST_SLURM).resolve()
    try:
        a.start_slurm(clean=True)
        b.start_slurm(clean=True)
        began = time.monotonic()
        b.stop_slurm()
        assert time.monotonic() - began < STOP_S  # it waited on nothing of a's
        assert "gpu01" in a.slurm("sinfo", "-h", "-N", "-o", "%N")  # a's slurmctld and munged still answer
        a.slurm("scontrol", "ping")
    finally:
        b.stop_slurm()
        a.stop_slurm()
    left = in_root(root)
    assert not [cmd for cmd in left if str(tmp_path) in cmd]  # neither left a daemon behind
    others = [u for u in (root / "run" / "gpuheal-sandboxes").iterdir() if not u.name.startswith(".")]
    if not others:  # no other sandbox (a soak beside the tests) in the root: the last one out released it
        assert left == []
