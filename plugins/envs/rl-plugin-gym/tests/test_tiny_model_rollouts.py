"""Multi-turn rollouts of the real tiny transformer (hf sampler) on the four gymnasium games.

Token-exact: re-scoring ``prompt_ids + completion_ids`` with one forward pass reproduces the
sampler's logprob at every trained (mask 1) position, and every observation the env produced sits
in the token stream as a loss-mask-0 turn. A random tiny model never emits ``<|im_end|>`` by itself,
so the sampling params stop on a third of the vocabulary: turns end "stop" after a few tokens and
episodes really run for several turns (most replies are invalid actions: the retry policy's
penalty is what they earn, which is exactly what an untrained policy should see).
"""

from __future__ import annotations

import pytest
import torch

import rlcore
from rlcore.asyncutil import run_sync
from rlcore.rewards import as_reward, compute_rewards
from rlcore.rollout import run_rollouts
from rlcore.types import Prompt, SamplingParams

GAMES = ["FrozenLake-v1", "Taxi-v3", "Blackjack-v1", "CliffWalking-v1"]
MAX_TURNS = 3


@pytest.fixture(scope="module")
def sampler(tiny_model_dir):
    s = rlcore.get("sampler", "hf")(tiny_model_dir, seed=0, batch_window_ms=20)
    yield s
    run_sync(s.close())


@pytest.fixture(scope="module")
def model(sampler):
    return sampler.model


@pytest.mark.filterwarnings("ignore:gymnasium retired")
async def test_tiny_model_plays_each_game_token_exact(sampler, model):
    eos = sampler.tokenizer.convert_tokens_to_ids("<|im_end|>")
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=None, stop_token_ids=sorted({eos, *range(3, 1024, 3)}))
    scheduler = rlcore.get("scheduler", "gym_scheduler")(
        sampler, max_turns=MAX_TURNS, env_kwargs={"max_invalid_actions": None}
    )
    prompts = [Prompt(messages=[], prompt_ids=[], data={"env_config": {"name": g, "seed": i}}) for i, g in enumerate(GAMES)]
    res = await run_rollouts(scheduler, prompts, num_generations=2, sampling_params=params, progress=False)
    await scheduler.close()
    trajs = res.trajectories
    assert res.stats["failed"] == 0, res.stats["failure_reasons"]
    assert [t.infos["reset_info"]["gym_id"] for t in trajs] == [g for g in ["FrozenLake-v1", "Taxi-v4", "Blackjack-v1", "CliffWalking-v1"] for _ in range(2)]

    # rewards: one step reward per turn, the cumulative one is a reward column
    for t in trajs:
        assert 1 <= t.num_turns <= MAX_TURNS and len(t.step_rewards) == t.num_turns
        assert t.infos["env_return"] == pytest.approx(t.total_reward)
    columns = await compute_rewards(rlcore.RunHooks(as_reward("gym_reward", rlcore.get("reward", "gym_reward"))), trajs)
    assert columns["gym_reward"] == [t.total_reward for t in trajs]
    assert any(t.num_turns >= 2 for t in trajs[:2]) and any(t.num_turns >= 2 for t in trajs[2:4] + trajs[6:])

    # observations: every user message after the first is a loss-mask-0 turn holding that text
    for t in trajs:
        users = [m["content"] for m in t.messages[2:] if m["role"] == "user"]
        obs_turns = [turn for turn in t.turns if turn.role == "user"]
        assert len(obs_turns) == len(users) == t.num_turns - 1
        for text, turn in zip(users, obs_turns):
            assert text in turn.text and set(turn.loss_mask) == {0}

    # token-exact: a forward pass over the trained tokens reproduces the sampler's logprobs
    for t in trajs:
        ids = torch.tensor([t.input_ids])
        with torch.no_grad():
            logps = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)
        p = len(t.prompt_ids)
        rescored = logps[0, p - 1 : -1].gather(-1, ids[0, p:].unsqueeze(-1)).squeeze(-1)
        mask = torch.tensor(t.loss_mask, dtype=torch.bool)
        sampled = torch.tensor([lp if m else 0.0 for lp, m in zip(t.logprobs, t.loss_mask)])
        assert mask.sum() > 0 and t.logprobs_complete
        torch.testing.assert_close(rescored[mask], sampled[mask], atol=2e-4, rtol=0)
