"""Issue 35 item 11: user errors that were not one line — an eval strategy the CLI had no eval set
for, ``rlcore new plugin`` into a read-only or full place, config values of the wrong type."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from rlcore.commands.cli import main
from rlcore.errors import ConfigError
from rlcore.testing.cli_checks import fails_before_model_load
from rlcore.training.config import GRPOConfig


# --- --eval_strategy from the command line --------------------------------------------------------------
def test_eval_strategy_without_an_eval_set_is_one_line_before_the_model_loads(capsys, monkeypatch, tmp_path):
    err = fails_before_model_load(["--eval_strategy", "steps", "--eval_steps", "1", "--output_dir", str(tmp_path / "o")],
                                  capsys, monkeypatch)
    assert err == ("Error: --eval_strategy steps evaluates on an eval set, and none was given: pass --eval-dataset "
                   "FILE|NAME (read like --dataset), or drop --eval_strategy")


def test_an_eval_dataset_row_without_a_prompt_is_one_line_before_the_model_loads(capsys, monkeypatch, tmp_path):
    ev = tmp_path / "eval.jsonl"
    ev.write_text('{"question": "What is 1 + 1?", "answer": "2"}\n{"answer": "3"}\n')
    err = fails_before_model_load(["--eval-dataset", str(ev), "--eval_strategy", "steps", "--eval_steps", "1",
                                   "--output_dir", str(tmp_path / "o")], capsys, monkeypatch)
    assert err.startswith(f"Error: eval dataset {ev}: dataset row 1 has none of the columns messages, prompt")


def test_rlcore_train_evaluates_on_the_eval_dataset_it_is_given(tmp_path, capsys):
    ev = tmp_path / "eval.jsonl"
    ev.write_text("".join(json.dumps({"prompt": f"What is {a} + {a}?", "answer": str(2 * a)}) + "\n" for a in range(4)))
    out = tmp_path / "out"
    main(["train", "--eval-dataset", str(ev), "--eval_strategy", "steps", "--eval_steps", "1", "--max_steps", "1",
          "--output_dir", str(out), "--plots", "false"])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("eval_reward" in r for r in rows), rows


def test_an_eval_dataset_that_is_never_evaluated_is_said_in_the_header(capsys, tmp_path):
    from rlcore.commands.train import build_plan

    ev = tmp_path / "eval.jsonl"
    ev.write_text('{"prompt": "What is 1 + 1?"}\n')
    plan = build_plan(["--eval-dataset", str(ev), "--output_dir", str(tmp_path / "o")])
    assert plan.eval_rows == [{"prompt": "What is 1 + 1?"}]
    assert any(n.startswith(f"--eval-dataset {ev} is never evaluated: eval_strategy is no") for n in plan.notes)


# --- rlcore new plugin where nothing can be written ------------------------------------------------------
def _mount_tmpfs(where: Path, options: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip()})")


@pytest.fixture
def read_only_dir(tmp_path):
    """A really read-only directory: a read-only tmpfs as root (root writes through chmod), else chmod 555."""
    where = tmp_path / "ro"
    if os.geteuid() == 0:
        _mount_tmpfs(where, "ro,size=1m")
        yield where
        subprocess.run(["umount", str(where)], check=False)
    else:  # pragma: no cover - the CI runs as root
        where.mkdir()
        where.chmod(0o555)
        yield where
        where.chmod(0o755)


def test_new_plugin_into_a_read_only_dir_is_one_line(read_only_dir, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["new", "plugin", "reward", "ro_reward", "--dir", str(read_only_dir / "pkgs")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"Error: cannot write the plugin package to {read_only_dir}/pkgs/rl-plugin-ro-reward: ")
    assert "\n" not in err and err.endswith("; pass a --dir you can write to")
    assert "Read-only file system" in err or "Permission denied" in err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a tmpfs of its own (root)")
def test_new_plugin_into_a_full_disk_is_one_line_and_leaves_no_half_package(tmp_path, capsys):
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "size=8k")  # room for a file or two of the package, not for all of it
    try:
        with pytest.raises(SystemExit) as exc:
            main(["new", "plugin", "scheduler", "full_disk_sched", "--dir", str(disk / "a" / "b")])
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"Error: cannot write the plugin package to {disk}/a/b/rl-plugin-full-disk-sched: "
                              "No space left on device"), err
        assert "\n" not in err
        assert list(disk.iterdir()) == []  # what this call created is gone: nothing half-written to trip over
    finally:
        subprocess.run(["umount", str(disk)], check=False)


# --- a config value of the wrong type ------------------------------------------------------------------
@pytest.mark.parametrize("yaml_text, line", [
    ("num_generations: [8]\n", "Error: num_generations must be an integer, got [8] (a list)"),
    ("learning_rate: [0.1]\n", "Error: learning_rate must be a number, got [0.1] (a list)"),
    ("reward_funcs: digits\n", "Error: reward_funcs must be a list of text or null, got 'digits' (text)"),
    ("max_turns: {a: 1}\n", "Error: max_turns must be an integer or null, got {'a': 1} (a mapping)"),
    ("use_peft: [true]\n", "Error: use_peft must be true or false, got [True] (a list)"),
    ("save_strategy: no\n", "Error: save_strategy must be one of no, steps, epoch, best, got False (true/false) "
                            "(YAML reads no/yes/off/on as true/false: quote the word)"),
])
def test_a_config_file_value_of_the_wrong_type_is_one_line_naming_the_field(yaml_text, line, tmp_path, capsys,
                                                                          monkeypatch):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml_text)
    err = fails_before_model_load(["--config", str(cfg), "--output_dir", str(tmp_path / "o")], capsys, monkeypatch)
    assert err == line


def test_grpo_config_in_python_checks_every_field_the_same_way(tmp_path):
    with pytest.raises(ConfigError, match=r"^num_generations_eval must be an integer or null, got '4' \(text\)$"):
        GRPOConfig(output_dir=str(tmp_path), num_generations_eval="4")
    with pytest.raises(ConfigError, match=r"^reward_weights must be a list of numbers or null, got \[1, 'a'\]"):
        GRPOConfig(output_dir=str(tmp_path), reward_weights=[1, "a"])
    # what fits stays as it was; a whole float for an integer becomes the integer, an int is a number
    cfg = GRPOConfig(output_dir=Path(tmp_path), max_steps=3.0, learning_rate=1, reward_weights=[1, 0.5])
    assert cfg.max_steps == 3 and isinstance(cfg.max_steps, int) and cfg.learning_rate == 1
    # what a field takes beyond its annotation stays accepted: TRL's scale_rewards=False, peft's
    # "all-linear", generation_kwargs as JSON text; a config rebuilt from another's fields (Ray workers)
    from rlcore.distributed.trainer_worker import config_fields

    cfg = GRPOConfig(output_dir=str(tmp_path), scale_rewards=False, lora_target_modules="all-linear",
                     generation_kwargs='{"max_tokens": 3}', eval_strategy="steps", eval_steps=2)
    again = GRPOConfig(**config_fields(cfg))
    assert (again.scale_rewards, again.lora_target_modules, again.generation_kwargs) == ("none", "all-linear",
                                                                                        {"max_tokens": 3})
