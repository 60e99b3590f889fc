"""The built-in text games, played directly: rewards, feedback, seeds, invalid replies, bad options."""

from __future__ import annotations

import pytest

from rl_plugin_gym.arithmetic_chain import ArithmeticChainEnv
from rl_plugin_gym.guess_number import GuessNumberEnv
from rl_plugin_gym.policy import InvalidActionError
from rlcore.errors import ConfigError
from rlcore.types import Trajectory


def req(seed: int) -> Trajectory:
    return Trajectory(prompt_ids=[], data={"env_config": {"seed": seed}})


async def test_guess_number_binary_search_wins_with_feedback():
    env = GuessNumberEnv(low=1, high=16)
    obs, info, system = await env.reset(req(11))
    assert "from 1 to 16" in system and info["seed"] == 11
    lo, hi, rewards, done = 1, 16, [], False
    while not done:
        guess = (lo + hi) // 2
        obs, reward, done, info = await env.step(f"My guess is {guess}")
        rewards.append(reward)
        if "higher" in obs:
            lo = guess + 1
        elif "lower" in obs:
            hi = guess - 1
    assert info["solved"] and rewards[-1] == 1.0 and sum(rewards) == 1.0 and len(rewards) <= 5
    assert f"The number was {guess}" in obs


async def test_guess_number_invalid_replies_follow_the_policy():
    env = GuessNumberEnv(low=1, high=8, invalid_penalty=-0.2)
    await env.reset(req(0))
    obs, reward, done, info = await env.step("forty-two")
    assert (reward, done, info["invalid_action"]) == (-0.2, False, True) and "from 1 to 8" in obs
    _, reward, _, _ = await env.step("99")  # out of range is invalid too
    assert reward == -0.2
    strict = GuessNumberEnv(invalid_action="fail")
    await strict.reset(req(0))
    with pytest.raises(InvalidActionError, match="guess_number"):
        await strict.step("no idea")


async def test_arithmetic_chain_scores_each_step_and_corrects_mistakes():
    env = ArithmeticChainEnv(length=4, max_operand=5, seed=3)
    obs, info, _ = await env.reset(Trajectory(prompt_ids=[]))
    assert obs.startswith(f"Start with {info['start']}.") and info["seed"] == 3
    rewards = []
    obs, r, done, step_info = await env.step(str(env.expected()))
    rewards.append(r)
    assert step_info["correct"] and obs.startswith("Correct.")
    wrong = env.expected() + 1
    obs, r, done, step_info = await env.step(f"<answer>{wrong}</answer>")
    rewards.append(r)
    assert not step_info["correct"] and f"Wrong, it is {wrong - 1}." in obs
    while not done:
        obs, r, done, _ = await env.step(str(env.expected()))
        rewards.append(r)
    assert rewards == [0.25, 0.0, 0.25, 0.25] and "chain is over" in obs


async def test_arithmetic_chain_is_deterministic_per_seed_and_can_stop_on_error():
    a, b = ArithmeticChainEnv(seed=1), ArithmeticChainEnv(seed=1)
    assert (await a.reset(Trajectory(prompt_ids=[])))[0] == (await b.reset(Trajectory(prompt_ids=[])))[0]
    strict = ArithmeticChainEnv(length=3, stop_on_error=True)
    await strict.reset(req(2))
    _, reward, done, _ = await strict.step(str(strict.expected() + 1))
    assert done and reward == 0.0


def test_bad_options_are_config_errors():
    with pytest.raises(ConfigError, match="low < high"):
        GuessNumberEnv(low=5, high=5)
    with pytest.raises(ConfigError, match="ops from"):
        ArithmeticChainEnv(ops="/")
