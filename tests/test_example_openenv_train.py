"""Rewards from a real OpenEnv server flow into training: a few `rlcore train --scheduler
openenv_scheduler --env-url …` steps with the offline tiny model, from the example config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlcore.commands.cli import main

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "openenv" / "config.yaml"


@pytest.fixture
def rlcore_plugins() -> str:
    return "rl-plugin-openenv"  # the example's env client and scheduler


@pytest.fixture(scope="module")
def server():
    """A guess_number server on 127.0.0.1 (a free port) serving eight sessions."""
    from rl_plugin_openenv.server import ServerThread

    with ServerThread(max_concurrent_envs=8) as url:
        yield url


def test_train_steps_on_env_rewards(server, tiny_model_dir, tmp_path):
    rows = tmp_path / "rows.jsonl"
    with rows.open("w") as f:
        for i in range(4):  # shaped: any in-range number earns partial credit, so a random policy has signal
            f.write(json.dumps({"env_config": {"seed": i, "reset_kwargs": {"shaped": True, "max_attempts": 3}}}) + "\n")
    out = tmp_path / "run"
    main([
        "train", "--config", str(EXAMPLE), "--model", tiny_model_dir, "--dataset", str(rows),
        "--env-url", server, "--max-turns", "3",
        "--max-steps", "3", "--num-generations", "4", "--per-device-train-batch-size", "8",
        "--gradient-accumulation-steps", "1", "--max-completion-length", "6", "--learning-rate", "1e-3",
        "--bf16", "false", "--plots", "false", "--output-dir", str(out),
    ])
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 3
    assert all(s["failed_trajectories"] == 0 for s in steps)
    assert all(s["num_turns"] > 1 for s in steps)  # multi-turn episodes
    signal = [s for s in steps if s["reward_std"] > 0]
    assert signal, "the environment's rewards never varied within a group"
    assert all(0 < s["rewards/openenv_reward"] <= 3.0 for s in signal)
    assert any(s["grad_norm"] > 0 for s in signal)  # the env reward moved the policy


def test_tiny_example_config_runs_multi_turn(server, tiny_model_dir, tmp_path, monkeypatch):
    """examples/openenv/tiny.yaml — the example's rows with the tiny-model recipe — as a user runs
    it (no --model: the built-in tiny model), cut to two steps: multi-turn episodes that the env
    ends, turns ended by the stop string, not by the token cap."""
    tiny = EXAMPLE.with_name("tiny.yaml")
    monkeypatch.chdir(EXAMPLE.parents[2])  # the documented command runs from the repository root (relative dataset path)
    out = tmp_path / "run"
    main(["train", "--config", str(tiny), "--env-url", server, "--max-steps", "2", "--per-device-train-batch-size", "8",
          "--plots", "false", "--output-dir", str(out)])
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 2
    assert all(s["failed_trajectories"] == 0 for s in steps)
    assert all(s["num_turns"] >= 2 for s in steps)
    assert all(s.get("episodes_ended/length", 0.0) == 0.0 for s in steps)
