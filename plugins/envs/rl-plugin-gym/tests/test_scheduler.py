"""gym_scheduler end to end with scripted replies: goals reached, rewards right, env choice per row,
invalid actions under both policies, envs that raise, and envs closed on every path."""

from __future__ import annotations

import gymnasium
import pytest
from transformers import AutoTokenizer

import rlcore
from rlcore.rewards import as_reward, compute_rewards
from rlcore.rollout import run_rollouts
from rlcore.testing import ScriptedSampler
from rlcore.types import Prompt, SamplingParams

from rl_plugin_gym.gymnasium_env import GymnasiumEnv
from rl_plugin_gym.guess_number import GuessNumberEnv
from rl_plugin_gym.toy_text import FORMATS

PARAMS = SamplingParams(max_tokens=24)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def row(**env_config) -> Prompt:
    return Prompt(messages=[], prompt_ids=[], data={"env_config": env_config})


async def rollout(tok, replies, prompts, num_generations=1, **options):
    scheduler = rlcore.get("scheduler", "gym_scheduler")(ScriptedSampler(replies, tok), **options)
    try:
        return await run_rollouts(scheduler, prompts, num_generations=num_generations, sampling_params=PARAMS, progress=False)
    finally:
        await scheduler.close()


def winning_replies(gym_id: str, seed: int, plan, **make_kwargs) -> list[str]:
    env = gymnasium.make(gym_id, **make_kwargs)
    env.reset(seed=seed)
    win = (lambda r: r > 0) if gym_id != "CliffWalking-v1" else (lambda r: True)
    names = FORMATS[gym_id.split("-v")[0]].action_names
    return [names[a] for a in plan(env.unwrapped, int(env.unwrapped.s), win=win)]


@pytest.mark.parametrize(
    "gym_id, kwargs, final",
    [("FrozenLake-v1", {"is_slippery": False}, 1.0), ("Taxi-v4", {}, 20.0), ("CliffWalking-v1", {}, -1.0)],
)
async def test_scripted_episode_reaches_the_goal(tok, plan, gym_id, kwargs, final):
    replies = winning_replies(gym_id, 5, plan, **kwargs)
    res = await rollout(tok, replies, [row(seed=5, **kwargs)], env=gym_id, max_turns=len(replies) + 3)
    (t,) = res.trajectories
    assert t.status == "ok" and t.num_turns == len(replies)
    assert t.step_rewards[-1] == final and t.infos["env_trace"][-1]["done"]
    assert t.infos["env_return"] == t.total_reward == sum(t.step_rewards)
    columns = await compute_rewards(rlcore.RunHooks(as_reward("gym_reward", rlcore.get("reward", "gym_reward"))), [t])
    assert columns == {"gym_reward": [t.total_reward]} and t.reward == t.total_reward
    assert t.messages[0]["role"] == "system" and [m["role"] for m in t.messages[1:3]] == ["user", "assistant"]


async def test_blackjack_stick_gets_gymnasium_reward(tok):
    res = await rollout(tok, ["STICK"], [row(seed=s) for s in range(4)], env="Blackjack-v1")
    for s, t in enumerate(res.trajectories):
        ref = gymnasium.make("Blackjack-v1")
        ref.reset(seed=s)
        assert t.status == "ok" and t.num_turns == 1 and t.step_rewards == [float(ref.step(0)[1])]


async def test_env_chosen_per_row_with_row_options(tok):
    prompts = [
        row(name="guess_number", low=3, high=4, seed=1),
        row(name="arithmetic_chain", length=2, seed=1),
        row(name="FrozenLake-v1", is_slippery=False, seed=1),
    ]
    res = await rollout(tok, ["3"], prompts, env="guess_number", max_turns=2)
    guess, chain, lake = res.trajectories
    assert "from 3 to 4" in guess.messages[0]["content"] and guess.infos["reset_info"]["low"] == 3
    assert "running number" in chain.messages[0]["content"] and len(chain.step_rewards) == 2
    assert lake.infos["reset_info"]["gym_id"] == "FrozenLake-v1" and lake.infos["env_info"]["action"] == "UP"
    assert all(t.status == "ok" for t in res.trajectories)


async def test_group_members_face_the_same_start(tok):
    res = await rollout(tok, ["0"], [Prompt(messages=[], prompt_ids=[])], num_generations=3, env="Taxi-v4", max_turns=1)
    starts = {t.messages[1]["content"] for t in res.trajectories}
    assert len(starts) == 1 and len({t.prompt_ids[-1] for t in res.trajectories}) == 1


async def test_invalid_actions_retry_policy_penalises_and_explains(tok):
    res = await rollout(
        tok, ["hmm", "I do not know", "DOWN"], [row(seed=0, is_slippery=False)],
        env="FrozenLake-v1", max_turns=3, env_kwargs={"invalid_penalty": -0.5},
    )
    (t,) = res.trajectories
    assert t.status == "ok" and t.step_rewards == [-0.5, -0.5, 0.0]
    assert "not a valid action" in t.messages[3]["content"] and "LEFT, DOWN, RIGHT, UP" in t.messages[3]["content"]
    assert [s["invalid"] for s in t.infos["env_trace"]] == [True, True, False]


async def test_invalid_action_fail_policy_fails_only_that_trajectory(tok):
    prompts = [row(seed=0, invalid_action="fail"), row(seed=0)]
    res = await rollout(tok, ["no idea"], prompts, env="Blackjack-v1", max_turns=1)
    failed, ok = res.trajectories
    assert failed.status == "failed" and "InvalidActionError" in failed.reason and "Blackjack-v1" in failed.reason
    assert ok.status == "ok" and ok.step_rewards == [-0.1]
    assert res.stats["failed"] == 1 and res.stats["ok"] == 1


async def test_env_that_raises_fails_its_trajectory_and_every_env_is_closed(tok, monkeypatch):
    closed: list[str] = []
    real_step, real_close = GuessNumberEnv.step, GuessNumberEnv.close

    async def step(self, action):  # fault injection: the env with low=2 breaks on its first step
        if self.low == 2:
            raise RuntimeError("simulator crashed")
        return await real_step(self, action)

    async def close(self):
        closed.append(self.name)
        return await real_close(self)

    monkeypatch.setattr(GuessNumberEnv, "step", step)
    monkeypatch.setattr(GuessNumberEnv, "close", close)
    prompts = [row(low=1, seed=0), row(low=2, seed=0), row(name="no_such_env"), row(low=1, seed=1)]
    res = await rollout(tok, ["5", "6"], prompts, env="guess_number", max_turns=2)
    a, crashed, unknown, b = res.trajectories
    assert crashed.status == "failed" and crashed.reason == "env step failed: RuntimeError: simulator crashed"
    assert unknown.status == "failed" and "no env named 'no_such_env'" in unknown.reason
    assert a.status == b.status == "ok" and len(a.step_rewards) >= 1
    assert closed == ["guess_number"] * 3  # both finished ones and the crashed one; the unknown never opened


async def test_missing_or_misspelt_env_are_one_line_errors(tok):
    with pytest.raises(rlcore.UnknownComponentError, match="no env named 'FrozenLak-v1'.*not a gymnasium id"):
        rlcore.get("scheduler", "gym_scheduler")(env="FrozenLak-v1")
    res = await rollout(tok, ["1"], [Prompt(messages=[], prompt_ids=[])])
    assert res.trajectories[0].status == "failed" and "gym_scheduler needs an env" in res.trajectories[0].reason


async def test_gymnasium_adapter_by_registered_name(tok):
    res = await rollout(tok, ["HIT"], [row(seed=2)], env="gymnasium", env_kwargs={"gym_id": "Blackjack-v1"}, max_turns=1)
    assert res.trajectories[0].infos["env_info"]["action"] == "HIT"
    assert isinstance(rlcore.get("env", "gym")("Blackjack-v1"), GymnasiumEnv)


def test_env_kwargs_accepts_a_json_object_string():
    make = rlcore.get("scheduler", "gym_scheduler")
    assert make(env="guess_number", env_kwargs='{"high": 4}').env_kwargs == {"high": 4}
    with pytest.raises(rlcore.ConfigError, match="env_kwargs 'high=4' is not a JSON object"):
        make(env="guess_number", env_kwargs="high=4")


@pytest.mark.parametrize("command", ["train", "rollout"])
def test_an_env_name_neither_registered_nor_gymnasium_is_one_line_before_any_model_loads(
        command, tmp_path, capsys, monkeypatch):
    """gym_scheduler resolves gymnasium ids too; the CLI asks it (not only the registry) before loading."""
    import transformers

    from rlcore.commands.cli import main

    def no_load(*a, **k):  # fault injection: loading a model here is the bug
        raise AssertionError("a model was loaded before --env was checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_load)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main([command, "--scheduler", "gym_scheduler", "--env", "FrozenLak-v1"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "\n" not in err, err
    assert "no env named 'FrozenLak-v1'" in err and "not a gymnasium id either" in err


def test_a_gymnasium_id_routes_its_env_options_before_the_run():
    """--env FrozenLake-v1 resolves to the gymnasium adapter, so that adapter's options are known flags."""
    from rlcore.rollout.env_scheduler import chosen_env

    name, factory = chosen_env(rlcore.get("scheduler", "gym_scheduler"), {"env": "FrozenLake-v1"})
    assert name == "FrozenLake-v1" and factory is GymnasiumEnv
    assert chosen_env(rlcore.get("scheduler", "gym_scheduler"), {}) is None
