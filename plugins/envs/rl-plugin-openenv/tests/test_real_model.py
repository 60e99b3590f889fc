"""``guess_number`` episodes played by the real pretrained SmolLM2-135M-Instruct over a real OpenEnv
server (``create_app`` + uvicorn on 127.0.0.1), sampled by the ``hf`` sampler.

The real model brings what the tiny one does not: a 49k byte-level BPE whose merges cross every
boundary (a reply cut at the first whitespace by a stop string ends inside a merged token such as
``" I"``), a chat template that injects a default system prompt when the conversation starts with
a user message, and English replies rather than numbers (most guesses are "I could not find a
number" observations). Held here: every episode runs several turns, the invariant checker and an
independent rendering agree with the tokens, each observation is the template's delta with loss
mask 0, each trained turn is what the sampler returned, and the trainer's scoring of the packed
batch reproduces the sampler's logprobs.

Shapes are small (4 episodes, 3 turns, at most 8 tokens a turn).
"""

from __future__ import annotations

import pytest

import rlcore
from rlcore.chat_template import decode, encode_prompt, render
from rlcore.rollout import check_batch, run_rollouts
from rlcore.testing import assert_token_exact
from rlcore.testing.multi_turn import (RecordingSampler, assert_observations_are_template_deltas,
                                       assert_sampled_tokens_kept, trainer_logprobs)
from rlcore.types import Prompt, SamplingParams

from rl_plugin_openenv.server import ServerThread, sessions_settle

SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
MAX_TURNS = 3


@pytest.fixture(scope="module")
def server():
    with ServerThread(max_concurrent_envs=4) as url:
        yield url


def episodes(n: int) -> list[Prompt]:
    # 1..1000 with a fixed target: a first guess that wins (a one-turn episode) is a 1-in-1000 event
    reset = {"low": 1, "high": 1000, "target": 737, "max_attempts": 6, "reply": "number", "shaped": True}
    return [Prompt([], [], data={"env_config": {"reset_kwargs": reset}}) for _ in range(n)]


async def test_real_model_guess_number_episodes_are_token_exact(server, smollm2_hf_sampler, smollm2_tokenizer):
    tok = smollm2_tokenizer
    sampler = RecordingSampler(smollm2_hf_sampler)
    sched = rlcore.get("scheduler", "openenv_scheduler")(sampler, tokenizer=tok, env_url=server, max_turns=MAX_TURNS,
                                                          stop=[" ", "\n"], stop_on_truncation=False)
    result = await run_rollouts(sched, episodes(2), num_generations=2,
                                sampling_params=SamplingParams(max_tokens=8, temperature=1.0), progress=False)
    await sched.close()
    trajs = result.trajectories
    assert result.stats["failed"] == 0, result.stats["failure_reasons"]
    assert check_batch(trajs, tok) == []
    assert_token_exact(trajs, tok)
    assert await sessions_settle(server) == 0

    for t in trajs:
        assert t.num_turns >= 2, (t.num_turns, t.messages)
        # no system message was given: SmolLM2's template injects its default one, and the prompt
        # tokens the trainer scores are exactly the rendering of the prompt messages, that included
        assert t.messages[0]["role"] == "user" and t.messages[0]["content"].startswith("I am thinking of a number")
        assert t.prompt_ids == encode_prompt(tok, t.messages[:1])
        assert decode(tok, t.prompt_ids).startswith(f"<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n<|im_start|>user\n")
        assert decode(tok, t.prompt_ids) == render(tok, t.messages[:1], add_generation_prompt=True)
        # the env's feedback is in the stream as the template's delta, loss mask 0
        assert assert_observations_are_template_deltas(t, tok) == t.num_turns - 1
        assert assert_sampled_tokens_kept(t, sampler.records) == t.num_turns
        assert len(t.step_rewards) == t.num_turns
        feedback = [m["content"] for m in t.messages[2:] if m["role"] == "user"]
        assert all(any(w in f for w in ("number", "too", "outside", "Invalid action")) for f in feedback), feedback

    # the trainer's scoring of the packed batch reproduces the sampler's logprobs (fp32)
    for t, rescored in zip(trajs, trainer_logprobs(trajs, smollm2_hf_sampler.model, tok.pad_token_id)):
        assert t.logprobs_complete and sum(t.loss_mask) > 0
        for m, have, want in zip(t.loss_mask, rescored, t.logprobs):
            assert (have is None) == (not m) and (not m or abs(have - want) < 1e-4), (have, want)
