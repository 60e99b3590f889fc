"""``llm_judge`` with ``judge_model=PATH``: a generative reward model loaded in-process, asked in
batches (the tiny model, which answers noise, and the real SmolLM2-135M-Instruct). Neither is a good
judge: the tests hold the pipeline to its promise — each sample gets a score in [0, 1] or a counted
reward error — not the judge to good taste."""

from __future__ import annotations

from typing import Any

import pytest

from rl_plugin_judge.endpoint import JudgeError
from rl_plugin_judge.reward import LLMJudge
from rlcore.errors import ConfigError
from rlcore.rewards import RewardContext


def observed(reward: LLMJudge) -> dict[str, Any]:
    """What the reward reports to a trainer (step metrics, the replies column), captured."""
    seen: dict[str, Any] = {"metrics": {}, "extras": {}}
    reward.context = RewardContext(log_metric=lambda k, v: seen["metrics"].__setitem__(k, v),
                                   log_extra=lambda k, v: seen["extras"].setdefault(k, []).extend(v))
    return seen


def check_pipeline(values: list[float | None], reward: LLMJudge) -> None:
    """Every sample: a score in [0, 1], or None with its failure counted (a reply with no score)."""
    nones = [i for i, v in enumerate(values) if v is None]
    assert all(0.0 <= v <= 1.0 for v in values if v is not None), values
    assert reward.errors == len(nones) == len(reward.last_failures)
    assert all(isinstance(f, JudgeError) and "in the judge's reply" in str(f) for f in reward.last_failures)


async def test_tiny_model_judges_in_batches_each_question_once(tiny_model_dir: str, make_traj) -> None:
    reward = LLMJudge(judge_model=tiny_model_dir, max_new_tokens=4, judge_batch_size=2, judge_device="cpu")
    seen = observed(reward)
    trajs = [make_traj("4"), make_traj("five"), make_traj("4"), make_traj("2 + 2 = 4")]
    values = (await reward.compute_reward(trajs))["llm_judge"]
    check_pipeline(values, reward)
    assert values[0] == values[2]  # the same question, asked once
    assert (reward.calls, reward.cache_hits) == (3, 1)
    assert seen["metrics"]["llm_judge/calls"] == 3 and seen["metrics"]["llm_judge/cache_hits"] == 1
    replies = seen["extras"]["llm_judge_reply"]
    assert len(replies) == 4 and replies[0] == replies[2]
    # batched (left-padded, two per batch) greedy decoding answers what each question alone would
    questions = reward.questions([t.messages[:1] for t in trajs], [t.messages[1]["content"] for t in trajs], trajs)
    local = reward.judge
    assert local.generate([questions[0], questions[1], questions[3]]) == [local.generate([q])[0] for q in
                                                                          (questions[0], questions[1], questions[3])]
    text = local.tokenizer.apply_chat_template(questions[0], add_generation_prompt=True, tokenize=False)
    assert "2 + 2" in text and text != questions[0][0]["content"]  # the judge's own chat template around the rubric


def test_in_process_options_are_checked(tiny_model_dir: str, tmp_path) -> None:
    with pytest.raises(ConfigError, match="decodes greedily; judge_temperature applies to a judge_url server only"):
        LLMJudge(judge_model=tiny_model_dir, judge_temperature=0.7)
    with pytest.raises(ConfigError, match=r"missing\.gguf does not exist"):
        LLMJudge(judge_model=str(tmp_path / "missing.gguf"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="is not a loadable causal language model"):
        LLMJudge(judge_model=str(tmp_path / "empty"))


async def test_smollm2_as_the_in_process_judge(smollm2_gguf: str, make_traj) -> None:
    # the GGUF file itself: rlcore.gguf.resolve_model gives its converted directory (converted once, cached)
    reward = LLMJudge(judge_model=smollm2_gguf, max_new_tokens=16, judge_batch_size=4, judge_device="cpu")
    seen = observed(reward)
    trajs = [make_traj("2 + 2 = 4."), make_traj("The answer is 5."), make_traj("2 + 2 = 4.")]
    values = (await reward.compute_reward(trajs))["llm_judge"]
    check_pipeline(values, reward)
    assert values[0] == values[2] and reward.calls == 2
    replies = seen["extras"]["llm_judge_reply"]
    assert all(isinstance(r, str) and r.strip() for r in replies), replies  # the real model said something each time
    # parse errors count questions, reward errors samples: the duplicate shares its question's failure
    assert seen["metrics"]["llm_judge/parse_errors"] == len({id(f) for f in reward.last_failures})
