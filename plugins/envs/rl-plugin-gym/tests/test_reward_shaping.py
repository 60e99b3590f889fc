"""Progress shaping on real gymnasium envs, and the ``frozen_lake`` preset built on it."""

from __future__ import annotations

import pytest

import rlcore
from rl_plugin_gym.gymnasium_env import GymnasiumEnv
from rl_plugin_gym.resolve import make_env
from rlcore.errors import ConfigError
from rlcore.types import Trajectory


def request(seed: int = 0) -> Trajectory:
    return Trajectory(prompt_ids=[], data={"env_config": {"seed": seed}}, group_id="g")


async def steps(env, replies):
    await env.reset(request())
    out = []
    for reply in replies:
        out.append(await env.step(reply))
        if out[-1][2]:
            break
    await env.close()
    return out


async def test_progress_shaping_telescopes_to_env_return_plus_progress(plan):
    env = GymnasiumEnv("FrozenLake-v1", is_slippery=False, reward_shaping="progress")
    await env.reset(request())
    moves = [env.format.action_names[a] for a in plan(env.env.unwrapped, 0)]
    await env.close()
    out = await steps(GymnasiumEnv("FrozenLake-v1", is_slippery=False, reward_shaping="progress"), moves)
    assert [round(r, 4) for _, r, _, _ in out[:-1]] == [round(1 / 6, 4)] * (len(moves) - 1)  # one cell closer each
    assert out[-1][1] == pytest.approx(1 + 1 / 6) and out[-1][3]["env_reward"] == 1.0
    assert sum(r for _, r, _, _ in out) == pytest.approx(2.0)  # the goal (1) + all the way there (1)


async def test_moving_away_costs_what_moving_closer_earned():
    out = await steps(GymnasiumEnv("FrozenLake-v1", is_slippery=False, reward_shaping="progress"), ["DOWN", "UP", "LEFT"])
    assert [round(r, 4) for _, r, _, _ in out] == [round(1 / 6, 4), round(-1 / 6, 4), 0.0]  # LEFT hits the edge
    assert all(info["shaping"] == r for _, r, _, info in out)


async def test_cliff_walking_has_a_potential_too():
    with pytest.warns(UserWarning, match="retired"):
        env = GymnasiumEnv("CliffWalking-v0", reward_shaping="progress")
    out = await steps(env, ["UP", "RIGHT"])
    assert out[0][1] == pytest.approx(-1 - 1 / 14) and out[1][1] == pytest.approx(-1 + 1 / 14)


def test_shaping_needs_a_distance():
    with pytest.raises(ConfigError, match="progress shaping supports FrozenLake and CliffWalking"):
        GymnasiumEnv("Blackjack-v1", reward_shaping="progress")
    with pytest.raises(ConfigError, match="reward_shaping='speed' is unknown"):
        GymnasiumEnv("FrozenLake-v1", reward_shaping="speed")


async def test_frozen_lake_preset_is_firm_shaped_and_compact():
    assert "frozen_lake" in rlcore.available("env")
    env = make_env("frozen_lake")
    obs, _info, system = await env.reset(request())
    assert env.gym_id == "FrozenLake-v1" and "slippery" not in system and "Map" not in obs
    assert "DOWN is frozen ice" in obs
    invalid = await env.step("hello")
    assert invalid[1] == 0.0 and invalid[3]["invalid_action"]  # a wasted turn is the only cost
    await env.close()
    slippery = make_env("frozen_lake", {"is_slippery": True})
    _obs, _info, system = await slippery.reset(request())
    assert "slippery" in system
    await slippery.close()
