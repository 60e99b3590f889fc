"""PNG plots of a run from its ``metrics.jsonl``: reward (mean with a ±std band) and completion
length (mean and max) per step. Written at the end of training and on Ctrl-C."""

from __future__ import annotations

import os
from typing import Any

from .metrics import read_jsonl


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if v is not None:
            xs.append(float(r["step"]))
            ys.append(float(v))
    return xs, ys


def write_plots(output_dir: str) -> list[str]:
    """Write ``plots/reward.png`` and ``plots/completion_length.png``; returns their paths."""
    rows = read_jsonl(output_dir)
    if not rows:
        return []
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    out_dir = os.path.join(output_dir, "plots")
    os.makedirs(out_dir, exist_ok=True)

    def save(fig: Any, ax: Any, name: str, ylabel: str, title: str) -> str:
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best")
        else:  # nothing to draw (every trajectory of every step failed): say so rather than warn
            ax.text(0.5, 0.5, "no values logged", ha="center", va="center", transform=ax.transAxes, color="gray")
        fig.tight_layout()
        path = os.path.join(out_dir, name)
        fig.savefig(path)
        plt.close(fig)
        return path

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    xs, mean = _series(rows, "reward")
    _, std = _series(rows, "reward_std")
    if xs:
        ax.plot(xs, mean, color="tab:blue", label="mean reward")
        if len(std) == len(mean):
            ax.fill_between(xs, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                            color="tab:blue", alpha=0.2, label="± std")
    paths = [save(fig, ax, "reward.png", "reward", "reward per step")]

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    xs, mean = _series(rows, "completion_length")
    xm, mx = _series(rows, "completion_length/max")
    if xs:
        ax.plot(xs, mean, color="tab:green", label="mean")
    if xm:
        ax.plot(xm, mx, color="tab:green", linestyle="--", alpha=0.6, label="max")
    paths.append(save(fig, ax, "completion_length.png", "completion tokens", "completion length per step"))
    return paths
