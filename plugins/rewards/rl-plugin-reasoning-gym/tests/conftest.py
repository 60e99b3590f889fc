"""Fixtures for rl-plugin-reasoning-gym's tests: load only this plugin; real reasoning-gym rows and
real trajectories scored through rlcore's reward machinery."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest

from rlcore.types import Trajectory, Turn


def trajectory(row: dict[str, Any], text: str) -> Trajectory:
    """A finished one-turn trajectory of ``row`` whose assistant message is ``text``."""
    data = {k: v for k, v in row.items() if k != "prompt"}
    return Trajectory(
        prompt_ids=[1, 2, 3],
        messages=[{"role": "user", "content": row.get("question", "q")}, {"role": "assistant", "content": text}],
        data=data,
        turns=[Turn(token_ids=[4, 5], loss_mask=[1, 1], logprobs=[-0.5, -0.5], text=text)],
        status="ok",
        num_turns=1,
    )


@pytest.fixture
def score() -> Callable[..., list[float | None]]:
    """Score ``texts`` for ``rows`` with the registered reward ``name`` (options as keywords), the
    way a run does: rlcore's registry, ``as_reward``, the ``compute_reward`` hook."""
    import rlcore
    from rlcore import RunHooks
    from rlcore.rewards import as_reward, compute_rewards

    def run(rows: list[dict[str, Any]], texts: list[str], name: str = "reasoning_gym", **options: Any) -> list[float | None]:
        factory = rlcore.get("reward", name)
        reward = as_reward(name, factory(**options) if options else factory)
        trajs = [trajectory(r, t) for r, t in zip(rows, texts)]
        columns = asyncio.run(compute_rewards(RunHooks(reward, observers=False), trajs))
        run.last = reward  # type: ignore[attr-defined]  (for tests that read its error count)
        return columns[name]

    return run
