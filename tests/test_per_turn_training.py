"""Per-turn samples through the trainer, the loop API and the CLI (#29 item 1).

The template here renders a header that counts the messages, so every longer conversation
rewrites the start of the shorter one: no turn after the first can be appended token-exactly.
Under ``multi_turn_mode="auto"`` (the default) each such turn is a sample of its own. What must
hold: the real tiny model, scoring the rows the trainer packs, gives every trained token the
logprob the sampler reported for it (so each row is exactly what the model was given and
sampled); a run trains on them; the run says what it did; its logs show the samples."""

from __future__ import annotations

import asyncio
import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from rlcore.chat_template import set_multi_turn_mode
from rlcore.commands.cli import main
from rlcore.rollout import check_batch, encode_prompt, run_rollouts
from rlcore.testing.multi_turn import AskAgain, DigitRounds
from rlcore.testing.packages import load_in_process
from rlcore.types import Prompt, SamplingParams

COUNTING = "{{ messages | length }} messages\n"


def counting_tokenizer(tiny_tokenizer: Any) -> Any:
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = COUNTING + tiny_tokenizer.chat_template
    return tok


def test_the_model_scores_each_per_turn_row_as_sampled(tiny_model_dir: str, tiny_tokenizer: Any,
                                                       tiny_hf_sampler: Any) -> None:
    from rlcore.loop import Policy
    from rlcore.loop.loss import pack

    tok = counting_tokenizer(tiny_tokenizer)
    msgs = [{"role": "user", "content": "count with me"}]
    res = asyncio.run(run_rollouts(AskAgain(tiny_hf_sampler, tokenizer=tok, max_turns=3),
                                   [Prompt(msgs, encode_prompt(tok, msgs))], num_generations=4,
                                   sampling_params=SamplingParams(max_tokens=6, temperature=1.0), progress=False))
    trajs = [t for t in res.trajectories if t.status != "failed"]
    assert len(trajs) == 4 and not check_batch(trajs, tok)
    assert all(t.has_turn_samples and len(t.turn_samples()) == t.num_turns for t in trajs)
    assert all(t.num_turns == 3 for t in trajs)
    policy = Policy(tiny_model_dir, tok, loss="grpo", learning_rate=1e-3)
    batch = pack(trajs, [1.0, -1.0, 0.5, -0.5], policy.pad_token_id)
    assert batch.size == sum(t.num_turns for t in trajs)
    got = policy.logprobs(trajs)  # packs the same rows
    on = batch.completion_mask.bool()
    assert torch.allclose(got[on], batch.sampler_logps[on], atol=1e-4), (got[on] - batch.sampler_logps[on]).abs().max()
    before = [p.detach().clone() for p in policy.model.parameters()]
    out = policy.forward_backward(trajs, [1.0, -1.0, 0.5, -0.5])
    policy.clip_grad_and_step()
    assert math.isfinite(out["loss"]) and out["num_tokens"] == float(on.sum())
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))


def test_append_mode_fails_these_trajectories_loudly(tiny_tokenizer: Any, tiny_hf_sampler: Any) -> None:
    tok = counting_tokenizer(tiny_tokenizer)
    set_multi_turn_mode(tok, "append")
    msgs = [{"role": "user", "content": "count with me"}]
    res = asyncio.run(run_rollouts(AskAgain(tiny_hf_sampler, tokenizer=tok, max_turns=3),
                                   [Prompt(msgs, encode_prompt(tok, msgs))], num_generations=2,
                                   sampling_params=SamplingParams(max_tokens=4, min_tokens=4, temperature=1.0),
                                   progress=False))
    assert all(t.status == "failed" and "not prefix-preserving" in t.reason and "multi_turn_mode auto" in t.reason
               for t in res.trajectories), [t.reason for t in res.trajectories]


@pytest.fixture
def rounds_env(monkeypatch: pytest.MonkeyPatch) -> str:
    load_in_process(monkeypatch, "per_turn_rounds_env_plugin", register_envs=lambda register: register("per_turn_rounds", DigitRounds))
    return "per_turn_rounds"


def test_rlcore_train_with_a_template_that_rewrites_history(rounds_env: str, tiny_tokenizer: Any, tmp_path: Path,
                                                            capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    template = tmp_path / "counting.jinja"
    template.write_text(COUNTING + tiny_tokenizer.chat_template)
    out = tmp_path / "run"
    main(["train", "--scheduler", "env_scheduler", "--env", rounds_env, "--reward", "env_reward", "--max_steps", "2",
          "--chat-template", str(template), "--log_completions", "true", "--save_steps", "100", "--output-dir", str(out)])
    shown = capsys.readouterr().out
    assert "multi-turn  auto: a sample per turn where the chat template" in shown, shown
    rows = [json.loads(line) for line in open(out / "metrics.jsonl", encoding="utf-8")]
    assert len(rows) == 2 and all(r["failed_trajectories"] == 0 for r in rows), rows
    assert all(r["samples"] == r["episodes"] * r["num_turns"] and r["num_turns"] == 3 for r in rows), rows
    assert all(math.isfinite(r["loss"]) for r in rows)
    logged = [json.loads(line) for line in open(out / "completions.jsonl", encoding="utf-8")]
    assert logged and all(len(r["samples"]) == 3 and r["samples"][1]["prompt_tokens"] > r["samples"][0]["prompt_tokens"]
                          for r in logged), logged[0]
    # the saved model keeps its own template: --chat-template shaped the run, not the model
    jinja = out / "chat_template.jinja"
    saved = jinja.read_text() if jinja.exists() else json.loads((out / "tokenizer_config.json").read_text())["chat_template"]
    assert saved == tiny_tokenizer.chat_template


def test_rlcore_rollout_and_check_rollouts_with_that_template(rounds_env: str, tiny_tokenizer: Any, tmp_path: Path,
                                                              capsys: Any) -> None:
    template = tmp_path / "counting.jinja"
    template.write_text(COUNTING + tiny_tokenizer.chat_template)
    out = tmp_path / "r.jsonl"
    main(["rollout", "--scheduler", "env_scheduler", "--env", rounds_env, "--num-generations", "2", "--limit", "1",
          "--chat-template", str(template), "--no-progress", "-o", str(out)])
    assert "multi-turn  auto: a sample per turn where the chat template" in capsys.readouterr().err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and all(r["status"] != "failed" for r in rows), [r.get("reason") for r in rows]
    assert all([t["role"] for t in r["turns"]].count("prompt") == r["num_turns"] - 1 for r in rows), rows[0]["turns"]
    main(["check-rollouts", str(out), "--chat-template", str(template)])  # held to the same template
    assert "2 sound, 0 with violations" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # and to the tokenizer's own, the prompts are not its rendering
        main(["check-rollouts", str(out)])
    assert exc.value.code == 1
