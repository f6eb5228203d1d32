"""``scale.png``: what simulated worlds measured against the sharding arithmetic, by world size.

One row per (model, tie) with simulated cells: the memory one rank holds after setup (its
shards and the module's buffers) and the bytes the forward all-gathers per step, both
against world size on log-log axes. The line is the arithmetic over every world size from 4
to 1024, from the model's shapes as the sampled ranks reported them (reports/world_sizes.py,
no model is built here); the points
are every sampled rank's measurement, which should sit on the line and on one another
(ranks that disagree, or a world size where padding was miscounted, show as points apart).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.reports.simulated import SimulatedCell, simulated_cells
from conformance.reports.world_sizes import arithmetic

# per panel: title, the Arithmetic field drawn as its line, and where its points are in the
# report (area, metric, key)
PANELS = (
    ("held after setup per rank", "held", "memory", "retained after setup", "measured"),
    ("forward all-gathered bytes per step", "gathered", "collectives", "forward all-gathered bytes", "actual"),
)


def measured(cells: list[SimulatedCell], area: str, name: str, key: str) -> tuple[list[int], list[int]]:
    """World sizes and values of every sampled rank's ``name[key]`` in ``area``."""
    points = [(c.world_size, v[key]) for c in cells for v in c.metric(area, name).values() if v.get(key) is not None]
    return [x for x, _ in points], [y for _, y in points]


def _described(cells: list[SimulatedCell]) -> Any:
    """The model as a sampled rank of one of ``cells`` described it (sharding's ``model``)."""
    return next((m for c in cells for m in c.metric("sharding", "model").values() if m), None)


def scale_figure(report: dict[str, Any], path: Path) -> bool:
    """Write the figure to ``path``; False where the report holds no simulated cell."""
    cells = simulated_cells(report)
    if not cells:
        return False
    groups: dict[tuple[str, str], list[SimulatedCell]] = {}
    for c in cells:
        groups.setdefault((c.model, c.tie), []).append(c)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(groups), 2, figsize=(10, 4 * len(groups)), constrained_layout=True, squeeze=False)
    for row, ((model, tie), group) in zip(axes, sorted(groups.items()), strict=True):
        line = arithmetic(_described(group))  # None where the ranks did not describe the model: points alone
        for ax, (title, attr, area, name, key) in zip(row, PANELS, strict=True):
            if line is not None:
                ax.plot(line.sizes, getattr(line, attr), color="grey", lw=1, label="arithmetic")
            xs, ys = measured(group, area, name, key)
            if xs:
                ax.scatter(xs, ys, marker="o", facecolors="none", edgecolors="C0", label="measured (sampled ranks)")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("world size")
            ax.set_ylabel("bytes")
            ax.set_title(f"{model} ({tie})\n{title}")  # two lines: a panel is narrow
            if ax.get_legend_handles_labels()[0]:  # an unknown model whose item recorded nothing
                ax.legend(loc="best", fontsize="small")
    fig.suptitle(f"{report['environment'].get('thunder', '?')}, simulated worlds")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
