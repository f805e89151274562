"""A grouped bar chart of TFLOP/s per workload and provider (matplotlib, an optional extra)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .report import tflops_text, timed


class PlotUnavailable(RuntimeError):
    pass


def plot(rows: list[dict[str, Any]], workloads: Sequence[tuple[str, str]], providers: Sequence[str],
         path: str, title: str) -> None:
    """Bars: one group per workload (x), one bar per provider, height TFLOP/s, value on top."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'mqa-core[plot]' "
                              f"(or pip install matplotlib); {exc}") from exc
    value = {(r["provider"], r["workload"]): r["tflops"] for r in timed(rows) if r["status"] == "ok"}
    n, k = len(workloads), max(1, len(providers))
    width = 0.8 / k
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * n * max(1.0, k / 2) + 2), 4.8), layout="constrained")
    top = max(value.values(), default=1.0)
    for i, name in enumerate(providers):
        xs = [j + (i - (k - 1) / 2) * width for j in range(n)]
        ys = [value.get((name, w), 0.0) for w, _ in workloads]
        bars = ax.bar(xs, ys, width * 0.95, label=name)
        for bar, y in zip(bars, ys):
            ax.annotate(tflops_text(y) if y else "n/a", (bar.get_x() + bar.get_width() / 2, y),
                        xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                        fontsize=7, rotation=90 if k > 3 else 0)
    ax.set_xticks(range(n), [label for _, label in workloads], fontsize=8)
    ax.set_ylabel("TFLOP/s (2·H·D per valid pair)")
    ax.set_ylim(0, top * 1.18)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(title="provider", fontsize=8)
    fig.savefig(path, dpi=150)
    plt.close(fig)
