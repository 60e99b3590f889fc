"""Tip schedulers written in ms-swift 4.x's API, running on rlcore.

``MathTips`` and ``ThinkingTips`` are our own code, written the way a 4.x user writes a tip
scheduler against ms-swift 4.6.0's API (``swift/rollout/multi_turn.py``, ``swift/rewards/orm.py``):
only the import lines differ from what one would write for ms-swift (``from swift.rollout import
MultiTurnScheduler`` becomes ``from rlcore import MultiTurnScheduler``, ``from swift.rewards.orm
import MathAccuracy`` becomes ``from rl_plugin_tips.accuracy import MathAccuracy``). They do what
ms-swift 4.6.0's ``MathTipsScheduler`` and ``ThinkingModelTipsScheduler`` do, and rlcore answers as
docs/porting-ms-swift.md says:

* ``MathTips`` (a ``step`` that rewrites the round's ids): an answer with ``</think>``/``<answer>``
  is cut before it, the tip appended (untrained) and the model continues the same message —
  token-exact and sound. An answer with neither keeps every sampled id, the ``<|im_end|>``
  included, before the tip, as 4.6.0's does: that trajectory fails as an invariant violation
  showing it (ms-swift trains it). Built on ``prepare_response_continuation`` instead
  (``MathTipsWithoutEos``), the same answer is sound.
* ``ThinkingTips`` (a ``run`` returning one ``RolloutOutput`` per round, earlier rounds' thinking
  dropped from the history): every round is trained. 4.6.0's history builder, without a template
  object (rlcore has none), puts a bare string in the messages from the second round on;
  ``BareStringHistory`` does that, and each later round's output fails with that reason.
"""

from __future__ import annotations

import itertools
from typing import Any


from rl_plugin_tips.accuracy import MathAccuracy
from rl_plugin_tips.thinking_tips import DEFAULT_USER_TIP
from rl_plugin_tips.tip_trick import DEFAULT_TIP, DEFAULT_MARKERS
from rlcore import MultiTurnScheduler, SamplingParams
from rlcore.rollout import RolloutOutput, build_scheduler, encode_prompt, run_rollouts
from rlcore.testing import ScriptedSampler, assert_token_exact
from rlcore.types import Prompt


class MathTips(MultiTurnScheduler):
    """Tip once, inside the same assistant message: a wrong answer loses its conclusion (from the
    first of ``markers``), the tip follows it untrained, and the model goes on from there."""

    tip = DEFAULT_TIP
    markers = DEFAULT_MARKERS

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.accuracy = kwargs.get("acc_function") or MathAccuracy()

    def check_finished(self, infer_request, response_choice, current_turn):
        answer = infer_request.messages[-1]["content"]
        if self.tip in answer or self.accuracy([answer], [infer_request.data_dict["solution"]])[0] == 1.0:
            return True  # right, or already tipped once
        return super().check_finished(infer_request, response_choice, current_turn)

    def step(self, infer_request, response_choice, current_turn):
        text = response_choice.message.content
        cut = min((text.index(m) for m in self.markers if m in text), default=None)
        if cut is None:
            ids, logprobs = self.kept_tokens(response_choice)
            kept = text
        else:
            ids, logprobs = self.tokens_before(response_choice, text[:cut])
            kept = self.tokenizer.decode(ids, skip_special_tokens=False)
        tip_ids = self.tokenizer.encode(self.tip, add_special_tokens=False)
        infer_request.messages[-1]["content"] = kept + self.tip
        return {"infer_request": infer_request, "response_token_ids": ids + tip_ids,
                "response_loss_mask": [1] * len(ids) + [0] * len(tip_ids), "rollout_logprobs": logprobs}

    def kept_tokens(self, choice) -> tuple[list[int], list[float]]:
        """Nothing to cut: the whole sample as it came, its closing eos included."""
        return list(choice.token_ids), self._extract_logprobs_from_choice(choice)

    def tokens_before(self, choice, kept: str) -> tuple[list[int], list[float]]:
        """The longest run of sampled tokens whose text ``kept`` starts with (never past the cut)."""
        ids = list(choice.token_ids)
        k = max(n for n in range(len(ids) + 1) if kept.startswith(self.tokenizer.decode(ids[:n])))
        return ids[:k], self._extract_logprobs_from_choice(choice)[:k]


class MathTipsWithoutEos(MathTips):
    """Nothing to cut: the sample without its closing eos, from ``prepare_response_continuation``."""

    def kept_tokens(self, choice) -> tuple[list[int], list[float]]:
        ids, _mask, logprobs = self.prepare_response_continuation(choice)
        return ids, logprobs


class ThinkingTips(MultiTurnScheduler):
    """For thinking models: a wrong answer gets a tip as a new user message, and every round is
    its own ``RolloutOutput`` whose history keeps the thinking of its last answer only."""

    tip = DEFAULT_USER_TIP

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.accuracy = kwargs.get("acc_function") or MathAccuracy()

    async def run(self, infer_request, request_config, **kwargs):
        request, rounds = infer_request, []
        for turn in itertools.count(1):
            response = await self.engine.infer_async(request, request_config, **kwargs)
            choice = response.choices[0]
            request.messages.append({"role": "assistant", "content": choice.message.content})
            rounds.append(RolloutOutput(response=response, messages=self.round_history(request.messages),
                                        response_token_ids=list(choice.token_ids), rollout_infos={"num_turns": turn}))
            if self.check_finished(request, choice, turn):
                return rounds
            request = self.step(request, choice, turn)["infer_request"]

    def check_finished(self, infer_request, response_choice, current_turn):
        if infer_request.messages[-2]["content"] == self.tip:
            return True  # one tip only
        if self.accuracy([response_choice.message.content], [infer_request.data_dict["solution"]])[0] == 1.0:
            return True
        return super().check_finished(infer_request, response_choice, current_turn)

    def step(self, infer_request, response_choice, current_turn):
        infer_request.messages.append({"role": "user", "content": self.tip})
        return {"infer_request": infer_request}

    def round_history(self, messages):
        """Earlier answers lose their ``<think>`` block; the last one keeps it."""
        last = len(messages) - 1
        return [self.without_thinking(m) if m["role"] == "assistant" and i < last else dict(m) for i, m in enumerate(messages)]

    @staticmethod
    def without_thinking(message):
        return {**message, "content": message["content"].split("</think>")[-1].strip()}


class BareStringHistory(ThinkingTips):
    """What 4.6.0's history builder gives without a template object: the answer's text alone."""

    @staticmethod
    def without_thinking(message):
        return message["content"].split("</think>")[-1].strip()


PARAMS = SamplingParams(max_tokens=32)


def question(tok: Any) -> Prompt:
    msgs = [{"role": "user", "content": "what is 1 + 2?"}]
    return Prompt(msgs, encode_prompt(tok, msgs), data={"solution": "3"})


def answers(tok: Any, first: str, after_tip: str, tip: str) -> ScriptedSampler:
    """Says ``first``, and ``after_tip`` once the tip is in what it reads (any number of trajectories)."""

    def respond(prompt_ids: list[int], params: Any, i: int) -> str:
        return after_tip if tip in tok.decode(prompt_ids, skip_special_tokens=False) else first

    return ScriptedSampler(tokenizer=tok, respond=respond)


async def test_math_tips_cut_at_think_continues_token_exactly(tokenizer: Any) -> None:
    tip = MathTips.tip
    s = answers(tokenizer, "<think>1 and 2 make 4</think><answer>4</answer>", " 3</think><answer>3</answer>", tip)
    sched = build_scheduler(MathTips, s, tokenizer, max_turns=3)
    res = await run_rollouts(sched, [question(tokenizer)], num_generations=2, sampling_params=PARAMS, progress=False)
    for t in res.trajectories:
        assert t.messages[-1]["content"] == "<think>1 and 2 make 4" + tip + " 3</think><answer>3</answer>"
        tip_ids = tokenizer.encode(tip, add_special_tokens=False)
        untrained = [i for turn in t.turns for i, m in zip(turn.token_ids, turn.loss_mask) if not m]
        assert untrained == tip_ids and t.logprobs_complete and t.num_turns == 2
    assert_token_exact(res.trajectories, tokenizer)


async def test_math_tips_right_first_time(tokenizer: Any) -> None:
    s = answers(tokenizer, "<think>1 and 2</think><answer>3</answer>", "never", MathTips.tip)
    res = await run_rollouts(build_scheduler(MathTips, s, tokenizer, max_turns=3), [question(tokenizer)],
                             sampling_params=PARAMS, progress=False)
    assert res.trajectories[0].num_turns == 1
    assert_token_exact(res.trajectories, tokenizer)


async def test_math_tips_keeping_the_sampled_eos_fails_loudly(tokenizer: Any) -> None:
    """No ``</think>``/``<answer>`` to cut at: all sampled ids, eos included, then the tip (ms-swift
    4.6.0's ``MathTipsScheduler`` does this); without the eos the same answer is sound."""
    s = answers(tokenizer, "it is 4", " 3", MathTips.tip)
    res = await run_rollouts(build_scheduler(MathTips, s, tokenizer, max_turns=3), [question(tokenizer)],
                             num_generations=2, sampling_params=PARAMS, progress=False)
    for t in res.trajectories:
        assert t.status == "failed"
        assert t.reason.startswith("invariant violated by scheduler MathTips: tokens (turn 1)"), t.reason
        assert "4<|im_end|>But wait" in t.reason  # the tokens hold the eos, the message does not
    res = await run_rollouts(build_scheduler(MathTipsWithoutEos, s, tokenizer, max_turns=3), [question(tokenizer)],
                             num_generations=2, sampling_params=PARAMS, progress=False)
    for t in res.trajectories:
        assert t.messages[-1]["content"] == "it is 4" + MathTips.tip + " 3" and t.num_turns == 2
    assert_token_exact(res.trajectories, tokenizer)


async def test_thinking_tips_right_first_time(tokenizer: Any) -> None:
    s = answers(tokenizer, "<think>1 and 2</think><answer>3</answer>", "never", ThinkingTips.tip)
    res = await run_rollouts(build_scheduler(ThinkingTips, s, tokenizer, max_turns=3), [question(tokenizer)],
                             sampling_params=PARAMS, progress=False)
    assert len(res.trajectories) == 1 and res.trajectories[0].messages[-1]["content"].startswith("<think>")
    assert_token_exact(res.trajectories, tokenizer)


async def two_rounds(cls: type, tokenizer: Any) -> list[Any]:
    """Two samples of a question answered wrong, then right after the tip: four outputs, one group."""
    s = answers(tokenizer, "<think>a</think><answer>4</answer>", "<think>b</think><answer>3</answer>", ThinkingTips.tip)
    res = await run_rollouts(build_scheduler(cls, s, tokenizer, max_turns=3), [question(tokenizer)],
                             num_generations=2, sampling_params=PARAMS, progress=False)
    assert len(res.trajectories) == 4 and len({t.group_id for t in res.trajectories}) == 1
    return res.trajectories


async def test_thinking_tips_one_output_per_round(tokenizer: Any) -> None:
    trajs = await two_rounds(ThinkingTips, tokenizer)
    later = [t for t in trajs if len(t.messages) > 2]
    assert len(later) == 2
    for t in later:  # the first answer without its thinking, the second with it
        assert [m["content"] for m in t.messages[1:]] == ["<answer>4</answer>", ThinkingTips.tip, "<think>b</think><answer>3</answer>"]
    assert_token_exact(trajs, tokenizer)


async def test_thinking_tips_bare_string_history_fails_with_the_reason(tokenizer: Any) -> None:
    trajs = await two_rounds(BareStringHistory, tokenizer)
    first = [t for t in trajs if t.status != "failed"]
    later = [t for t in trajs if t.status == "failed"]
    assert len(first) == 2 and len(later) == 2
    for t in later:
        assert t.reason.startswith("scheduler BareStringHistory returned an output rlcore cannot train on")
        assert "each message must be a dict" in t.reason
    assert_token_exact(first, tokenizer)


async def test_on_the_tiny_model(tokenizer: Any, tiny_hf_sampler: Any) -> None:
    """Random text: every trajectory is sound or fails with one of the reasons documented above."""
    params = SamplingParams(max_tokens=6, temperature=1.0)
    documented = {MathTips: "invariant violated by scheduler MathTips: tokens", BareStringHistory: "each message must be a dict"}
    for cls in (MathTips, MathTipsWithoutEos, ThinkingTips, BareStringHistory):
        res = await run_rollouts(build_scheduler(cls, tiny_hf_sampler, tokenizer, max_turns=2), [question(tokenizer)] * 2,
                                 num_generations=3, sampling_params=params, progress=False)
        ok = [t for t in res.trajectories if t.status != "failed"]
        for t in res.trajectories:
            if t.status == "failed":
                assert cls in documented and documented[cls] in t.reason, (cls, t.reason)
        assert ok
        assert_token_exact(ok, tokenizer)
