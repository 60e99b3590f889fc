"""examples/gsm8k (seed 001) runs end to end on the CPU with the tiny model for two steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rlcore.testing import load_script

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = REPO_ROOT / "examples" / "gsm8k"


@pytest.fixture
def rlcore_plugins() -> str:
    return "rl-plugin-math"  # the example's rewards (gsm8k_accuracy, gsm8k_format)


@pytest.fixture(scope="module")
def gsm8k_rows(shared_data: Path) -> list[dict[str, Any]]:
    """The first eight rows of GSM8K's test split, read from the shared data folder."""
    path = shared_data / "gsm8k" / "test.jsonl"
    assert path.is_file(), f"the shared data folder {shared_data} has no gsm8k/test.jsonl"
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f.readlines()[:8]]


def _example_module() -> Any:
    return load_script(EXAMPLE / "train.py", "gsm8k_example_train")


def test_config_is_the_seed_001_recipe() -> None:
    cfg = _example_module().load_config(bf16=False)  # bf16 needs a GPU to validate
    assert cfg["reward_funcs"] == ["gsm8k_accuracy", "gsm8k_format"]
    assert cfg["num_generations"] == 8 and cfg["loss_type"] == "grpo" and cfg["epsilon"] == 0.2
    from rlcore.trainer.grpo import GRPOConfig

    run = {k: cfg.pop(k) for k in ("model", "dataset", "prompt_column", "system_prompt")}
    args = GRPOConfig(**cfg)  # every other key is a valid GRPOConfig field with a valid value
    assert args.prompts_per_generation * args.num_generations == args.generation_batch_size
    assert run["prompt_column"] == "question" and "####" in run["system_prompt"]


@pytest.mark.timeout(300)
def test_example_trains_two_steps_on_cpu(tiny_model_dir: str, gsm8k_rows, tmp_path: Path) -> None:
    rows = tmp_path / "gsm8k_few.jsonl"  # a few real rows, in the test's temp dir only
    rows.write_text("".join(json.dumps(r) + "\n" for r in gsm8k_rows[:4]), encoding="utf-8")
    example = _example_module()
    cfg = example.load_config(
        model=tiny_model_dir, dataset=str(rows), output_dir=str(tmp_path / "run"),
        max_steps=2, max_completion_length=8, max_prompt_length=256,
        per_device_train_batch_size=8, gradient_accumulation_steps=1,  # one prompt x 8 per step
        bf16=False, activation_checkpointing=False, warmup_steps=0, save_steps=1000,
        learning_rate=1e-4, plots=False, disable_tqdm=True,
    )
    trainer = example.train(cfg)
    assert trainer.state.global_step == 2
    assert [r.name for r in trainer.reward_objects] == ["gsm8k_accuracy", "gsm8k_format"]
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert logged and all("rewards/gsm8k_accuracy" in r and "rewards/gsm8k_format" in r for r in logged)


@pytest.mark.timeout(300)
def test_example_config_through_rlcore_train(tiny_model_dir: str, gsm8k_rows, tmp_path: Path, capsys) -> None:
    """The documented command, ``rlcore train --config examples/gsm8k/config.yaml``, with CPU overrides."""
    from rlcore.commands.cli import main

    rows = tmp_path / "gsm8k_few.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in gsm8k_rows[4:8]), encoding="utf-8")
    out = tmp_path / "cli-run"
    argv = [
        "train", "--config", str(EXAMPLE / "config.yaml"), "--model", tiny_model_dir, "--dataset", str(rows),
        "--output_dir", str(out), "--max_steps", "2", "--max_completion_length", "8", "--max_prompt_length", "256",
        "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "1", "--bf16", "false",
        "--activation_checkpointing", "false", "--warmup_steps", "0", "--save_strategy", "no",
        "--plots", "false", "--disable_tqdm", "true",
    ]
    main(argv)  # the console script's entry: a user error would exit 2 with one line
    printed = capsys.readouterr().out
    assert "gsm8k_accuracy, gsm8k_format" in printed and "loss grpo" in printed
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in logged if "rewards/gsm8k_accuracy" in r]
    assert len(steps) == 2 and all("rewards/gsm8k_format" in r for r in steps)
