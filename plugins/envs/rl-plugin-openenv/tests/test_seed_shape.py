"""The seeds' setup on the CPU (#29): a model under Qwen3.5's thinking template (TRL's original
``qwen3_5_think.jinja``, read from the installed TRL), multi-turn against a real OpenEnv
``guess_number`` server on 127.0.0.1, six turns an episode.

* tools: a model that thinks, then calls the env's ``guess`` tool in Qwen3.5's XML format, found by
  ``tool_parser`` auto (scripted replies on SmolLM2's real tokenizer);
* the real tiny model and the real SmolLM2 model sampling every turn (``openenv_scheduler``, a
  reply is the guess), their packed rows rescored by the model: every trained token keeps the
  sampler's logprob;
* ``rlcore train --scheduler openenv_scheduler --chat-template qwen3_5_think.jinja``.

Each run sets up its template as the trainer does (:func:`rlcore.chat_template.prepare_multi_turn`,
``auto``), so the rows are one sequence per episode under TRL's training template."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import rlcore
from rlcore.chat_template import chat_template_override, prepare_multi_turn
from rlcore.commands.cli import main
from rlcore.loop.loss import pack
from rlcore.rollout import check_batch, run_rollouts
from rlcore.testing import ScriptedSampler
from rlcore.testing.multi_turn import RecordingSampler, assert_rows_are_sampler_calls
from rlcore.types import Prompt, SamplingParams

SERVER_OPTIONS = {"max_concurrent_envs": 8}
TURNS = 6


def qwen35_think() -> Path:
    import trl

    return Path(trl.__file__).parent / "chat_templates" / "qwen3_5_think.jinja"


def under_qwen35(tok: Any) -> Any:
    tok = copy.deepcopy(tok)
    tok.chat_template = qwen35_think().read_text()
    note = prepare_multi_turn(tok, "auto")
    assert "TRL's prefix-preserving training template" in note and chat_template_override(tok), note
    return tok


def episodes(n: int, target: int = 737) -> list[Prompt]:
    reset = {"low": 1, "high": 1000, "target": target, "max_attempts": TURNS + 2, "reply": "number", "shaped": True}
    return [Prompt([], [], data={"env_config": {"reset_kwargs": reset}}) for _ in range(n)]


@pytest.mark.real_model
async def test_thinking_tool_calls_for_six_turns(server: str, smollm2_tokenizer: Any) -> None:
    tok = under_qwen35(smollm2_tokenizer)
    guesses = iter(range(100, 100 + 10 * 100, 100))

    def respond(prompt_ids: list[int], params: Any, index: int) -> str:
        n = next(guesses)
        return (f"The target is above what I tried; try {n}.\n</think>\n\n<tool_call>\n<function=guess>\n"
                f"<parameter=guess>\n{n}\n</parameter>\n</function>\n</tool_call>")

    sampler = RecordingSampler(ScriptedSampler(tokenizer=tok, respond=respond))
    sched = rlcore.get("scheduler", "openenv_tool_scheduler")(sampler, tokenizer=tok, env_url=server, max_turns=TURNS)
    res = await run_rollouts(sched, episodes(1), sampling_params=SamplingParams(max_tokens=96), progress=False)
    await sched.close()
    (t,) = res.trajectories
    assert t.status == "ok" and t.num_turns == TURNS, (t.status, t.reason, t.num_turns)
    assert t.infos["tool_calls"] == TURNS and t.infos.get("tool_errors", 0) == 0, t.infos
    tool_msgs = [m for m in t.messages if m["role"] == "tool"]
    # the sixth call ends the episode at max_turns: its answer is not appended
    assert len(tool_msgs) == TURNS - 1 and all("too low" in m["content"] for m in tool_msgs), tool_msgs
    assert not t.has_turn_samples  # TRL's training template keeps earlier turns' reasoning: one sequence
    assert not check_batch([t], tok, tools=sched.tools)
    assert assert_rows_are_sampler_calls([t], sampler.records, tok, tools=sched.tools) == 1


async def _rescored(sampler: Any, tok: Any, server: str, model: Any) -> None:
    rec = RecordingSampler(sampler)
    sched = rlcore.get("scheduler", "openenv_scheduler")(rec, tokenizer=tok, env_url=server, max_turns=TURNS,
                                                          stop_on_truncation=False)
    res = await run_rollouts(sched, episodes(2), num_generations=2,
                             sampling_params=SamplingParams(max_tokens=6, temperature=1.0), progress=False)
    await sched.close()
    trajs = res.trajectories
    assert res.stats["failed"] == 0, res.stats["failure_reasons"]
    assert all(t.num_turns == TURNS for t in trajs), [t.num_turns for t in trajs]
    assert not check_batch(trajs, tok)
    assert_rows_are_sampler_calls(trajs, rec.records, tok)
    batch = pack(trajs, [0.0] * len(trajs), tok.pad_token_id)
    from rlcore.algorithms.logprobs import completion_logprobs

    with torch.no_grad():
        logps, _ = completion_logprobs(model, batch.input_ids, batch.attention_mask, batch.completion_mask)
    on = batch.completion_mask.bool()
    assert on.sum() > 0 and torch.allclose(logps[on], batch.sampler_logps[on], atol=1e-4), \
        (logps[on] - batch.sampler_logps[on]).abs().max()


async def test_the_tiny_model_plays_six_turns_under_qwen35(server: str, tiny_tokenizer: Any, tiny_hf_sampler: Any) -> None:
    await _rescored(tiny_hf_sampler, under_qwen35(tiny_tokenizer), server, tiny_hf_sampler.model)


@pytest.mark.real_model
async def test_smollm2_plays_six_turns_under_qwen35(server: str, smollm2_tokenizer: Any, smollm2_hf_sampler: Any) -> None:
    await _rescored(smollm2_hf_sampler, under_qwen35(smollm2_tokenizer), server, smollm2_hf_sampler.model)


def test_rlcore_train_under_qwen35(server: str, tiny_model_dir: str, tmp_path: Path, capsys: Any,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(e.data) + "\n" for e in episodes(2)))
    out = tmp_path / "run"
    main(["train", "--model", tiny_model_dir, "--scheduler", "openenv_scheduler", "--env-url", server,
          "--dataset", str(rows), "--reward", "openenv_reward", "--chat-template", str(qwen35_think()),
          "--max-turns", str(TURNS), "--stop-on-truncation", "false", "--max-steps", "2", "--num-generations", "2",
          "--max-completion-length", "6", "--plots", "false", "--output-dir", str(out)])
    shown = capsys.readouterr().out
    assert "multi-turn  auto: one sequence per episode, TRL's prefix-preserving training template" in shown, shown
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 2 and all(s["failed_trajectories"] == 0 and s["num_turns"] == TURNS for s in steps), \
        [{k: s.get(k) for k in ("failed_trajectories", "num_turns", "episodes", "samples")} for s in steps]
    # a random model's replies rarely close their <think>: the template renders such a reply
    # otherwise than sampled, so the turn after it is a sample of its own
    assert all(s["samples"] >= s["episodes"] for s in steps)
