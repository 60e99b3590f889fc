"""`rlcore train --help` starts with what a run needs (issue 34, point 4): it was 1,081 lines of
argparse's alphabet-free field list, with `--model`, `--dataset`, `--reward` and `--config` first
at line 1,058. Now the run options and the fields most runs set, grouped; `--help-all` has every flag."""

from __future__ import annotations

import dataclasses
from typing import Any

from rlcore.commands.cli import main
from rlcore.commands.train import HELP_GROUPS, SCRIPT_FLAGS
from rlcore.training.config import GRPOConfig


def _help(capsys: Any, flag: str) -> list[str]:
    main(["train", flag])
    return capsys.readouterr().out.splitlines()


def test_help_starts_with_the_run_options_and_the_common_fields_grouped(capsys: Any) -> None:
    lines = _help(capsys, "--help")
    assert len(lines) < 80, len(lines)
    first = {flag: next(i for i, line in enumerate(lines) if line.lstrip().startswith(flag + " "))
             for flag in ("--config", "--model", "--dataset", "--reward", "--num_generations", "--output_dir")}
    assert first["--config"] < first["--model"] < 15 and first["--reward"] < 25, first
    headings = [line[:-1] for line in lines if line.endswith(":") and not line.startswith(" ")]
    assert headings[:6] == ["run options", "model & data", "rewards", "generation", "optimisation", "output"], headings
    text = "\n".join(lines)
    assert "rlcore train --help-all" in text and lines[first["--config"] + 1].lstrip().startswith("--help-all")
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    shown = [name for entries in HELP_GROUPS.values() for name, _, _ in entries]
    assert 18 <= len([n for n in shown if n in fields]) <= 24
    for name in shown:  # every entry is a real flag, never a stale name
        assert name in fields or name in SCRIPT_FLAGS, name
    assert "[default: 8; built-in task: 32]" in text  # per_device_train_batch_size: GRPOConfig's and the no-argument run's


def test_help_all_lists_every_field_after_the_run_options(capsys: Any) -> None:
    lines = _help(capsys, "--help-all")
    text = "\n".join(lines)
    for f in dataclasses.fields(GRPOConfig):
        assert f"--{f.name}" in text, f.name
    every = next(i for i, line in enumerate(lines) if line.startswith("every GRPOConfig field"))
    assert next(i for i, line in enumerate(lines) if line.lstrip().startswith("--model ")) < every
