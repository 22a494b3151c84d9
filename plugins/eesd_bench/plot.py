"""The speedup chart: one group of bars per task, one bar per method (matplotlib, optional)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_speedups(summary: dict[str, Any], path: str | Path) -> str | None:
    """Write the chart to ``path``; return why not (matplotlib missing) or ``None`` when written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'eesd[bench]'): no plot written"
    groups = [*summary["groups"], "overall"]
    methods = list(summary["overall"])
    tables = {**summary["groups"], "overall": summary["overall"]}
    width = 0.8 / max(len(methods), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(groups) + 0.15 * len(groups) * len(methods)), 4.5))
    for i, method in enumerate(methods):
        values = [tables[g].get(method, {}).get("speedup") or 0.0 for g in groups]
        ax.bar(
            [x + (i - (len(methods) - 1) / 2) * width for x in range(len(groups))],
            values,
            width,
            label=method,
        )
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(groups)), groups, rotation=20)
    ax.set_ylabel(f"speedup vs {summary['baseline']}")
    ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
