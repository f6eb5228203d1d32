"""Line charts as plain inline SVG for the dashboard: no script and no library, so the page
stays one file that the CSP lets render from disk."""

from __future__ import annotations

import dataclasses
import html

WIDTH, HEIGHT = 760, 260
LEFT, RIGHT, TOP, BOTTOM = 60, 190, 28, 70  # room for the value axis, the legend and the labels
PALETTE = ("#2a7", "#d90", "#c33", "#84c", "#888", "#27c", "#a52", "#3aa")


@dataclasses.dataclass(frozen=True)
class Line:
    name: str
    values: list[float | None]  # one per run; None where the run has no value
    color: str | None = None
    named: bool = True  # in the legend (a chart of many cells names only the ones that moved)


def line_chart(title: str, labels: list[str], lines: list[Line], unit: str = "") -> str:
    """One chart: x the runs in order, y the lines' values from 0 (or their least) up."""
    values = [v for line in lines for v in line.values if v is not None]
    if not values or not labels:
        return f'<p class="chart">{html.escape(title)}: no values</p>'
    lo = min(0.0, min(values))
    hi = max(values)
    hi = hi if hi > lo else lo + 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(i: int) -> float:
        return LEFT + (plot_w * i / (len(labels) - 1) if len(labels) > 1 else plot_w / 2)

    def y(v: float) -> float:
        return TOP + plot_h * (1 - (v - lo) / (hi - lo))

    out = [
        f'<svg width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-label="{html.escape(title)}"><title>{html.escape(title)}</title>',
        f'<text x="{LEFT}" y="16" font-size="13" font-weight="bold">{html.escape(title)}</text>',
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" stroke="#999"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" stroke="#999"/>',
    ]
    for v in (lo, (lo + hi) / 2, hi):
        out.append(
            f'<text x="{LEFT - 4}" y="{y(v) + 4:.1f}" font-size="10" text-anchor="end">{_tick(v)}{unit}</text>'
            f'<line x1="{LEFT}" y1="{y(v):.1f}" x2="{LEFT + plot_w}" y2="{y(v):.1f}" stroke="#eee"/>'
        )
    for i, label in enumerate(labels):
        out.append(
            f'<text x="{x(i):.1f}" y="{TOP + plot_h + 14}" font-size="10" text-anchor="end" '
            f'transform="rotate(-30 {x(i):.1f} {TOP + plot_h + 14})">{html.escape(label)}</text>'
        )
    legend = 0
    for n, line in enumerate(lines):
        color = line.color or PALETTE[n % len(PALETTE)]
        points = [(x(i), y(v)) for i, v in enumerate(line.values) if v is not None]
        tip = f"<title>{html.escape(line.name)}</title>"
        path = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.5">{tip}</polyline>')
        out += [f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.5" fill="{color}">{tip}</circle>' for px, py in points]
        if line.named:
            ly = TOP + 12 * legend
            out.append(
                f'<rect x="{WIDTH - RIGHT + 10}" y="{ly - 8}" width="10" height="3" fill="{color}"/>'
                f'<text x="{WIDTH - RIGHT + 24}" y="{ly}" font-size="10">{html.escape(_short(line.name))}</text>'
            )
            legend += 1
    out.append("</svg>")
    return "\n".join(out)


def _tick(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _short(name: str, limit: int = 30) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"
