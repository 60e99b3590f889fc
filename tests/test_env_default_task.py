"""`rlcore train --scheduler env_scheduler --env NAME` with no dataset (issue 34, point 5): it used the
digits task — a header claiming `task digits … made-up sums` while the env's observations replaced
the prompts — and its 8-token replies, cut by length, ended every episode at turn 1 (`env done 0% ·
max_turns 0% · length 100%`): the env never received a step. Now an env scheduler without a default
of its own plays the env's episodes, and a cut reply still goes to the env."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rlcore.commands.cli import main
from rlcore.testing.packages import load_in_process
from rlcore.testing.multi_turn import DigitRounds
from rlcore.commands.train import build_plan


@pytest.fixture
def three_rounds_env(monkeypatch: pytest.MonkeyPatch) -> str:
    load_in_process(monkeypatch, "three_rounds_env_plugin", register_envs=lambda register: register("three_rounds_t", DigitRounds))
    return "three_rounds_t"


def test_the_env_default_plays_the_envs_episodes(three_rounds_env: str, tmp_path: Any) -> None:
    plan = build_plan(["--scheduler", "env_scheduler", "--env", three_rounds_env, "--output-dir", str(tmp_path / "a")])
    assert plan.task == "env-episodes" and "digits" not in plan.task_description
    assert all("env_config" in row for row in plan.rows)
    assert plan.args.reward_funcs == ["env_reward"] and plan.args.max_turns == 4
    assert plan.component_options["scheduler"]["stop_on_truncation"] is False
    # a dataset replaces the whole default, as for every scheduler
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "go"}\n')
    plan = build_plan(["--scheduler", "env_scheduler", "--env", three_rounds_env, "--dataset", str(rows),
                       "--reward", "env_reward", "--output-dir", str(tmp_path / "b")])
    assert "stop_on_truncation" not in plan.component_options["scheduler"]


def test_train_plays_whole_episodes(three_rounds_env: str, tmp_path: Any, capsys: Any,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    out = tmp_path / "run"
    main(["train", "--scheduler", "env_scheduler", "--env", three_rounds_env, "--reward", "env_reward",
          "--max_steps", "2", "--output-dir", str(out)])
    shown = capsys.readouterr().out
    assert "task      env-episodes" in shown and "made-up sums" not in shown
    rows = [json.loads(line) for line in open(out / "metrics.jsonl", encoding="utf-8")]
    assert all(r["num_turns"] == 3 and r["episodes_ended/env_done"] == 1.0 for r in rows), rows
    assert "env done 100%" in shown


def test_rollout_plays_whole_episodes_too(three_rounds_env: str, tmp_path: Any) -> None:
    out = tmp_path / "episodes.jsonl"
    main(["rollout", "--scheduler", "env_scheduler", "--env", three_rounds_env, "--num-generations", "2",
          "--limit", "2", "--no-progress", "-o", str(out)])
    episodes = [json.loads(line) for line in open(out, encoding="utf-8")]
    assert len(episodes) == 4 and all(e["num_turns"] == 3 for e in episodes), [e.get("num_turns") for e in episodes]
