"""PNG plots of a run from its ``metrics.jsonl``: reward (mean with a ±std band) and completion
length per step. Written at the end of training and on Ctrl-C.

The length plot counts the tokens the model sampled (``completions/*``, TRL's keys), never the
environment's observations: a multi-turn run's ``completion_length`` counts everything after the
prompt, so a 6-token-per-turn game plotted 210-270 "completion tokens" beside a header saying
"6 tokens max per turn". Multi-turn runs get the sampled tokens per episode (mean, max) and per
turn (the episode's mean over its turns) against the per-turn cap."""

from __future__ import annotations

import contextlib
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


def length_series(rows: list[dict[str, Any]], max_completion_length: int | None = None
                  ) -> tuple[str, str, list[tuple[str, list[float], list[float], dict[str, Any]]]]:
    """(title, y label, [(label, steps, values, line style)]) of the completion-length plot."""
    sampled = "completions/mean_length" if any(r.get("completions/mean_length") is not None for r in rows) \
        else "completion_length"  # metrics written before rlcore logged TRL's keys
    longest = "completions/max_length" if sampled != "completion_length" else "completion_length/max"
    multi_turn = any((r.get("num_turns") or 0) > 1 for r in rows)
    xs, mean = _series(rows, sampled)
    xm, mx = _series(rows, longest)
    if not multi_turn:
        series = [("mean", xs, mean, {"color": "tab:green"}),
                  ("max", xm, mx, {"color": "tab:green", "linestyle": "--", "alpha": 0.6})]
        return "completion length per step (sampled tokens)", "sampled tokens per completion", series
    per_turn = [(float(r["step"]), float(r[sampled]) / float(r["num_turns"])) for r in rows
                if r.get(sampled) is not None and r.get("num_turns")]
    series = [
        ("per episode: mean", xs, mean, {"color": "tab:green"}),
        ("per episode: max", xm, mx, {"color": "tab:green", "linestyle": "--", "alpha": 0.6}),
        ("per turn: mean", [x for x, _ in per_turn], [y for _, y in per_turn], {"color": "tab:purple"}),
    ]
    if max_completion_length and per_turn:
        steps = [x for x, _ in per_turn]
        series.append((f"per-turn cap (max_completion_length={max_completion_length})", [steps[0], steps[-1]],
                       [float(max_completion_length)] * 2, {"color": "gray", "linestyle": ":"}))
    return ("tokens the model sampled per step (observations not counted)", "sampled tokens", series)


def write_plots(output_dir: str, max_completion_length: int | None = None) -> list[str]:
    """Write ``plots/reward.png`` and ``plots/completion_length.png``; returns their paths.
    ``max_completion_length`` (the per-turn cap) is drawn on a multi-turn run's length plot."""
    rows = read_jsonl(output_dir)
    if not rows:
        return []
    # the plots are always drawn with Agg: a bad MPLBACKEND in the user's environment (which fails
    # matplotlib's import) is not theirs to choose here
    backend = os.environ.get("MPLBACKEND")
    os.environ["MPLBACKEND"] = "Agg"
    try:
        import matplotlib
    finally:
        if backend is None:
            os.environ.pop("MPLBACKEND", None)
        else:
            os.environ["MPLBACKEND"] = backend

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
        tmp = os.path.join(out_dir, f".{name}.{os.getpid()}.tmp")
        try:  # written whole, then renamed: a full disk leaves no 0-byte or cut PNG behind
            fig.savefig(tmp, format="png")
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
        finally:
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
    title, ylabel, series = length_series(rows, max_completion_length)
    for label, sx, sy, style in series:
        if sx:
            ax.plot(sx, sy, label=label, **style)
    paths.append(save(fig, ax, "completion_length.png", ylabel, title))
    return paths
