"""The checker shown to catch what it exists for: each of the issue's three breaks put into a copy
of gpuheal, and a soak run on the copy, which must find the break's invariant broken.

    python -m infra.soak.breaking double-drain|grant-leak|breaker-reset [--minutes 4] [--seed 3]

The copy is a git worktree of HEAD with infra/soak/breaks/NAME.patch applied; the soak runs from
it, and its workers (spawned with PYTHONPATH on the copy) run the broken code.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from infra.soak.acts import RELAPSE_TOOK, acts
from infra.soak.invariants import BREAKER, LEAKS, TWICE

HERE = Path(__file__).parent
REPO = HERE.parent.parent
BREAKS = {"double-drain": TWICE, "grant-leak": LEAKS, "breaker-reset": BREAKER}


def copy_with(name: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(where)], capture_output=True)
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), "HEAD"], check=True)
    subprocess.run(["git", "-C", str(where), "apply", str(HERE / "breaks" / f"{name}.patch")], check=True)
    return where


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infra.soak.breaking", description=__doc__)
    ap.add_argument("name", choices=sorted(BREAKS))
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--temporal", choices=["cluster", "dev"], default="cluster")
    ap.add_argument("--ports", choices=["soak", "soak-long"], default="soak")
    args = ap.parse_args(argv)
    # A path of its own each time, so no Slurm root holds a mount of an earlier copy at it.
    copy = copy_with(args.name, Path(f"/tmp/gpuheal-break-{args.name}-{os.getpid()}"))
    root = Path(f"/tmp/gpuheal-soak-{args.name}")
    try:
        soak = [sys.executable, "-m", "infra.soak", "--minutes", str(args.minutes), "--seed", str(args.seed)]
        soak += ["--settle", str(args.minutes), "--temporal", args.temporal, "--root", str(root), "--ports", args.ports]
        env = {**os.environ, "PYTHONPATH": str(copy)}
        done = subprocess.run(soak, cwd=copy, env=env)
        verdicts = json.loads((root / "verdicts.json").read_text())
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(copy)], capture_output=True)
    wanted = BREAKS[args.name]
    caught = verdicts.get(wanted, 0) > 0 and done.returncode == 1
    others = {k: n for k, n in verdicts.items() if n and k != wanted}
    # The double drain's scene: a new run on a node an aborted run left drained (infra.soak.acts).
    relapses = [a for a in acts(root / "acts.jsonl") if a.get("act") == "relapse"]
    scenes = f"; relapses taken by a new run: {sum(RELAPSE_TOOK in a['said'] for a in relapses)} of {len(relapses)}"
    print(
        f"{args.name}: {wanted!r} {'caught' if caught else 'NOT CAUGHT'} ({verdicts.get(wanted, 0)} violations); "
        f"other invariants broken with it: {others or 'none'}{scenes}; report {root / 'soak.md'}"
    )
    return 0 if caught else 1


if __name__ == "__main__":
    sys.exit(main())
