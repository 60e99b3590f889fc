"""The rollout invariant checker catches each silent corruption the issue found, on real tokens,
and ``rlcore check-rollouts`` / ``rlcore rollout --check`` expose it on the command line."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from rlcore.rollout import check_batch, check_trajectory, encode_prompt, run_rollouts
from rlcore.rollout.scheduler import MultiTurnScheduler
from rlcore.testing import ScriptedSampler
from rlcore.types import Prompt, SamplingParams, Trajectory, Turn


@pytest.fixture(scope="module")
def tok(tiny_model_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


class AskAgain(MultiTurnScheduler):
    def step(self, infer_request, response_choice, current_turn):
        infer_request.messages.append({"role": "user", "content": "again"})
        return {"infer_request": infer_request}


async def sound(tok: Any) -> list[Trajectory]:
    msgs = [{"role": "user", "content": "what is 2 + 2?"}]
    res = await run_rollouts(AskAgain(ScriptedSampler(["four", "4"], tok), max_turns=2),
                             [Prompt(msgs, encode_prompt(tok, msgs))], num_generations=2,
                             sampling_params=SamplingParams(max_tokens=16), progress=False)
    assert res.stats["ok"] == 2
    return res.trajectories


async def test_sound_trajectories_pass(tok: Any) -> None:
    trajs = await sound(tok)
    assert check_batch(trajs, tok, require_logprobs=True) == []


async def test_each_corruption_is_named(tok: Any) -> None:
    base = (await sound(tok))[0]

    # 1. prompt tokens rendered from other messages than the trajectory's
    t = copy.deepcopy(base)
    t.messages[0]["content"] = "a different question"
    (v,) = check_trajectory(t, tok)
    assert v.check == "prompt" and v.turn == 0

    # 2./3. an eos inside a kept assistant message (tokens and conversation disagree at turn 1)
    t = copy.deepcopy(base)
    t.messages[1]["content"] = "four and more"
    (v,) = check_trajectory(t, tok)
    assert v.check == "tokens" and v.turn == 1 and "four<|im_end|>" in v.message

    # user turn missing from the token stream (RolloutOutput misread)
    t = copy.deepcopy(base)
    t.turns = [turn for turn in t.turns if turn.role == "assistant"]
    assert [v.check for v in check_trajectory(t, tok)] == ["tokens"]

    # logprobs lost for some trained tokens
    t = copy.deepcopy(base)
    first = t.turns[0]
    t.turns[0] = Turn(first.token_ids, first.loss_mask, [None] + first.logprobs[1:], finish_reason=first.finish_reason)
    (v,) = check_trajectory(t, tok)
    assert v.check == "logprobs" and v.turn == 1 and "1 of" in v.message

    # a length-cut completion reported ok
    t = copy.deepcopy(base)
    t.turns[-1].finish_reason = "length"
    assert [v.check for v in check_trajectory(t, tok)] == ["status"]

    # duplicate uuids in a batch
    twin = copy.deepcopy(base)
    assert [v.check for v in check_batch([base, twin], tok)] == ["uuid"]


async def test_a_backend_without_logprobs_is_allowed_but_strict_mode_flags_it(tok: Any) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    res = await run_rollouts(AskAgain(ScriptedSampler(["x"], tok, logprobs=False), max_turns=1),
                             [Prompt(msgs, encode_prompt(tok, msgs))], progress=False)
    (t,) = res.trajectories
    assert t.status == "ok" and not t.logprobs_complete  # importance-sampling correction is off for it
    assert check_trajectory(t, tok) == []
    assert [v.check for v in check_trajectory(t, tok, require_logprobs=True)] == ["logprobs"]


def run_cli(args: list[str]) -> Any:
    from click.testing import CliRunner

    from rlcore.commands.cli import _load_commands, cli

    _load_commands()
    return CliRunner().invoke(cli, args)


async def test_check_rollouts_command(tok: Any, tmp_path: Path) -> None:
    good, bad = await sound(tok)
    bad.messages[1]["content"] = "five"
    path = tmp_path / "r.jsonl"
    path.write_text(good.to_json() + "\n" + bad.to_json() + "\n")
    res = run_cli(["check-rollouts", str(path)])
    assert res.exit_code == 1
    assert f"{bad.uuid}: tokens (turn 1)" in res.output and "1 sound, 1 with violations" in res.output
    path.write_text(good.to_json() + "\n")
    res = run_cli(["check-rollouts", str(path)])
    assert res.exit_code == 0 and "1 sound, 0 with violations" in res.output


def test_rollout_checks_and_takes_scheduler_options(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    res = run_cli(["rollout", "--scheduler", "multi_turn", "--limit", "2", "--max-tokens", "4", "--no-progress",
                   "--scheduler-options", '{"max_turns": 2, "max_total_tokens": 200}', "--output", str(out)])
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert all(d["status"] in ("ok", "truncated") and d["num_turns"] <= 2 for d in lines)
    res = run_cli(["check-rollouts", str(out)])
    assert res.exit_code == 0, res.output
    res = run_cli(["rollout", "--scheduler-options", "[1]", "--output", str(out)])
    assert res.exit_code != 0 and "--scheduler-options must be a JSON object" in str(res.exception)


def test_the_trainer_checks_every_batch(tmp_path: Path, tiny_model_dir: str) -> None:
    """A scheduler that trains its sampled eos mid-message (ms-swift's MathTips pattern): the
    trainer's batch check fails those trajectories (masked out of the loss) and counts them."""
    from rlcore.trainer.grpo import GRPOConfig, GRPOTrainer

    class KeepsEos(MultiTurnScheduler):
        def step(self, infer_request, response_choice, current_turn):
            tip = self.tokenizer.encode(" wait", add_special_tokens=False)
            infer_request.messages[-1]["content"] += " wait"
            ids = [t for t in response_choice.token_ids if t != self.tokenizer.eos_token_id]
            ids.append(self.tokenizer.eos_token_id)  # the sampled eos, kept inside the message
            return {"infer_request": infer_request, "response_token_ids": ids + tip,
                    "response_loss_mask": [1] * len(ids) + [0] * len(tip)}

        def check_finished(self, infer_request, response_choice, current_turn):
            return current_turn >= 2

    args = GRPOConfig(output_dir=str(tmp_path), reward_funcs=["digits"], num_generations=4, per_device_train_batch_size=8,
                      max_completion_length=4, max_steps=1, save_strategy="no", seed=0, disable_tqdm=True, report_to="none")
    rows = [{"prompt": f"add {i} and {i}", "answer": str(2 * i)} for i in range(8)]
    trainer = GRPOTrainer(tiny_model_dir, args=args, train_dataset=rows, scheduler=KeepsEos())
    micro = trainer._generate_and_score()
    assert trainer._gen_metrics["invariant_violations"] == 8.0 and trainer._gen_metrics["invariant_check_time"] > 0.0
    assert all(int(mb["batch"].completion_mask.sum()) == 0 for mb in micro)  # nothing of them trains
    trajs = trainer.rollout(trainer._next_prompts())
    assert len(trajs) == 8
    assert all(t.status == "failed" and t.reason.startswith("invariant violated by scheduler KeepsEos") for t in trajs)


# --- a prompt is a suffix of its rendering only where rlcore cut it (issue 29's prompt hole) ----------
class PrependsSystem(MultiTurnScheduler):
    """Prepends a system message in on_trajectory_start and leaves the row's prompt_ids (ms-swift's
    GYMScheduler seeds its system prompt this way)."""

    def on_trajectory_start(self, trajectories):
        for t in trajectories:
            t.messages.insert(0, {"role": "system", "content": "Answer in one word."})


async def test_a_prepended_system_message_is_in_the_prompt_tokens(tok: Any) -> None:
    # the tiny ChatML template injects no default system prompt, so the row's prompt tokens are a
    # suffix of the new rendering: they used to be kept (the model never saw the system message)
    msgs = [{"role": "user", "content": "hi"}]
    sampler = ScriptedSampler(["yo"], tok)
    res = await run_rollouts(PrependsSystem(sampler, max_turns=1), [Prompt(msgs, encode_prompt(tok, msgs))], progress=False)
    (t,) = res.trajectories
    want = encode_prompt(tok, [{"role": "system", "content": "Answer in one word."}, *msgs])
    assert t.status == "ok" and t.prompt_ids == want and sampler.calls[0][0] == want
    assert t.infos.get("prompt_reencoded") is True and check_batch([t], tok) == []


async def test_a_suffix_prompt_is_sound_only_when_rlcore_truncated_it(tok: Any) -> None:
    from rlcore.data.cursor import make_prompt

    (t,) = [copy.deepcopy(x) for x in (await sound(tok))[:1]]
    t.messages.insert(0, {"role": "system", "content": "Answer in one word."})  # the tokens never had it
    t.infos["prompt_messages"] = 2
    assert [v.check for v in check_trajectory(t, tok)] == ["prompt"]
    # a prompt rlcore cut to max_prompt_length keeps its last tokens, and that is recorded
    row = {"prompt": [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "what is 2 + 2?"}]}
    full = make_prompt(row, tok, has_prompt=True)
    cut = make_prompt(row, tok, has_prompt=True, max_prompt_length=len(full.prompt_ids) - 3)
    assert full.truncated_tokens == 0 and cut.truncated_tokens == 3 and cut.prompt_ids == full.prompt_ids[3:]
    res = await run_rollouts(AskAgain(ScriptedSampler(["four"], tok), max_turns=1), [cut], progress=False)
    (u,) = res.trajectories
    assert u.status == "ok" and u.prompt_ids == cut.prompt_ids and u.infos["prompt_truncated"] == 3
    assert check_batch([u], tok) == []


async def test_a_truncated_standard_prompt_keeps_its_tokens(tok: Any) -> None:
    # TRL's standard prompt (plain text, no chat template) cut to max_prompt_length: it used to be
    # re-encoded with the chat template before the first turn, whole, so the model sampled from a
    # prompt neither TRL nor max_prompt_length would give it
    from rlcore.data.cursor import make_prompt

    row = {"prompt": "what is 2 + 2 and then what is 3 + 3 and then 4 + 4?"}
    full = make_prompt(row, tok, has_prompt=True)
    cut = make_prompt(row, tok, has_prompt=True, max_prompt_length=len(full.prompt_ids) - 3)
    sampler = ScriptedSampler(["4"], tok)
    res = await run_rollouts(AskAgain(sampler, max_turns=1), [cut], progress=False)
    (t,) = res.trajectories
    assert t.status == "ok" and t.prompt_ids == cut.prompt_ids == sampler.calls[0][0]
    assert "prompt_reencoded" not in t.infos and check_batch([t], tok) == []
    untruncated = copy.deepcopy(t)
    untruncated.infos.pop("prompt_truncated")  # the same tokens without rlcore's record are not the prompt
    assert [v.check for v in check_trajectory(untruncated, tok)] == ["prompt"]


@pytest.mark.parametrize("scheduler", ["single_turn", "multi_turn"])
async def test_a_first_reply_is_checked_as_sampled_after_its_generation_prompt(tok: Any, scheduler: str) -> None:
    """DeepSeek-V3's original template drops the reasoning (up to ``</think>``) of every assistant
    message it renders, the last one too, and its generation prompt opens ``<think>\\n``: a
    single-turn episode of a model that thinks is its prompt then exactly its sampled reply, so it
    is sound; the same episode whose message text is not what the tokens spell is not."""
    from rlcore.rollout import RolloutScheduler
    from rlcore.rollout.tool_parsers import trl_template_dir

    if trl_template_dir() is None:
        pytest.skip("TRL's chat templates are not installed")
    ds = copy.deepcopy(tok)
    ds.chat_template = (trl_template_dir() / "deepseekv3.jinja").read_text(encoding="utf-8")
    msgs = [{"role": "user", "content": "What is 6 times 7?"}]
    sampler = ScriptedSampler(["Six sevens.\n</think>\n\n42"], ds)
    sched = RolloutScheduler(sampler, tokenizer=ds) if scheduler == "single_turn" else \
        MultiTurnScheduler(sampler, tokenizer=ds, max_turns=1)
    res = await run_rollouts(sched, [Prompt(msgs, encode_prompt(ds, msgs))], num_generations=1,
                             sampling_params=SamplingParams(max_tokens=24), progress=False)
    (t,) = res.trajectories
    assert t.status == "ok", t.reason
    assert ds.decode(t.prompt_ids).endswith("<｜Assistant｜><think>\n") and t.messages[-1]["content"].endswith("</think>\n\n42")
    assert check_trajectory(t, ds) == []
    wrong = copy.deepcopy(t)
    wrong.messages[-1]["content"] = "Six sevens.\n</think>\n\n43"
    (v,) = check_trajectory(wrong, ds)
    assert v.check == "tokens", v
