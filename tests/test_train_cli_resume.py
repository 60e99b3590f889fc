"""Checkpoints do what the flags say (issue 34, points 2-3): `--save-steps N` under a recipe that saves
nothing saves by steps; a resume names a checkpoint that exists (one line, before anything is
loaded or written, nothing left behind); the resumed run's header says from which step; a tied
head resumes without transformers' `missing keys ['lm_head.weight']`."""

from __future__ import annotations

import os
from typing import Any

import pytest

from rlcore.commands.cli import main
from rlcore.testing.cli_checks import fails_before_model_load
from rlcore.commands.train import build_plan


def test_save_settings_without_a_strategy_save_by_steps(tmp_path: Any) -> None:
    """The embedded recipe has save_strategy no: `--save-steps 2` wrote nothing and said nothing."""
    for flags in (["--save-steps", "2"], ["--save_total_limit", "1"], ["--save-only-model", "true"]):
        plan = build_plan([*flags, "--output-dir", str(tmp_path / flags[0])])
        assert str(plan.args.save_strategy.value) == "steps", flags
    # a strategy the user named stays as it is
    plan = build_plan(["--save-steps", "2", "--save-strategy", "no", "--output-dir", str(tmp_path / "named")])
    assert str(plan.args.save_strategy.value) == "no"


def test_a_missing_checkpoint_is_one_line_and_leaves_nothing_behind(
        tmp_path: Any, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: a 34-line `ValueError: Can't find a valid checkpoint` after the model loaded, and an
    `rlcore_run.json` left in NEW that refused the next plain run there; for a checkpoint-4 that
    does not exist in a run's directory, `… was written by a run without a run id …`."""
    new = tmp_path / "new"
    err = fails_before_model_load(["--output-dir", str(new), "--resume-from-checkpoint", "/nowhere/checkpoint-9"],
                                      capsys, monkeypatch)
    assert err.startswith("Error: no such checkpoint: /nowhere/checkpoint-9"), err
    assert not new.exists()
    run = tmp_path / "run"
    (run / "checkpoint-2").mkdir(parents=True)
    (run / "checkpoint-2" / "trainer_state.json").write_text('{"global_step": 2}')
    (run / "rlcore_run.json").write_text('{"run_id": "47fe5cbac2f8"}')
    err = fails_before_model_load(["--output-dir", str(run), "--resume-from-checkpoint", str(run / "checkpoint-4")],
                                      capsys, monkeypatch)
    assert f"no such checkpoint: {run / 'checkpoint-4'}; {run} has checkpoint-2" in err, err
    err = fails_before_model_load(["--output-dir", str(tmp_path / "empty"), "--resume-from-checkpoint", "true"],
                                      capsys, monkeypatch)
    assert "no checkpoint to resume from in" in err and not (tmp_path / "empty").exists()
    (tmp_path / "not_a_checkpoint").mkdir()
    err = fails_before_model_load(["--output-dir", str(tmp_path / "o"), "--resume-from-checkpoint",
                                       str(tmp_path / "not_a_checkpoint")], capsys, monkeypatch)
    assert "is not a checkpoint (no trainer_state.json)" in err and not (tmp_path / "o").exists()


def test_the_python_api_checks_the_checkpoint_before_writing(tmp_path: Any, tiny_model_dir: str) -> None:
    from rlcore import ConfigError, GRPOConfig, GRPOTrainer
    from rlcore.data.tasks import digits_dataset

    args = GRPOConfig(output_dir=str(tmp_path / "new"), reward_funcs=["digits"], num_generations=2,
                      per_device_train_batch_size=4, max_completion_length=4, max_steps=1, report_to="none",
                      plots=False, disable_tqdm=True, save_strategy="no")
    trainer = GRPOTrainer(tiny_model_dir, args=args, train_dataset=digits_dataset(8))
    with pytest.raises(ConfigError, match="no such checkpoint: /nowhere/checkpoint-9"):
        trainer.train(resume_from_checkpoint="/nowhere/checkpoint-9")
    assert not os.path.exists(tmp_path / "new" / "rlcore_run.json")


def test_save_steps_saves_and_the_resumed_run_says_from_which_step(tmp_path: Any, capfd: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "300")  # the header's lines unwrapped
    out = str(tmp_path / "run")
    main(["train", "--max_steps", "2", "--save-steps", "1", "--output-dir", out])
    first = capfd.readouterr().out
    assert "a checkpoint every step" in first
    assert sorted(n for n in os.listdir(out) if n.startswith("checkpoint-")) == ["checkpoint-1", "checkpoint-2"]
    main(["train", "--max_steps", "3", "--resume_from_checkpoint", "true", "--output-dir", out])
    captured = capfd.readouterr()
    shown = captured.out + captured.err
    assert f"resumes   from {out}/checkpoint-2 (step 2 of 3)" in shown, shown
    assert "missing keys" not in shown and "lm_head.weight" not in shown, shown  # the tiny model's head is tied
    assert "do not match the ones in the `trainer_state.json`" not in shown  # it keeps saving every step, as before
    assert os.path.isdir(os.path.join(out, "checkpoint-3"))
