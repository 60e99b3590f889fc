"""``frozen_lake`` episodes (gymnasium's real ``FrozenLake-v1``, firm ice) played by the real
pretrained SmolLM2-135M-Instruct through the ``hf`` sampler.

The env's reset gives a system message (the rules), so SmolLM2's template renders it instead of
its injected default; replies are English words cut at the first whitespace by a stop string,
which with a 49k byte-level BPE lands inside a merged token (``"Move"`` + ``" DOWN"``). Held here:
every episode runs several turns (no first move reaches the goal or a hole on the 4×4 map), the
invariant checker and an independent rendering agree with the tokens, each observation is the
template's delta with loss mask 0, each trained turn is exactly what the sampler returned, and
the trainer's scoring of the packed batch reproduces the sampler's logprobs.

Shapes are small (4 episodes, 3 turns, at most 6 tokens a turn).
"""

from __future__ import annotations


import rlcore
from rlcore.chat_template import decode, encode_prompt, render
from rlcore.rollout import check_batch, run_rollouts
from rlcore.testing import assert_token_exact
from rlcore.testing.multi_turn import (RecordingSampler, assert_observations_are_template_deltas,
                                       assert_sampled_tokens_kept, trainer_logprobs)
from rlcore.types import Prompt, SamplingParams

MAX_TURNS = 3


async def test_real_model_frozen_lake_episodes_are_token_exact(smollm2_hf_sampler, smollm2_tokenizer):
    tok = smollm2_tokenizer
    sampler = RecordingSampler(smollm2_hf_sampler)
    sched = rlcore.get("scheduler", "gym_scheduler")(sampler, tokenizer=tok, env="frozen_lake", max_turns=MAX_TURNS,
                                                     stop=[" ", "\n"], stop_on_truncation=False)
    prompts = [Prompt([], [], data={"env_config": {"seed": i}}) for i in range(2)]
    result = await run_rollouts(sched, prompts, num_generations=2,
                                sampling_params=SamplingParams(max_tokens=6, temperature=1.0), progress=False)
    await sched.close()
    trajs = result.trajectories
    assert result.stats["failed"] == 0, result.stats["failure_reasons"]
    assert check_batch(trajs, tok) == []
    assert_token_exact(trajs, tok)

    for t in trajs:
        assert t.infos["reset_info"]["gym_id"] == "FrozenLake-v1"
        assert t.num_turns >= 2, (t.num_turns, t.messages)
        # the env's system message replaces SmolLM2's injected default, in the messages and in the tokens
        assert [m["role"] for m in t.messages[:2]] == ["system", "user"]
        assert t.prompt_ids == encode_prompt(tok, t.messages[:2])
        assert decode(tok, t.prompt_ids) == render(tok, t.messages[:2], add_generation_prompt=True)
        assert "SmolLM" not in decode(tok, t.prompt_ids)
        assert assert_observations_are_template_deltas(t, tok) == t.num_turns - 1
        assert assert_sampled_tokens_kept(t, sampler.records) == t.num_turns
        assert len(t.step_rewards) == t.num_turns
        assert [e["turn"] for e in t.infos["env_trace"]] == list(range(1, t.num_turns + 1))

    # the trainer's scoring of the packed batch reproduces the sampler's logprobs (fp32)
    for t, rescored in zip(trajs, trainer_logprobs(trajs, smollm2_hf_sampler.model, tok.pad_token_id)):
        assert t.logprobs_complete and sum(t.loss_mask) > 0
        for m, have, want in zip(t.loss_mask, rescored, t.logprobs):
            assert (have is None) == (not m) and (not m or abs(have - want) < 1e-4), (have, want)
