"""A multi-turn OpenEnv rollout with the real tiny transformer: the trajectory's tokens are exactly
what the sampler produced plus chat-template observation deltas, and a fresh forward pass over
``input_ids`` reproduces the sampler's logprobs at every trained (mask 1) position."""

from __future__ import annotations

import pytest
import rlcore
import torch
from rlcore.rollout import encode_prompt, run_rollouts
from rlcore.types import Prompt, SamplingParams

from rl_plugin_openenv.server import ServerThread


@pytest.fixture(scope="module")
def server():
    with ServerThread(max_concurrent_envs=8) as url:
        yield url


async def test_multi_turn_rollout_is_token_exact(server, tiny_model_dir):
    sampler = rlcore.get("sampler", "hf")(model=tiny_model_dir, seed=0)
    tok = sampler.tokenizer
    sched = rlcore.get("scheduler", "openenv_scheduler")(sampler, env_url=server, max_turns=3, stop_on_truncation=False,
                                                          system_message="Guess the number.")
    prompts = [Prompt([], [], data={"env_config": {"target": 7, "max_attempts": 5}}) for _ in range(2)]
    result = await run_rollouts(sched, prompts, num_generations=1,
                                sampling_params=SamplingParams(max_tokens=6, temperature=1.0), progress=False)
    assert result.stats["failed"] == 0, result.stats["failure_reasons"]
    model = sampler.model
    for t in result.trajectories:
        # the prompt is the template rendering of system + first observation
        assert t.prompt_ids == encode_prompt(tok, t.messages[:2])
        assert t.num_turns >= 2 and t.turns[0].role == "assistant"
        # observation turns carry the env's feedback text
        observed = [tok.decode(turn.token_ids) for turn in t.turns if turn.role != "assistant"]
        assert any("I could not find a number" in o or "is too" in o or "outside" in o for o in observed)
        ids = torch.tensor([t.input_ids])
        with torch.no_grad():
            logits = model(ids).logits.float()
        logps = torch.log_softmax(logits[0, :-1], dim=-1).gather(1, ids[0, 1:, None])[:, 0]
        p = len(t.prompt_ids)
        checked = 0
        for pos, (m, lp) in enumerate(zip(t.loss_mask, t.logprobs)):
            if m:
                assert lp is not None
                assert abs(float(logps[p + pos - 1]) - lp) < 1e-4, (pos, float(logps[p + pos - 1]), lp)
                checked += 1
        assert checked == sum(t.loss_mask) > 0
    await sampler.close()
