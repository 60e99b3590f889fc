"""openenv_scheduler against a real OpenEnv server, with scripted model replies (ScriptedSampler)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
import rlcore
from rlcore.rollout import run_rollouts
from rlcore.testing import ScriptedSampler
from rlcore.types import Prompt, SamplingParams

from rl_plugin_openenv.scheduler import OpenEnvScheduler
from rl_plugin_openenv.server import ServerThread, active_sessions, free_port, sessions_settle
from rl_plugin_openenv.testing import ServerProcess


def rows(n: int, **env_config) -> list[Prompt]:
    return [Prompt(messages=[], prompt_ids=[], data={"env_config": {"target": 40 + i, **env_config}}) for i in range(n)]


def bisect(prompt_ids, params, index, *, tokenizer) -> str:
    """A player that binary-searches using the feedback in the conversation so far."""
    text = tokenizer.decode(prompt_ids)
    low, high = 1, 100
    for g, word in re.findall(r"(\d+) is too (low|high)", text):
        if word == "low":
            low = max(low, int(g) + 1)
        else:
            high = min(high, int(g) - 1)
    return json.dumps({"guess": (low + high) // 2})




def make(sampler, tokenizer, **options) -> OpenEnvScheduler:
    options.setdefault("max_turns", 8)
    return rlcore.get("scheduler", "openenv_scheduler")(sampler, tokenizer=tokenizer, **options)


async def test_scripted_player_wins_and_gets_the_reward(server, tokenizer):
    sampler = ScriptedSampler(tokenizer=tokenizer, respond=lambda p, s, i: bisect(p, s, i, tokenizer=tokenizer))
    sched = make(sampler, tokenizer, env_url=server, system_message="Play the game.")
    result = await run_rollouts(sched, rows(3), num_generations=2, sampling_params=SamplingParams(max_tokens=32), progress=False)
    assert result.stats["ok"] == 6 and result.stats["failed"] == 0
    for t in result.trajectories:
        assert t.messages[0] == {"role": "system", "content": "Play the game."}
        assert t.messages[1]["content"].startswith("I am thinking of a number between 1 and 100")
        assert t.step_rewards[-1] == 1.0 and t.total_reward == 1.0 and all(r == 0.0 for r in t.step_rewards[:-1])
        assert "Correct!" not in t.messages[-1]["content"]  # done: no observation appended after the win
        assert t.num_turns == len(t.step_rewards) >= 2  # multi-turn: bisecting 40.. takes several guesses
        # token-exact: prompt + every turn; sampled turns carry logprobs, observations are mask 0
        assert t.input_ids[: len(t.prompt_ids)] == t.prompt_ids
        for turn in t.turns:
            assert all(m == (1 if turn.role == "assistant" else 0) for m in turn.loss_mask)
    rewards = await rlcore.rewards.compute_rewards(
        rlcore.RunHooks(rlcore.rewards.as_reward("openenv_reward", rlcore.get("reward", "openenv_reward"))),
        result.trajectories,
    )
    assert rewards["openenv_reward"] == [1.0] * 6
    assert await sessions_settle(server) == 0
    m = sched.metrics()
    assert m["openenv/sessions_opened"] == m["openenv/sessions_closed"] == 6


async def test_non_json_reply_is_sent_as_message(server, tokenizer):
    sampler = ScriptedSampler(["Hmm, I would say 41 maybe", "no idea"], tokenizer=tokenizer)
    sched = make(sampler, tokenizer, env_url=server, max_turns=2)
    result = await run_rollouts(sched, rows(1, target=41), sampling_params=SamplingParams(max_tokens=32), progress=False)
    (t,) = result.trajectories
    assert t.status == "ok" and t.step_rewards == [1.0]


async def test_row_env_config_overrides_defaults_and_reset_kwargs(server, tokenizer):
    sampler = ScriptedSampler(['```json\n{"guess": 3}\n```'], tokenizer=tokenizer)
    sched = make(sampler, tokenizer, env_url="http://127.0.0.1:9", reset_kwargs={"low": 1, "high": 5}, max_turns=1,
                 allowed_env_urls=server)  # a row may name only a server the run allows
    prompts = [Prompt([], [], data={"env_config": {"base_url": server, "reset_kwargs": {"target": 3}, "max_attempts": 2}})]
    (t,) = (await run_rollouts(sched, prompts, sampling_params=SamplingParams(max_tokens=32), progress=False)).trajectories
    assert "between 1 and 5. You have 2 guesses" in t.messages[0]["content"]
    assert t.step_rewards == [1.0]


async def test_malformed_action_is_shown_to_the_model_or_fails(server, tokenizer):
    replies = ['{"guess": "forty"}', '{"guess": 40}']
    sched = make(ScriptedSampler(replies, tokenizer=tokenizer), tokenizer, env_url=server)
    (t,) = (await run_rollouts(sched, rows(1), sampling_params=SamplingParams(max_tokens=32), progress=False)).trajectories
    assert t.status == "ok" and t.step_rewards == [0.0, 1.0] and t.infos["invalid_actions"] == 1
    assert t.messages[2]["role"] == "user" and t.messages[2]["content"].startswith("Invalid action: Invalid message; guess:")
    strict = make(ScriptedSampler(replies, tokenizer=tokenizer), tokenizer, env_url=server, invalid_action="fail")
    (t,) = (await run_rollouts(strict, rows(1), sampling_params=SamplingParams(max_tokens=32), progress=False)).trajectories
    assert t.status == "failed" and "VALIDATION_ERROR" in t.reason and "\n" not in t.reason
    assert await sessions_settle(server) == 0


async def test_more_trajectories_than_server_sessions_queue(tokenizer):
    with ServerThread(max_concurrent_envs=2) as url:
        sampler = ScriptedSampler(tokenizer=tokenizer, respond=lambda p, s, i: bisect(p, s, i, tokenizer=tokenizer), delay=0.01)
        sched = make(sampler, tokenizer, env_url=url)
        result = await run_rollouts(sched, rows(4), num_generations=2, sampling_params=SamplingParams(max_tokens=32), progress=False)
        assert result.stats["ok"] == 8
        assert sched.metrics()["openenv/capacity_retries"] == 0  # sized from /capacity: queued, never refused
        assert sched._limiters[url].limit == 2


async def test_no_url_fails_each_trajectory_with_a_reason(tokenizer):
    sched = make(ScriptedSampler(["x"], tokenizer=tokenizer), tokenizer)
    result = await run_rollouts(sched, rows(2), sampling_params=SamplingParams(max_tokens=8), progress=False)
    assert result.stats["failed"] == 2
    assert "--env-url" in result.trajectories[0].reason


async def test_server_killed_mid_rollout_fails_those_trajectories_and_run_finishes(tokenizer):
    proc = ServerProcess(step_delay=0.3).start()
    try:
        sampler = ScriptedSampler(['{"guess": 1}'], tokenizer=tokenizer)
        sched = make(sampler, tokenizer, env_url=proc.url, max_retries=1, call_timeout=5)
        task = asyncio.create_task(
            run_rollouts(sched, rows(4), sampling_params=SamplingParams(max_tokens=16), progress=False))
        await asyncio.sleep(1.0)
        proc.kill()
        result = await asyncio.wait_for(task, 60)
        assert result.stats["trajectories"] == 4 and result.stats["failed"] == 4
        assert all(t.reason.startswith("env step failed: OpenEnv server") or "could not open a session" in t.reason
                   for t in result.trajectories)
        assert any(t.step_rewards for t in result.trajectories)  # some steps happened before the kill
        # the server comes back: a new rollout with the same scheduler succeeds
        proc.start()
        sched.sampler = ScriptedSampler(['{"guess": 40}'], tokenizer=tokenizer)
        again = await run_rollouts(sched, rows(1), sampling_params=SamplingParams(max_tokens=16), progress=False)
        assert again.stats["ok"] == 1 and again.trajectories[0].total_reward == 1.0
    finally:
        proc.kill()
