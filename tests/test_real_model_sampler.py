"""The ``hf`` sampler on the real pretrained model (SmolLM2-135M-Instruct, float32, CPU): the
logprob of every sampled token equals the trainer's forward (1e-4), on both decode paths the CPU
runs — ``dynamic`` (the CPU default) and ``static`` (eager on the CPU, through the fused Llama decode
forward). What the tiny model cannot show: a 49k-token byte-level BPE, a Llama with grouped-query
attention (9 query / 3 key-value heads) and tied embeddings, a chat template that injects a default
system prompt, and real early endings at ``<|im_end|>`` (eos = pad, id 2)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

import rlcore
from rlcore import SamplingParams
from rlcore.loop import Policy, Rollout, make_prompts
from rlcore.testing import recompute_logprobs

EOS = 2  # SmolLM2's <|im_end|>, also its pad token
MAX_TOKENS, TEMPERATURE = 16, 0.7


@pytest.fixture(scope="module")
def model(smollm2_dir: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


@pytest.mark.parametrize("decode", ["dynamic", "static"])
def test_sampled_logprobs_equal_the_trainers_forward(model: Any, smollm2_tokenizer: Any, decode: str) -> None:
    """Two prompts of different lengths decoded in one batch, 3 samples each: rows that end at
    ``<|im_end|>`` leave the batch early, the rest run to the length cap. Each sampled token's
    logprob (the ``<|im_end|>`` included) equals both the trainer's packed batch (``Policy.logprobs``:
    right-padded with the pad = eos id) and a plain forward of the one sequence."""
    tok = smollm2_tokenizer
    sampler = rlcore.get("sampler", "hf")(model, tok, seed=0, decode=decode, batch_window_ms=20)
    policy = Policy(model, tok, loss="grpo", temperature=TEMPERATURE)
    rows = [{"prompt": [{"role": "user", "content": "Reply with only the word yes."}]},
            {"prompt": [{"role": "user", "content": "Twice Angie's age, plus 4, is 20. How old is Angie?"}]}]
    prompts = make_prompts(rows, tok)
    # SmolLM2's template injects its default system prompt before a first user message
    assert tok.decode(prompts[0].prompt_ids).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    try:
        rollout = Rollout(sampler, SamplingParams(max_tokens=MAX_TOKENS, temperature=TEMPERATURE))
        trajs = rollout(prompts, num_generations=3)
    finally:
        asyncio.run(sampler.close())
    assert rollout.last_stats["invariant_violations"] == 0 and rollout.last_stats["failed"] == 0
    assert max(sampler.batch_sizes) == 6  # one batch: both prompts, every sample
    ended = [t for t in trajs if t.completion_ids[-1] == EOS]
    assert ended and all(t.status == "ok" for t in ended), [t.messages[-1]["content"] for t in trajs]
    assert all(t.status == "truncated" and len(t.completion_ids) == MAX_TOKENS for t in trajs if t not in ended)
    assert len({len(t.completion_ids) for t in trajs}) > 1  # rows left the batch at different steps

    batch = policy.batch(trajs, [0.0] * len(trajs))
    trainer = policy.logprobs(trajs)
    mask = batch.completion_mask.bool()
    worst = 0.0
    for i, t in enumerate(trajs):
        sampled = torch.tensor(t.logprobs)
        assert len(sampled) == len(t.completion_ids) and bool(torch.all(sampled <= 0))
        assert torch.equal(batch.sampler_logps[i][mask[i]], sampled)
        packed = (trainer[i][mask[i]].cpu() - sampled).abs().max().item()
        plain = (recompute_logprobs(model, t.prompt_ids, t.completion_ids, TEMPERATURE) - sampled).abs().max().item()
        worst = max(worst, packed, plain)
        assert packed <= 1e-4 and plain <= 1e-4, (decode, i, packed, plain, t.completion_ids)
    assert worst > 0.0  # float32 rounding differs between the paths: a zero would mean nothing was compared
