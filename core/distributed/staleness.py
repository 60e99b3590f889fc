"""Async generation's bookkeeping: which trajectories are too old to train on, and how old the
ones kept are (the prefetch itself is the trainer's).

Why drop by policy version: in async mode a trajectory is sampled by weights that are already one
or more optimizer steps behind. A little lag is fine — importance correction uses the sampler's own
logprobs that travel with the tokens — but past ``max_staleness`` versions the ratio is mostly
noise and clipping, so those trajectories are dropped and counted.
"""

from __future__ import annotations

from typing import Any

from ..types import Trajectory


def trajectory_version(t: Trajectory) -> int:
    """The oldest policy version that produced any of ``t``'s tokens (a trajectory may span a sync)."""
    return int(t.policy_version)


def filter_stale(
    trajectories: list[Trajectory], current_version: int, max_staleness: int
) -> tuple[list[Trajectory], list[Trajectory]]:
    """Split into (kept, dropped): dropped were sampled more than ``max_staleness`` versions ago.

    Whole groups are kept or dropped together, by their oldest member, so a group's advantage
    baseline is never computed over a partial group.
    """
    oldest: dict[str, int] = {}
    for t in trajectories:
        g = t.group_id or t.uuid
        oldest[g] = min(oldest.get(g, trajectory_version(t)), trajectory_version(t))
    kept, dropped = [], []
    for t in trajectories:
        lag = current_version - oldest[t.group_id or t.uuid]
        (dropped if lag > max_staleness else kept).append(t)
    return kept, dropped


def staleness_metrics(kept: list[Trajectory], dropped: list[Trajectory], current_version: int) -> dict[str, Any]:
    lags = [current_version - trajectory_version(t) for t in kept]
    return {
        "async/dropped_stale": float(len(dropped)),
        "async/mean_lag": float(sum(lags) / len(lags)) if lags else 0.0,
        "async/max_lag": float(max(lags)) if lags else 0.0,
    }
