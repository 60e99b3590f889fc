"""Both schedulers driving the real tiny transformer through the ``hf`` sampler.

The model's text is random, so the checks are the invariants that must hold whatever it says: the
kept tokens and logprobs are exactly the sampled ones, tips are untrained, rounds keep their group.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rlcore import SamplingParams, Turn, hookimpl
from rlcore.rollout import INLINE_ROLE, encode_prompt, run_rollouts
from rl_plugin_tips.tip_trick import MathTipTrick
from rl_plugin_tips.thinking_tips import ThinkingTipsScheduler
from rl_plugin_tips.truncate import find_marker


@pytest.fixture(scope="module")
def sampler(tiny_model_dir: str):
    from rlcore.sampling.hf.sampler import HFSampler

    s = HFSampler(tiny_model_dir, batch_window_ms=10, seed=0)
    yield s
    asyncio.run(s.close())


class FirstTurnRecorder:
    """An observer plugin: keeps a copy of each trajectory's first sampled completion."""

    def __init__(self) -> None:
        self.first: dict[str, tuple[list[int], list[float]]] = {}

    @hookimpl
    def on_turn_end(self, infer_request: Any, response_choice: Any, current_turn: int) -> None:
        if current_turn == 1:
            completion = response_choice.completion  # the flat view (choice.logprobs is ms-swift's dict)
            self.first[infer_request.uuid] = (list(completion.token_ids), list(completion.logprobs))


def never_right(text: str, reference: Any) -> bool:
    return False


async def test_tip_trick_on_the_tiny_model(sampler, make_prompt) -> None:
    tok = sampler.tokenizer
    markers = (" ", "</think>")  # spaces are common in the model's random text: most answers get cut
    sched = MathTipTrick(sampler, accuracy=never_right, markers=markers)
    rec = FirstTurnRecorder()
    # a random model rarely says <|im_end|>: let a quarter of the vocabulary end a turn instead
    stops = list(range(0, len(tok), 4))
    params = SamplingParams(max_tokens=16, temperature=1.0, stop_token_ids=stops)
    result = await run_rollouts(sched, [make_prompt()], num_generations=4, sampling_params=params, components=[rec], progress=False)
    tipped = [t for t in result.trajectories if t.infos.get("tips")]
    assert tipped, "every answer is judged wrong, so finished ones must be tipped"
    cuts = 0
    for t in tipped:
        ids, lps = rec.first[t.uuid]
        at = [turn.role for turn in t.turns].index(INLINE_ROLE)
        assert at in (0, 1) and len(t.turns) == at + 2  # [kept (unless the cut kept nothing)], tip, continuation
        kept = t.turns[0] if at else Turn([], [], [])
        tip, cont = t.turns[at], t.turns[at + 1]
        k = len(kept.token_ids)
        assert kept.token_ids == ids[:k] and kept.logprobs == lps[:k]  # token-exact, logprobs carried
        assert ids[k:] and k < len(ids)  # the marker's tokens (or the stop token) were cut
        assert tip.role == INLINE_ROLE and set(tip.loss_mask) == {0} and set(tip.logprobs) == {None}
        assert tok.decode(tip.token_ids).endswith(sched.tip)
        text = tok.decode(ids)
        pos, marker = find_marker(text, markers)
        if marker:
            cuts += 1
            assert len(tok.decode(kept.token_ids)) <= pos
            assert (tok.decode(kept.token_ids) + tok.decode(tip.token_ids)).startswith(text[:pos])
        assert cont.loss_mask == [1] * len(cont.token_ids) and t.logprobs_complete
        assert t.num_turns == 2
    assert cuts, "no sampled answer contained the marker; the cut was not exercised"


async def test_thinking_tips_on_the_tiny_model(sampler, make_prompt) -> None:
    sched = ThinkingTipsScheduler(sampler, accuracy=never_right, max_turns=2)
    params = SamplingParams(max_tokens=6, temperature=1.0)
    prompts = [make_prompt(), make_prompt("what is 5 + 5", "#### 10")]
    result = await run_rollouts(sched, prompts, num_generations=2, sampling_params=params, progress=False)
    trajs = result.trajectories
    finished = [t for t in trajs if t.status == "ok"]
    assert len(trajs) >= 4 and all(t.group_id in {p.group_id for p in prompts} for t in trajs)
    for t in trajs:
        assert t.loss_mask == [1] * len(t.completion_ids) and t.logprobs_complete
        assert t.prompt_ids == encode_prompt(sampler.tokenizer, t.messages[: t.infos["prompt_messages"]])
    # a round-1 answer that finished normally is followed by a round 2 in the same group
    assert len(trajs) == 4 + len([t for t in finished if t.infos["round"] == 1])
