"""``thinking_tips_scheduler``: one trajectory per round, history without old thinking, group kept."""

from __future__ import annotations

import rlcore
from rlcore.rollout import encode_prompt, run_rollouts
from rlcore.testing import ScriptedSampler
from rl_plugin_tips.thinking_tips import DEFAULT_USER_TIP, ThinkingTipsScheduler, strip_thinking

R1 = "<think>3 + 4 = 8</think><answer>8</answer>"
R2 = "<think>check: 3 + 4 = 9</think><answer>9</answer>"
R3 = "<think>3 + 4 = 7</think><answer>7</answer>"


def test_strip_thinking() -> None:
    assert strip_thinking(R1) == "<answer>8</answer>"
    assert strip_thinking("a <think>x</think> b") == "b"
    assert strip_thinking("thinking opened in the prompt</think>\n\n8") == "8"
    assert strip_thinking("no thinking") == "no thinking"


async def test_rounds_until_correct(tokenizer, make_prompt) -> None:
    prompt = make_prompt()
    sampler = ScriptedSampler([R1, R2, R3], tokenizer)
    sched = rlcore.get("scheduler", "thinking_tips_scheduler")(sampler, max_turns=5)
    result = await run_rollouts(sched, [prompt], progress=False)
    rounds = result.trajectories
    assert len(rounds) == 3 and len(sampler.calls) == 3
    assert len({t.uuid for t in rounds}) == 3 and {t.group_id for t in rounds} == {prompt.group_id}
    assert [t.infos["correct"] for t in rounds] == [False, False, True]
    assert all(t.status == "ok" and t.num_turns == 1 and t.infos["rounds"] == 3 for t in rounds)

    # round 3's prompt: the question, each earlier answer without its thinking, each followed by the tip
    last = rounds[2]
    assert last.messages[:-1] == [
        prompt.messages[0],
        {"role": "assistant", "content": "<answer>8</answer>"},
        {"role": "user", "content": DEFAULT_USER_TIP},
        {"role": "assistant", "content": "<answer>9</answer>"},
        {"role": "user", "content": DEFAULT_USER_TIP},
    ]
    assert last.messages[-1] == {"role": "assistant", "content": R3}  # this round's thinking is kept
    assert last.prompt_ids == encode_prompt(tokenizer, last.messages[:-1]) == sampler.calls[2][0]
    # each round trains only its own answer, sampled tokens with their logprobs
    for t in rounds:
        assert len(t.turns) == 1 and t.loss_mask == [1] * len(t.completion_ids) and t.logprobs_complete
    assert "<think>" not in tokenizer.decode(last.prompt_ids)

    acc = rlcore.rewards.as_reward("gsm8k_accuracy", rlcore.get("reward", "gsm8k_accuracy"))
    cols = await rlcore.rewards.compute_rewards(rlcore.RunHooks(acc, observers=False), rounds)
    assert cols["gsm8k_accuracy"] == [0.0, 0.0, 1.0]  # each round is scored on its own answer


async def test_max_turns_bounds_rounds_and_groups_stay_apart(tokenizer, make_prompt) -> None:
    prompts = [make_prompt(), make_prompt("what is 5 + 5", "#### 10")]
    sampler = ScriptedSampler([R1], tokenizer)  # always wrong
    sched = ThinkingTipsScheduler(sampler, max_turns=2)
    result = await run_rollouts(sched, prompts, num_generations=2, progress=False)
    trajs = result.trajectories
    assert len(trajs) == 2 * 2 * 2 and len(sampler.calls) == 8  # 2 prompts x 2 samples x 2 rounds
    for p in prompts:
        group = [t for t in trajs if t.group_id == p.group_id]
        assert len(group) == 4 and all(t.data["answer"] == p.data["answer"] for t in group)
    assert result.stats["trajectories"] == 8 and result.stats["ok"] == 8


async def test_keep_history_thinking_option_and_failure_of_a_later_round(tokenizer, make_prompt) -> None:
    sampler = ScriptedSampler([R1, R2], tokenizer, fail_on=[1])  # the second round's generation fails
    sched = ThinkingTipsScheduler(sampler, max_turns=3, strip_history_thinking=False)
    rounds = (await run_rollouts(sched, [make_prompt()], progress=False)).trajectories
    assert [t.status for t in rounds] == ["ok", "failed"]
    assert "injected failure" in rounds[1].reason
    assert rounds[1].messages[1] == {"role": "assistant", "content": R1}  # thinking kept in history
    assert not sched._streams  # every per-round stream released
