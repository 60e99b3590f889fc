"""A run that cannot learn says why (issue 34, point 1): no reward spread in any group, every reward
identical, every completion cut at the length cap, rewards that raise — in the summary and, after a
few steps, above the progress bar; one line each, with likely causes and what to try."""

from __future__ import annotations

import json
import types
from typing import Any, Callable

import pytest

from rlcore.commands.cli import main
from rlcore.training.diagnosis import diagnose


def _register(monkeypatch: pytest.MonkeyPatch, name: str, fn: Callable[..., Any]) -> None:
    from rlcore.testing.packages import load_in_process

    load_in_process(monkeypatch, f"{name}_plugin", register_rewards=lambda register: register(name, fn))


def _train(tmp_path: Any, reward: str, *extra: str) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n" for i in range(8)))
    main(["train", "--dataset", str(rows), "--reward", reward, "--max_steps", "3", "--num_generations", "4",
          "--per_device_train_batch_size", "8", "--max_completion_length", "4", "--output-dir", str(tmp_path / "run"),
          "--save-strategy", "no", *extra])


def _summary(out: str) -> str:
    return out[out.index("done"):]


def test_a_reward_that_never_fires_says_why_in_the_summary_and_above_the_bar(
        tmp_path: Any, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: `reward (first 10% → last 10%) │ 0.000 → 0.000` and nothing else."""
    def never_t(completions: list[str]) -> list[float]:
        return [0.0] * len(completions)

    _register(monkeypatch, "never_t", never_t)
    _train(tmp_path, "never_t", "--disable_tqdm", "false")  # the bar (pytest's logging level turns it off)
    out = capsys.readouterr().out
    before, summary = out[:out.index("done")], _summary(out)
    assert "⚠ no learning signal: every completion scored 0.000 in all 3 steps" in " ".join(before.split())
    flat = " ".join(summary.replace("│", " ").split())
    assert "why no learning" in flat
    for needle in ("every completion scored 0.000", "the reward never fires", "max_completion_length=4",
                   "--max-completion-length 16", "--system-prompt", "a denser reward"):
        assert needle in flat, (needle, summary)


def test_groups_without_spread_are_named_with_what_to_try(tmp_path: Any, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rewards differ between prompts but never within a group: advantages are all 0."""
    def per_prompt_t(completions: list[str], answer: list[str]) -> list[float]:
        return [float(int(a) % 3) for a in answer]

    _register(monkeypatch, "per_prompt_t", per_prompt_t)
    _train(tmp_path, "per_prompt_t")
    flat = " ".join(_summary(capsys.readouterr().out).replace("│", " ").split())
    assert "no group of completions had any reward spread in all 3 steps" in flat, flat
    assert "advantage_zero_std_frac 1.0" in flat and "--num-generations (now 4)" in flat


def test_rewards_that_raise_on_some_samples_are_in_the_summary(tmp_path: Any, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def half_broken_t(completions: list[str], answer: list[str]) -> list[float]:
        if len(completions) > 1 or int(answer[0]) % 4 == 0:
            raise ValueError("cannot parse")
        return [float(len(completions[0]) % 3)]

    _register(monkeypatch, "half_broken_t", half_broken_t)
    _train(tmp_path, "half_broken_t")
    flat = " ".join(_summary(capsys.readouterr().out).replace("│", " ").split())
    assert "reward errors: reward 'half_broken_t' raised on" in flat and "reward_errors/half_broken_t" in flat, flat


def _row(**over: float) -> dict[str, float]:
    row = {"reward": 0.4, "reward_std": 0.2, "advantage_zero_std_frac": 0.25, "completions/clipped_ratio": 0.3,
           "reward_errors/acc": 0.0}
    row.update(over)
    return row


def test_a_run_with_a_signal_gets_no_verdict() -> None:
    assert diagnose([_row()] * 5) == []
    # the built-in digits task learns with every completion at its 8-token cap: truncation alone is no verdict
    assert diagnose([_row(**{"completions/clipped_ratio": 1.0})] * 5) == []
    # a signal in one step is a signal: the verdict needs the sign in every step
    assert diagnose([_row(advantage_zero_std_frac=1.0)] * 4 + [_row()]) == []
    assert diagnose([_row(advantage_zero_std_frac=1.0)] * 2, min_steps=3) == []  # too early for the bar
    assert diagnose([{"step": 3, "eval_reward": 0.0}]) == []  # evaluation records are not training steps


def test_all_truncated_is_named_as_the_cause_of_no_spread() -> None:
    args = types.SimpleNamespace(max_completion_length=64, num_generations=4)
    rows = [_row(reward=0.0, reward_std=0.0, advantage_zero_std_frac=1.0, **{"completions/clipped_ratio": 1.0})] * 2
    (line,) = diagnose(rows, args)
    assert line.startswith("no learning signal: every completion scored 0.000 in all 2 steps")
    assert "every completion hit the length cap (max_completion_length=64, clipped_ratio 1.0)" in line
    assert "--max-completion-length 256" in line and "\n" not in line
