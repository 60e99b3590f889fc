"""Issue 35 item 1: the plots at the end of training are a courtesy. A plot that cannot be drawn
or written (a file where ``plots/`` goes, a bad ``MPLBACKEND``) is one warning line; the final model
is still exported, and an error the run stopped with stays the error the user sees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rlcore.errors import RewardFunctionError
from rlcore.data.tasks import digits_dataset
from rlcore.trainer.grpo import GRPOConfig, GRPOTrainer


def test_a_file_where_the_plots_go_costs_neither_the_model_nor_the_run(tmp_path: Path, capsys: Any, caplog: Any) -> None:
    """Before: every step logged, then FileExistsError from write_plots in train()'s ``finally``;
    model.safetensors, config.json and the tokenizer were never written."""
    from rlcore.commands.cli import main

    out = tmp_path / "D"
    out.mkdir()
    (out / "plots").write_text("x")
    main(["train", "--max_steps", "2", "--save_strategy", "steps", "--save_steps", "100", "--output_dir", str(out)])
    captured = capsys.readouterr()
    for name in ("model.safetensors", "config.json", "tokenizer_config.json"):
        assert (out / name).is_file(), name
    assert (out / "plots").read_text() == "x"  # the user's file is left alone
    lines = [r.getMessage() for r in caplog.records if "could not write the plots" in r.getMessage()]
    assert lines == [f"could not write the plots to {out / 'plots'}: FileExistsError: [Errno 17] File exists: "
                     f"'{out / 'plots'}' (the run is unaffected; metrics.jsonl has every value)"]
    assert "done" in captured.out and "Traceback" not in captured.err


def test_an_error_the_run_stopped_with_is_not_replaced_by_a_plot_error(tmp_path: Path, tiny_model_dir: str) -> None:
    """Before: the plot's FileExistsError (raised in ``finally``) replaced the reward's error."""
    calls = {"n": 0}

    def breaks_later(completions: list[str]) -> list[float]:
        calls["n"] += 1
        if calls["n"] > 1:  # the first step is logged, so there is something to plot
            raise KeyError("solution")
        return [1.0 if c.strip()[:1] == "1" else 0.0 for c in completions]

    (tmp_path / "plots").write_text("x")
    args = GRPOConfig(output_dir=str(tmp_path), reward_funcs=[], num_generations=4, per_device_train_batch_size=8,
                      max_completion_length=4, max_steps=3, save_strategy="no", seed=0, disable_tqdm=True,
                      report_to="none", plots=True)
    trainer = GRPOTrainer(tiny_model_dir, breaks_later, args=args, train_dataset=digits_dataset(16))
    with pytest.raises(RewardFunctionError, match="raised on all 8 samples"):
        trainer.train()
    assert trainer.state.global_step == 1 and trainer.plot_paths == []


def test_a_bad_mplbackend_in_the_environment_still_draws_the_plots(tmp_path: Path) -> None:
    """Before: ``MPLBACKEND=nosuchbackend`` failed matplotlib's import (ValueError) at the end of
    training. The plots are always drawn with Agg, so they are written. A fresh interpreter: this
    process may have imported matplotlib already."""
    rows = [{"step": s, "reward": 0.1 * s, "reward_std": 0.05, "completions/mean_length": 4.0,
             "completions/max_length": 5.0, "num_turns": 1.0} for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = ("import sys; from rlcore.training.plots import write_plots; print(write_plots(sys.argv[1])); "
            "import os; print(os.environ['MPLBACKEND'])")
    env = {**os.environ, "MPLBACKEND": "nosuchbackend"}
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "plots" / "reward.png").stat().st_size > 0
    assert (tmp_path / "plots" / "completion_length.png").stat().st_size > 0
    assert res.stdout.splitlines()[-1] == "nosuchbackend"  # the user's environment is given back as it was
