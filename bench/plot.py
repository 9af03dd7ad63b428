"""A small SVG line plot for the benchmark reports (no plotting library in the venv)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

COLOURS = ("#1b7837", "#d95f02", "#7570b3", "#e7298a")
W, H, LEFT, RIGHT, TOP, BOTTOM = 760, 420, 70, 20, 30, 110


def goodput_svg(xs: Sequence[float], series: Mapping[str, Sequence[float]], labels: Mapping[str, str]) -> str:
    """Effective training time (y, 0..100 %) against the failure rate (x, log scale)."""
    lo, hi = math.log2(min(xs)), math.log2(max(xs))
    ymin = max(0.0, math.floor(min(min(v) for v in series.values()) * 10) / 10)

    def px(x: float) -> float:
        return LEFT + (math.log2(x) - lo) / (hi - lo or 1) * (W - LEFT - RIGHT)

    def py(y: float) -> float:
        return TOP + (1 - (y - ymin) / (1 - ymin or 1)) * (H - TOP - BOTTOM)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="14">'
        "Effective training time against failure rate</text>",
    ]
    steps = round((1 - ymin) / 0.05)
    for i in range(steps + 1):
        y = ymin + i * 0.05
        out.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{py(y):.1f}" y2="{py(y):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.0%}</text>')
    for x in xs:
        out.append(f'<text x="{px(x):.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">x{x:g}</text>')
    out.append(
        f'<text x="{W / 2}" y="{H - BOTTOM + 34}" text-anchor="middle">'
        "failure rate, times Llama 3's published rate (log scale)</text>"
    )
    for k, (name, ys) in enumerate(series.items()):
        colour = COLOURS[k % len(COLOURS)]
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys, strict=True))
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>')
        out += [
            f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>' for x, y in zip(xs, ys, strict=True)
        ]
        ly = H - BOTTOM + 54 + 16 * k
        out.append(f'<rect x="{LEFT}" y="{ly - 9}" width="14" height="4" fill="{colour}"/>')
        out.append(f'<text x="{LEFT + 20}" y="{ly - 4}">{escape(labels.get(name, name))}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
