"""``math_tip_trick`` with scripted model choices (the scheduler and the token stream are real)."""

from __future__ import annotations

import sys

import pytest

import rlcore
from rlcore.errors import ConfigError
from rlcore.rewards import as_reward, compute_rewards
from rlcore.rollout import INLINE_ROLE, run_rollouts
from rlcore.testing import ScriptedSampler, fake_logprob
from rl_plugin_tips.tip_trick import DEFAULT_TIP, MathTipTrick

WRONG = "<think>3 + 4 = 8 so it is 8</think><answer>8</answer>"
FIXED = " 3 + 4 = 7</think><answer>7</answer>"


async def roll(tokenizer, prompt, responses, **options):
    sampler = ScriptedSampler(responses, tokenizer)
    sched = rlcore.get("scheduler", "math_tip_trick")(sampler, **options)
    result = await run_rollouts(sched, [prompt], progress=False)
    assert len(result.trajectories) == 1
    return result.trajectories[0], sampler


async def test_wrong_answer_is_cut_tipped_and_continued(tokenizer, make_prompt) -> None:
    prompt = make_prompt()
    traj, sampler = await roll(tokenizer, prompt, [WRONG, FIXED])
    assert len(sampler.calls) == 2 and traj.status == "ok"

    first = tokenizer.encode(WRONG, add_special_tokens=False)
    kept, tip, cont = traj.turns
    # kept: a prefix of the sampled ids, mask 1, with exactly the logprobs the sampler reported
    k = len(kept.token_ids)
    assert kept.token_ids == first[:k] and tokenizer.decode(kept.token_ids) == "<think>3 + 4 = 8 so it is 8"
    assert kept.loss_mask == [1] * k
    assert kept.logprobs == [fake_logprob(prompt.prompt_ids, i, t) for i, t in enumerate(first[:k])]
    # tip: scheduler text inside the same assistant message, never trained
    assert tip.role == INLINE_ROLE and tokenizer.decode(tip.token_ids) == DEFAULT_TIP
    assert tip.loss_mask == [0] * len(tip.token_ids) and tip.logprobs == [None] * len(tip.token_ids)
    # continuation: generated right after the tip, no new turn header, mask 1 with logprobs
    assert sampler.calls[1][0] == prompt.prompt_ids + kept.token_ids + tip.token_ids
    assert cont.loss_mask == [1] * len(cont.token_ids) and None not in cont.logprobs
    assert traj.input_ids == prompt.prompt_ids + kept.token_ids + tip.token_ids + cont.token_ids
    assert traj.logprobs_complete  # every trained token has its sampler logprob

    assert [m["role"] for m in traj.messages] == ["user", "assistant"]
    assert traj.messages[-1]["content"] == "<think>3 + 4 = 8 so it is 8" + DEFAULT_TIP + FIXED
    assert traj.infos["correct_before_tip"] is False and traj.infos["correct"] is True and traj.infos["tips"] == 1
    assert traj.infos["tip_cut_tokens"] == len(first) - k

    acc = as_reward("gsm8k_accuracy", rlcore.get("reward", "gsm8k_accuracy"))
    cols = await compute_rewards(rlcore.RunHooks(acc, observers=False), [traj])
    assert cols["gsm8k_accuracy"] == [1.0]  # the continued answer is what gets scored


async def test_correct_first_answer_gets_no_tip(tokenizer, make_prompt) -> None:
    traj, sampler = await roll(tokenizer, make_prompt(), ["<think>3 + 4 = 7</think><answer>7</answer>"])
    assert len(sampler.calls) == 1 and len(traj.turns) == 1 and traj.loss_mask == [1] * len(traj.turns[0].token_ids)
    assert traj.infos["correct"] is True and "tips" not in traj.infos


async def test_one_tip_only(tokenizer, make_prompt) -> None:
    """Still wrong after the tip: the trajectory ends, however many turns max_turns would allow."""
    traj, sampler = await roll(tokenizer, make_prompt(), [WRONG, " still 8</think><answer>8</answer>", WRONG], max_turns=6)
    assert len(sampler.calls) == 2
    assert [t.role for t in traj.turns] == ["assistant", INLINE_ROLE, "assistant"]
    assert traj.infos["tips"] == 1 and traj.infos["correct"] is False
    assert traj.messages[-1]["content"].count(DEFAULT_TIP) == 1


async def test_no_marker_keeps_the_answer_but_drops_its_eos(tokenizer, make_prompt) -> None:
    traj, sampler = await roll(tokenizer, make_prompt(), ["the answer is 8", " no, 7. #### 7"])
    kept = traj.turns[0]
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert eos not in kept.token_ids and tokenizer.decode(kept.token_ids) == "the answer is 8"
    assert traj.infos["correct"] is True and traj.turns[-1].token_ids[-1] == eos


async def test_length_truncated_answer_is_not_tipped(tokenizer, make_prompt) -> None:
    sampler = ScriptedSampler([WRONG], tokenizer)
    sched = MathTipTrick(sampler)
    result = await run_rollouts(sched, [make_prompt()], sampling_params=rlcore.SamplingParams(max_tokens=3), progress=False)
    traj = result.trajectories[0]
    assert traj.status == "truncated" and len(sampler.calls) == 1 and "tips" not in traj.infos


async def test_user_accuracy_function_and_string(tokenizer, make_prompt) -> None:
    traj, sampler = await roll(tokenizer, make_prompt(), [WRONG, FIXED], accuracy=lambda text, ref: "8" in text)
    assert len(sampler.calls) == 1 and traj.infos["correct"] is True  # the user's check said "right"
    traj, sampler = await roll(tokenizer, make_prompt(), [WRONG, FIXED], accuracy="rl_plugin_tips.accuracy:fallback_is_correct")
    assert len(sampler.calls) == 2 and traj.infos["correct"] is True
    with pytest.raises(ConfigError, match="accuracy"):
        MathTipTrick(accuracy="no_such_module:fn")


async def test_fallback_accuracy_without_rl_plugin_math(tokenizer, make_prompt, monkeypatch) -> None:
    """rl-plugin-math absent (import blocked): the built-in fallback still judges numbers."""
    monkeypatch.setitem(sys.modules, "rl_plugin_math", None)
    from rl_plugin_tips.accuracy import default_accuracy, fallback_is_correct

    assert default_accuracy() is fallback_is_correct
    traj, sampler = await roll(tokenizer, make_prompt(), [WRONG, FIXED])
    assert len(sampler.calls) == 2 and traj.infos["correct_before_tip"] is False and traj.infos["correct"] is True
    assert fallback_is_correct("<answer>1,000</answer>", "#### 1000") is True
    assert fallback_is_correct("#### 9", "#### 1000") is False
    assert fallback_is_correct("<answer>x = y</answer>", "x = y") is True
    assert fallback_is_correct("anything", None) is None
