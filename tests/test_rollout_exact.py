"""Token-exactness on a real multi-turn rollout: re-scoring the trajectory reproduces the sampler's logprobs.

A forward pass over ``prompt_ids + completion_ids`` gives, at every loss_mask=1 position, the
logprob the ``hf`` sampler returned when it drew that token. That only holds if the stored tokens
(and every observation token placed before them) are exactly the ones the sampler was conditioned on.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rlcore.rollout import MultiTurnScheduler, encode_prompt, run_rollouts
from rlcore.types import Prompt, SamplingParams


class UserThenTip(MultiTurnScheduler):
    """Turn 1 → a new user message; turn 2 → extend the assistant message (continuation)."""

    def check_finished(self, infer_request, response_choice, current_turn):
        return current_turn >= self.max_turns  # keep going after length stops: the random model rarely ends

    def step(self, infer_request, response_choice, current_turn):
        if current_turn % 2:
            infer_request.messages.append({"role": "user", "content": "Check it again."})
        else:
            infer_request.messages[-1]["content"] += " But wait,"
        return {"infer_request": infer_request}


@pytest.fixture(scope="module")
def sampler(tiny_model_dir: str) -> Any:
    from rlcore.sampling.hf.sampler import HFSampler

    return HFSampler(tiny_model_dir, seed=0, dtype=torch.float32)


async def test_multi_turn_rescoring_matches_sampler_logprobs(sampler: Any) -> None:
    tok = sampler.tokenizer
    prompts = []
    for q in ("What is 2 + 3?", "What is 7 * 6?"):
        msgs = [{"role": "user", "content": q}]
        prompts.append(Prompt(msgs, encode_prompt(tok, msgs)))
    # a frequent stop token makes some turns end with "stop", others with "length"
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=3)
    res = await run_rollouts(UserThenTip(sampler, max_turns=4), prompts, num_generations=2, sampling_params=params, progress=False)
    assert res.stats["failed"] == 0
    model = sampler.model
    checked = 0
    for t in res.trajectories:
        roles = [turn.role for turn in t.turns]
        assert roles.count("assistant") == 4 and "user" in roles and "continuation" in roles
        ids = torch.tensor([t.input_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float()
        logps = torch.log_softmax(logits[:-1], dim=-1)  # position i predicts token i+1
        p = len(t.prompt_ids)
        for j, (tokid, m, lp) in enumerate(zip(t.completion_ids, t.loss_mask, t.logprobs)):
            if not m:
                assert lp is None
                continue
            rescored = logps[p + j - 1, tokid].item()
            assert abs(rescored - lp) < 1e-4, (j, rescored, lp)
            checked += 1
    assert checked >= 40
