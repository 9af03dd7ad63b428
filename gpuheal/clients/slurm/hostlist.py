"""Slurm hostlist expressions, expanded in Python (no `scontrol show hostnames` per job).

``gpu[01-03,07]`` -> gpu01 gpu02 gpu03 gpu07; ``rack[1-2]-n[1-2]`` -> rack1-n1 rack1-n2 rack2-n1
rack2-n2; several expressions are separated by commas outside brackets. Zero padding follows
the range's first bound, as Slurm does.
"""

from __future__ import annotations

import itertools
import re

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand(expr: str) -> list[str]:
    """Every host name in `expr`, in order, duplicates kept out."""
    names: list[str] = []
    seen: set[str] = set()
    for part in _split_top(expr):
        for name in _expand_one(part):
            if name not in seen:
                seen.add(name)
                names.append(name)
    return names


def _split_top(expr: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {expr!r}")
        elif ch == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced '[' in hostlist {expr!r}")
    parts.append(expr[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_one(part: str) -> list[str]:
    pieces: list[list[str]] = []
    for literal, inside in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", part):
        if literal:
            pieces.append([literal])
        if inside:
            pieces.append(_ranges(inside, part))
    return ["".join(p) for p in itertools.product(*pieces)] if pieces else []


def _ranges(inside: str, part: str) -> list[str]:
    out: list[str] = []
    for item in inside.split(","):
        m = _RANGE.match(item.strip())
        if m is None:
            raise ValueError(f"bad range {item!r} in hostlist {part!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"descending range {item!r} in hostlist {part!r}")
        width = len(lo) if lo.startswith("0") else 0
        out += [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
    return out
