"""Per-step metrics: what a generation batch looked like (rewards, lengths, turns, failures) and
what the optimizer saw (loss, KL, clipping, entropy, IS ratios), appended as one JSON line per
logged step to ``OUTPUT_DIR/metrics.jsonl`` so runs can be compared without any tracker."""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from typing import Any, Sequence

METRICS_FILE = "metrics.jsonl"


def _mean(xs: Sequence[float]) -> float:
    vals = [x for x in xs if x is not None and not math.isnan(x)]
    return sum(vals) / len(vals) if vals else float("nan")


def _std(xs: Sequence[float]) -> float:
    vals = [x for x in xs if x is not None and not math.isnan(x)]
    if len(vals) < 2:
        return 0.0
    m = sum(vals) / len(vals)
    return math.sqrt(sum((x - m) ** 2 for x in vals) / (len(vals) - 1))


def rollout_metrics(trajectories: Sequence[Any], columns: dict[str, list[float | None]], zero_std_frac: float) -> dict[str, float]:
    """Metrics of one generation batch."""
    rewards = [t.reward if t.reward is not None else float("nan") for t in trajectories]
    lengths = [t.num_completion_tokens for t in trajectories]
    sampled = [sum(sum(turn.loss_mask) for turn in t.turns) for t in trajectories]
    out: dict[str, float] = {
        "reward": _mean(rewards),
        "reward_std": _std(rewards),
        "advantage_zero_std_frac": zero_std_frac,
        "completion_length": _mean(lengths) if lengths else 0.0,
        "completion_length/max": float(max(lengths)) if lengths else 0.0,
        "completion_length/min": float(min(lengths)) if lengths else 0.0,
        "num_turns": _mean([t.num_turns for t in trajectories]) if trajectories else 0.0,
        "failed_trajectories": float(sum(1 for t in trajectories if t.status == "failed")),
        "truncated_trajectories": float(sum(1 for t in trajectories if t.status == "truncated")),
        "sampled_tokens": float(sum(sampled)),
    }
    for name, vals in columns.items():
        out[f"rewards/{name}"] = _mean([v if v is not None else float("nan") for v in vals])
    out.update(trl_rollout_metrics(trajectories, columns, zero_std_frac))
    return out


def trl_rollout_metrics(trajectories: Sequence[Any], columns: dict[str, list[float | None]], zero_std_frac: float) -> dict[str, float]:
    """The generation-side keys TRL 1.16's ``GRPOTrainer`` logs (``_generate``,
    ``_generate_and_score_completions``), so TRL dashboards read rlcore runs. Lengths count the
    sampled tokens (TRL's ``tool_mask``); a completion is clipped when it hit the length limit."""
    lengths = [float(sum(sum(turn.loss_mask) for turn in t.turns)) for t in trajectories] or [0.0]
    clipped = [t.status == "truncated" for t in trajectories]
    terminated = [n for n, c in zip(lengths, clipped) if not c] or [0.0]
    out: dict[str, float] = {
        "completions/mean_length": sum(lengths) / len(lengths),
        "completions/min_length": min(lengths),
        "completions/max_length": max(lengths),
        "completions/clipped_ratio": sum(clipped) / len(clipped) if clipped else 0.0,
        "completions/mean_terminated_length": sum(terminated) / len(terminated),
        "completions/min_terminated_length": min(terminated),
        "completions/max_terminated_length": max(terminated),
        "frac_reward_zero_std": zero_std_frac,
    }
    for name, vals in columns.items():
        clean = [v if v is not None else float("nan") for v in vals]
        out[f"rewards/{name}/mean"] = _mean(clean)
        out[f"rewards/{name}/std"] = _std(clean)
    return out


class MetricAccumulator:
    """Averages train-side metrics over the micro-batches between two logs."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = defaultdict(float)
        self._counts: dict[str, int] = defaultdict(int)

    def add(self, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            if v is None or (isinstance(v, float) and math.isnan(v)):
                continue
            self._sums[k] += float(v)
            self._counts[k] += 1

    def pop(self) -> dict[str, float]:
        out = {k: self._sums[k] / self._counts[k] for k in self._sums if self._counts[k]}
        self._sums.clear()
        self._counts.clear()
        return out


def append_jsonl(output_dir: str, record: dict[str, Any]) -> None:
    os.makedirs(output_dir, exist_ok=True)
    clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in record.items()}
    with open(os.path.join(output_dir, METRICS_FILE), "a", encoding="utf-8") as f:
        f.write(json.dumps(clean) + "\n")


def read_jsonl(output_dir: str) -> list[dict[str, Any]]:
    path = os.path.join(output_dir, METRICS_FILE)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def truncate_jsonl(output_dir: str, max_step: int) -> None:
    """On resume, drop lines logged after the checkpoint's step (they will be logged again)."""
    rows = [r for r in read_jsonl(output_dir) if int(r.get("step", 0)) <= max_step]
    path = os.path.join(output_dir, METRICS_FILE)
    if os.path.exists(path):
        with open(path, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
