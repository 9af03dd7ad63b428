"""`make soak` (python -m infra.soak --minutes M --seed S): the chaos soak, then its checker."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from infra.sandbox.stack import PORTS
from infra.soak.run import soak


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="make soak", description=__doc__)
    ap.add_argument("--minutes", type=float, default=60.0, help="how long the load and faults last (default 60)")
    ap.add_argument("--seed", type=int, default=1, help="the seed the load and faults are drawn from (replays them)")
    ap.add_argument(
        "--settle",
        type=float,
        default=None,
        help="minutes to wait for incidents to end (default: as long as the load, at most 60)",
    )
    ap.add_argument(
        "--temporal",
        choices=["cluster", "dev"],
        default="cluster",
        help="Temporal: the cluster (default) or the dev server",
    )
    ap.add_argument(
        "--root", type=Path, default=Path("/tmp/gpuheal-soak"), help="where everything runs (default /tmp/gpuheal-soak)"
    )
    ap.add_argument("--report", type=Path, default=None, help="where the report goes (default: ROOT/soak.md)")
    ap.add_argument(
        "--ports",
        choices=[name for name in PORTS if name.startswith("soak")],
        default="soak",
        help="the port set (default soak; soak-long beside `make test`'s own soak)",
    )
    args = ap.parse_args(argv)
    if args.minutes <= 0:
        ap.error("--minutes must be more than 0")
    settle = args.settle if args.settle is not None else min(args.minutes, 60.0)
    return asyncio.run(soak(args.minutes, args.seed, settle, args.root, args.temporal, args.report, args.ports))


if __name__ == "__main__":
    sys.exit(main())
