"""Pictures for the report: how measured memory compares with what the kit derived.

``memory.png`` has one panel per bounded phase (setup, forward, backward): every memory
item's measured peak as a fraction of its bound, by model (1.0: at the bound; the distance
below it is the headroom a regression has); and one panel of what the forward left
allocated against what its trace returns, for the cells that offload.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PHASES = ("setup", "forward", "backward")


def memory_figure(report: dict[str, Any], path: Path) -> bool:
    """Write the figure to ``path``; False where the report holds no memory measurements."""
    cells = [c for c in report["cells"] if c.get("area") in ("memory", "offload") and c.get("metrics")]
    ratios = {
        phase: [
            (c["axes"]["model"], 1 / c["metrics"][f"{phase} peak"]["bound / measured"])
            for c in cells
            if (c["metrics"].get(f"{phase} peak") or {}).get("bound / measured")
        ]
        for phase in PHASES
    }
    held = [c["metrics"]["held after forward"] for c in cells if "held after forward" in c["metrics"]]
    if not any(ratios.values()) and not held:
        return False

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({m for pairs in ratios.values() for m, _ in pairs})
    fig, axes = plt.subplots(1, len(PHASES) + 1, figsize=(4 * (len(PHASES) + 1), 4), constrained_layout=True)
    for ax, phase in zip(axes, PHASES, strict=False):
        for i, model in enumerate(models):
            ys = [r for m, r in ratios[phase] if m == model]
            ax.scatter([i] * len(ys), ys, alpha=0.6)
        ax.axhline(1.0, color="red", lw=0.8, ls="--", label="bound")
        ax.set_ylim(0, 1.1)
        ax.set_xticks(range(len(models)), models, rotation=45, ha="right")
        ax.set_title(f"{phase}: measured / bound")
        ax.legend(loc="lower right", fontsize="small")
    ax = axes[-1]
    if held:
        xs, ys = [h["estimate"] for h in held], [h["measured"] for h in held]
        ax.scatter(xs, ys, alpha=0.6)
        top = max(*xs, *ys)
        ax.plot([0, top], [0, top], color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_title("offload: held after forward (bytes)")
    ax.set_xlabel("returned by the forward trace")
    ax.set_ylabel("measured")
    fig.suptitle(f"{report['environment'].get('thunder', '?')}, {report['environment'].get('backend', '?')}")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
