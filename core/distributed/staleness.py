"""Async generation's bookkeeping: which trajectories are too old to train on, and the prefetch of
the next step's rollouts while this step trains.

Why drop by policy version: in async mode a trajectory is sampled by weights that are already one
or more optimizer steps behind. A little lag is fine — importance correction uses the sampler's own
logprobs that travel with the tokens — but past ``max_staleness`` versions the ratio is mostly
noise and clipping, so those trajectories are dropped and counted.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

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


class RolloutPrefetcher:
    """Runs ``produce(step)`` as a background task so step ``t+1``'s rollouts overlap step ``t``'s
    training. At most one batch is in flight (that bounds the lag to one step's worth of syncs
    plus whatever the sampler was already doing)."""

    def __init__(self, produce: Callable[[int], Awaitable[list[Trajectory]]]) -> None:
        self.produce = produce
        self._task: asyncio.Task[list[Trajectory]] | None = None
        self._step: int | None = None

    def start(self, step: int) -> None:
        if self._task is not None and not self._task.done():
            raise RuntimeError("a rollout batch is already in flight")
        self._step = step
        self._task = asyncio.ensure_future(self.produce(step))

    @property
    def in_flight(self) -> bool:
        return self._task is not None and not self._task.done()

    async def take(self) -> list[Trajectory]:
        """Wait for the batch in flight and return it."""
        if self._task is None:
            raise RuntimeError("no rollout batch was started")
        task, self._task = self._task, None
        return await task

    async def cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                pass
        self._task = None


def staleness_metrics(kept: list[Trajectory], dropped: list[Trajectory], current_version: int) -> dict[str, Any]:
    lags = [current_version - trajectory_version(t) for t in kept]
    return {
        "async/dropped_stale": float(len(dropped)),
        "async/mean_lag": float(sum(lags) / len(lags)) if lags else 0.0,
        "async/max_lag": float(max(lags)) if lags else 0.0,
    }
