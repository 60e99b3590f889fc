"""The gymnasium adapter on real ``gymnasium.make`` envs, driven directly (no model, no scheduler)."""

from __future__ import annotations

import gymnasium
import pytest

from rl_plugin_gym.gymnasium_env import GymnasiumEnv, resolve_gym_id
from rl_plugin_gym.policy import InvalidActionError
from rlcore.errors import ConfigError
from rlcore.types import Trajectory


def request(seed: int | None = None, group: str = "g") -> Trajectory:
    data = {"env_config": {"seed": seed}} if seed is not None else {}
    return Trajectory(prompt_ids=[], data=data, group_id=group)


async def play(env: GymnasiumEnv, replies: list[str], seed: int = 0) -> tuple[list[float], str, bool]:
    await env.reset(request(seed))
    rewards, done, obs = [], False, ""
    for reply in replies:
        obs, reward, done, _info = await env.step(reply)
        rewards.append(reward)
        if done:
            break
    await env.close()
    return rewards, obs, done


async def test_frozen_lake_scripted_plan_reaches_the_goal(plan):
    env = GymnasiumEnv("FrozenLake-v1", is_slippery=False)
    obs, info, system = await env.reset(request(0))
    assert "row 1, column 1" in obs and "goal is at row 4, column 4" in obs and "DOWN is frozen ice" in obs
    assert "LEFT, DOWN, RIGHT, UP" in system and info["gym_id"] == "FrozenLake-v1"
    moves = [env.format.action_names[a] for a in plan(env.env.unwrapped, 0)]
    await env.close()
    rewards, last, done = await play(GymnasiumEnv("FrozenLake-v1", is_slippery=False), [m.lower() for m in moves])
    assert done and rewards[-1] == 1.0 and sum(rewards) == 1.0 and "reached the goal" in last


async def test_slippery_lake_says_what_was_chosen_not_where_it_went():
    env = GymnasiumEnv("FrozenLake-v1")  # slippery by default
    obs, _, system = await env.reset(request(0))
    text, _, _, info = await env.step("RIGHT")
    await env.close()
    assert "slippery" in system and info["action"] == "RIGHT" and text.startswith("You ")
    assert "moved RIGHT" not in text


async def test_frozen_lake_hole_ends_the_game_with_zero():
    rewards, last, done = await play(GymnasiumEnv("FrozenLake-v1", is_slippery=False), ["RIGHT", "DOWN"])
    assert done and rewards == [0.0, 0.0] and "fell into the hole at row 2, column 2" in last


async def test_taxi_v3_runs_and_a_plan_delivers_the_passenger(plan):
    with pytest.warns(UserWarning, match="retired Taxi-v3"):
        env = GymnasiumEnv("Taxi-v3")
    obs, _info, system = await env.reset(request(7))
    assert "The taxi is at row" in obs and "wants to go to the" in obs and "PICKUP" in system
    actions = plan(env.env.unwrapped, env.env.unwrapped.s)
    replies = [env.format.action_names[a] for a in actions]
    obs = ""
    rewards = []
    for reply in replies:
        obs, reward, done, _ = await env.step(reply)
        rewards.append(reward)
    await env.close()
    assert done and rewards[-1] == 20.0 and sum(rewards) == 20.0 - (len(replies) - 1)
    assert "delivered the passenger" in obs


async def test_blackjack_reward_matches_gymnasium_for_the_same_seed():
    env = GymnasiumEnv("Blackjack-v1")
    obs, _, system = await env.reset(request(3))
    assert "The dealer shows" in obs and "STICK" in system
    text, reward, done, info = await env.step("I will stand")
    await env.close()
    reference = gymnasium.make("Blackjack-v1")
    reference.reset(seed=3)
    _, want, terminated, _, _ = reference.step(0)
    assert done and terminated and info["action"] == "STICK" and reward == float(want)
    assert ("win" in text) if want > 0 else ("lose" in text if want < 0 else "draw" in text)


async def test_cliff_walking_plan_and_cliff_fall(plan):
    env = GymnasiumEnv("CliffWalking-v1")
    obs, _, _ = await env.reset(request(0))
    assert "row 4, column 1" in obs and "moving RIGHT steps off the cliff" in obs
    moves = [env.format.action_names[a] for a in plan(env.env.unwrapped, 36, win=lambda r: True)]  # the goal is the only terminal
    text, reward, done, _ = await env.step("RIGHT")
    assert reward == -100.0 and not done and "fell off the cliff" in text
    await env.close()
    rewards, last, done = await play(GymnasiumEnv("CliffWalking-v1"), moves)
    assert done and sum(rewards) == -len(moves) and "reached the goal" in last


async def test_invalid_reply_retry_keeps_state_and_costs_the_penalty():
    env = GymnasiumEnv("FrozenLake-v1", is_slippery=False, invalid_penalty=-0.25, max_invalid_actions=2)
    await env.reset(request(0))
    obs, reward, done, info = await env.step("I am not sure")
    assert reward == -0.25 and not done and info["invalid_action"] and "row 1, column 1" in obs
    _, _, done, info = await env.step("still unsure")
    assert done and info["ended"] == "invalid_actions"
    await env.close()


async def test_invalid_reply_fail_policy_raises():
    env = GymnasiumEnv("Blackjack-v1", invalid_action="fail")
    await env.reset(request(0))
    with pytest.raises(InvalidActionError, match="in Blackjack-v1"):
        await env.step("what?")
    await env.close()


async def test_group_shares_a_start_state_and_explicit_seed_wins():
    a, b, c = (GymnasiumEnv("Taxi-v4") for _ in range(3))
    oa = (await a.reset(Trajectory(prompt_ids=[], group_id="same")))[1]["state"]
    ob = (await b.reset(Trajectory(prompt_ids=[], group_id="same")))[1]["state"]
    starts = {(await c.reset(Trajectory(prompt_ids=[], group_id=f"g{i}")))[1]["state"] for i in range(8)}
    assert oa == ob and len(starts) > 1
    s1 = (await a.reset(request(5, "x")))[1]
    s2 = (await b.reset(request(5, "y")))[1]
    assert s1 == s2 and s1["seed"] == 5
    for env in (a, b, c):
        await env.close()


async def test_ansi_fallback_and_repr_fallback_with_box_actions():
    env = GymnasiumEnv("FrozenLake-v1", formatter="ansi", is_slippery=False)
    obs, _, system = await env.reset(request(0))
    assert "[S]FFF" in obs and "FrozenLake-v1" in system and "\x1b" not in obs
    text, _, _, info = await env.step("RIGHT")
    assert "S[F]FF" in text and info["action"] == "RIGHT"
    await env.close()
    pend = GymnasiumEnv("Pendulum-v1")
    obs, _, system = await pend.reset(request(0))
    assert obs.startswith("Observation: [") and "1 number(s) within [-2, 2]" in system
    _, reward, done, info = await pend.step("apply torque 5")
    assert info["action"] == "2" and reward < 0 and not done
    await pend.close()


class _DictActions(gymnasium.Env):
    observation_space = gymnasium.spaces.Discrete(1)
    action_space = gymnasium.spaces.Dict({"a": gymnasium.spaces.Discrete(2)})

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return 0, {}

    def step(self, action):
        return 0, 0.0, True, False, {}


async def test_unsupported_action_space_and_unknown_ids_are_config_errors():
    gymnasium.register("RlcoreDictActions-v0", entry_point=_DictActions)
    try:
        with pytest.raises(ConfigError, match="which text cannot express"):
            await GymnasiumEnv("RlcoreDictActions-v0").reset(request(0))
    finally:
        gymnasium.registry.pop("RlcoreDictActions-v0", None)
    with pytest.raises(ConfigError, match="no environment 'NoSuchGame-v0'"):
        resolve_gym_id("NoSuchGame-v0")
    with pytest.raises(ConfigError, match="needs gym_id"):
        GymnasiumEnv()
    assert resolve_gym_id("Blackjack-v1") == "Blackjack-v1"
