"""examples/reasoning_gym: its config is a valid run and ``rlcore train --config`` trains two steps on
the CPU with the tiny model (the example lives in the repository, so its test does too)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "reasoning_gym" / "config.yaml"


@pytest.fixture
def rlcore_plugins() -> str:
    return "rl-plugin-reasoning-gym"  # the example's dataset source and rewards


def test_example_config_is_valid() -> None:
    from rlcore.trainer.grpo import GRPOConfig

    cfg = yaml.safe_load(EXAMPLE.read_text())
    assert cfg["dataset"].startswith("reasoning_gym:") and cfg["reward_funcs"] == ["reasoning_gym", "reasoning_gym_format"]
    run = {k: cfg.pop(k) for k in ("model", "dataset", "dataset_options") if k in cfg}
    cfg["bf16"] = False  # needs a GPU to validate
    GRPOConfig(**cfg)  # every other key is a valid GRPOConfig field
    from rlcore.data import load_rows

    rows = load_rows(run["dataset"], options=run.get("dataset_options"))
    assert len(rows) == run.get("dataset_options", {}).get("size", 500)


@pytest.mark.timeout(600)
def test_two_step_rlcore_train_with_the_example_config(tiny_model_dir: str, tmp_path: Path, capsys) -> None:
    from rlcore.commands.cli import main

    out = tmp_path / "run"
    argv = [
        "train", "--config", str(EXAMPLE), "--model", tiny_model_dir,
        "--dataset-options", "size=16,seed=1,system_prompt=none",  # short prompts for the tiny model
        "--output_dir", str(out), "--max_steps", "2", "--max_completion_length", "8", "--max_prompt_length", "128",
        "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "1", "--num_generations", "4",
        "--bf16", "false", "--activation_checkpointing", "false", "--warmup_steps", "0", "--save_strategy", "no",
        "--plots", "false", "--disable_tqdm", "true",
    ]
    main(argv)
    printed = capsys.readouterr().out
    assert "reasoning_gym:leg_counting" in printed and "(16 prompts)" in printed
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in logged if "rewards/reasoning_gym" in r]
    assert len(steps) == 2 and all("rewards/reasoning_gym_format" in r for r in steps)
