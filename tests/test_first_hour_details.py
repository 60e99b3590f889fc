"""The smaller things a new user met in the first hour (issue 34, point 9): the header's counts read
as English, `--log_completions` numbers steps as the bar and metrics.jsonl do, `--use_peft` warns
about nothing of ours, and `rlcore components` lists the aliases the README uses."""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import pytest

from rlcore.commands.cli import main


def test_header_counts_and_logged_completion_steps(tmp_path: Any, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: `1 prompts × 8 generations · 8 tokens max · 1 steps`, and `[step 0]` printed beside the
    bar's step 1 (completions.jsonl said step 0 too)."""
    monkeypatch.setenv("COLUMNS", "300")
    out_dir = tmp_path / "run"
    main(["train", "--max_steps", "1", "--per_device_train_batch_size", "8", "--log_completions", "true",
          "--num_completions_to_print", "1", "--output-dir", str(out_dir)])
    out = capsys.readouterr().out
    assert "1 prompt × 8 generations · 8 tokens max · 1 step" in out and "1 prompts" not in out and "1 steps" not in out
    assert "[step 1] reward=" in out and "[step 0]" not in out
    logged = [json.loads(line) for line in open(out_dir / "completions.jsonl", encoding="utf-8")]
    metrics = [json.loads(line) for line in open(out_dir / "metrics.jsonl", encoding="utf-8")]
    assert {r["step"] for r in logged} == {m["step"] for m in metrics} == {1}


def test_use_peft_warns_about_nothing(tiny_model_dir: str, tmp_path: Any) -> None:
    """peft read transformers' deprecated `is_gradient_checkpointing`: a FutureWarning on every LoRA run."""
    from transformers import AutoModelForCausalLM

    from rlcore import GRPOConfig
    from rlcore.training.components import apply_peft, load_model

    args = GRPOConfig(output_dir=str(tmp_path / "o"), use_peft=True, report_to="none")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wrapped = apply_peft(model, args)
    assert hasattr(wrapped, "peft_config")
    wrapped.save_pretrained(str(tmp_path / "adapter"))  # what a --use_peft run writes, trained further as --model
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = load_model(str(tmp_path / "adapter"), GRPOConfig(output_dir=str(tmp_path / "p"), report_to="none"))
    assert hasattr(again, "peft_config")


def test_components_lists_the_aliases_the_readme_uses(capsys: Any) -> None:
    """The README says `openai`/`vllm_server`; `rlcore components` showed `hf, openai, vllm`."""
    main(["components", "sampler"])
    out = capsys.readouterr().out
    assert "openai (alias vllm_server)" in out, out
    assert os.path.exists(os.path.join(os.path.dirname(__file__), "..", "README.md"))
    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md"), encoding="utf-8").read()
    assert "`vllm_server`" in readme
