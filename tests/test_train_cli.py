"""`rlcore train`: the embedded default learns; flags, config files and plugin options parse; every
user mistake is one line before any model loads."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from rlcore.commands.cli import main
from rlcore.testing.cli_checks import fails_before_model_load
from rlcore.commands.train import build_plan
import rlcore.errors as rlcore_errors


def _first_last(rows: list[float]) -> tuple[float, float]:
    k = max(1, len(rows) // 10)
    return sum(rows[:k]) / k, sum(rows[-k:]) / k


def test_default_run_learns_the_builtin_task(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    """`rlcore train` with no arguments: tiny model, digits task, CPU; reward at least doubles."""
    monkeypatch.chdir(tmp_path)
    main(["train"])
    out = capsys.readouterr().out
    assert "rlcore train" in out and "reward (first 10% → last 10%)" in out
    path = tmp_path / "rlcore-output" / "digits"
    rows = [json.loads(line) for line in open(path / "metrics.jsonl")]
    assert len(rows) == 60
    first, last = _first_last([r["reward"] for r in rows])
    assert first > 0.02  # a random tiny policy already earns something
    assert last >= 2 * first, (first, last)
    assert (path / "plots" / "reward.png").stat().st_size > 1000
    assert (path / "plots" / "completion_length.png").exists()


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--loss-type", "nope"], "no loss named 'nope'"),
        (["--reward", "missing_reward"], "missing_reward"),
        (["--scheduler", "no_such_scheduler"], "no_such_scheduler"),
        (["--advantage", "nah"], "nah"),
        (["--scale-rewards", "sometimes"], "scale_rewards"),
        (["--is-correction", "token_trunc"], "is_correction"),
        (["--num-generations", "5"], "num_generations=5"),
        (["--temperature", "0"], "temperature"),
        (["--no-such-flag", "1"], "--no-such-flag"),
        (["--num-generations", "abc"], "num_generations"),
        (["--model", "./no/such/model"], "./no/such/model"),
        (["--dataset", "missing.jsonl", "--reward", "digits"], "missing.jsonl"),
        (["--dataset", "__BAD__", "--reward", "digits"], "prompt-column"),
        (["--config", "__CFG__"], "config file"),
        (["--observers", "no_such_observer"], "no observer plugin named 'no_such_observer'"),  # was after the model loaded
        (["--scheduler", "env_scheduler", "--env", "no_such_env"], "no env named 'no_such_env'"),  # was after the model loaded
    ],
)
def test_mistakes_are_one_line(argv: list[str], needle: str, tmp_path: Any, capsys: Any,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "hi", "answer": 1}) + "\n")
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("num_generations: [1\n")
    argv = [str(bad) if a == "__BAD__" else str(cfg) if a == "__CFG__" else a for a in argv]
    monkeypatch.chdir(tmp_path)
    err = fails_before_model_load(argv, capsys, monkeypatch)
    assert needle in err, err


def test_config_file_flags_and_plugin_options(tmp_path: Any) -> None:
    yaml_cfg = tmp_path / "run.yaml"
    yaml_cfg.write_text("num_generations: 2\nloss_type: grpo\nbeta: 0.01\nreward: digits\nmax_total_tokens: 99\n")
    plan = build_plan(["--config", str(yaml_cfg), "--beta", "0.02", "--max-turns", "1", "--output-dir", str(tmp_path)])
    assert plan.args.num_generations == 2 and plan.args.loss_type == "grpo"
    assert plan.args.beta == 0.02  # the flag beats the file
    assert plan.args.reward_funcs == ["digits"]
    assert plan.component_options["scheduler"] == {"max_total_tokens": 99}
    toml_cfg = tmp_path / "run.toml"
    toml_cfg.write_text('loss_type = "gspo"\nnum_iterations = 2\nenv_options = {"seed" = 3}\n')
    plan = build_plan(["--config", str(toml_cfg), "--batch-window-ms", "2"])
    assert plan.args.loss_type == "gspo" and plan.args.num_iterations == 2
    assert plan.args.env_options == {"seed": 3}
    assert plan.component_options["sampler"] == {"batch_window_ms": 2.0}


def test_train_on_a_local_dataset_with_question_column(tmp_path: Any, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "qa.jsonl"
    with open(data, "w") as f:
        for i in range(8):
            f.write(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n")
    monkeypatch.chdir(tmp_path)
    main(["train", "--dataset", str(data), "--reward", "digits", "--reward", "length_penalty",
          "--reward-weights", "1.0", "0.5", "--max-steps", "2", "--num-generations", "2",
          "--per-device-train-batch-size", "4", "--max-completion-length", "3", "--output-dir", "out",
          "--save-strategy", "no", "--learning-rate", "1e-3"])
    rows = [json.loads(line) for line in open(tmp_path / "out" / "metrics.jsonl")]
    assert len(rows) == 2
    assert "rewards/digits" in rows[0] and "rewards/length_penalty" in rows[0]
    assert rows[0]["completion_length/max"] <= 3


def test_help_lists_grpo_flags(capsys: Any) -> None:
    main(["train", "--help"])
    out = capsys.readouterr().out
    for flag in ("--num_generations", "--loss_type", "--scheduler", "--use_peft", "--reward"):
        assert flag in out


def test_bad_values_and_taken_output_dirs_are_one_line_before_the_model_loads(
    tmp_path: Any, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 14: these were tracebacks after the model loaded, or silently mixed two runs."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert "learning_rate must be a finite number >= 0" in fails_before_model_load(["--learning_rate", "-1"], capsys, monkeypatch)
    assert "is a file, not a directory" in fails_before_model_load(["--output_dir", str(afile)], capsys, monkeypatch)
    taken = tmp_path / "taken"
    (taken / "checkpoint-20").mkdir(parents=True)
    err = fails_before_model_load(["--output_dir", str(taken)], capsys, monkeypatch)
    assert "already holds a run (checkpoint-20)" in err and "--resume_from_checkpoint" in err
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1", "answer": "2"}\n{"prompt": "2+2"}\n{"answer": "3"}\n')
    err = fails_before_model_load(["--dataset", str(rows), "--reward", "digits", "--output_dir", str(tmp_path / "o")],
                                   capsys, monkeypatch)
    assert "row 2 has none of the columns" in err


def test_the_default_output_dir_moves_aside_when_taken(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not naming --output_dir twice in a row starts a second run beside the first, never inside it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rlcore-output" / "digits" / "checkpoint-60").mkdir(parents=True)
    assert build_plan([]).args.output_dir == "rlcore-output/digits-2"
    (tmp_path / "rlcore-output" / "digits-2").mkdir()  # empty: free
    assert build_plan([]).args.output_dir == "rlcore-output/digits-2"
    assert build_plan(["--output_dir", "rlcore-output/digits", "--overwrite_output_dir", "true"]).args.output_dir == "rlcore-output/digits"


def _one_line_error(argv: list[str], capsys: Any) -> str:
    with pytest.raises(SystemExit) as exc:
        main(["train", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("Error: ") and not any("Traceback" in line for line in err), err
    return err[-1]


def test_a_model_that_cannot_load_is_one_line(tmp_path: Any, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory that is not a saved model, one without tokenizer files, and a hub id that is
    neither cached nor reachable were raw transformers tracebacks (or, without tokenizer files, a
    run on an empty vocabulary)."""
    import shutil

    from rlcore.data.demo import tiny_model_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "not_a_model").mkdir()
    err = fails_before_model_load(["--model", str(tmp_path / "not_a_model")], capsys, monkeypatch)
    assert "not_a_model has no config.json" in err, err
    from rlcore.training.components import check_model_dir

    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    check_model_dir(str(tmp_path / "adapter"))  # a LoRA run's output: transformers loads it with its base
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    no_tokenizer = tmp_path / "weights_only"
    no_tokenizer.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(tiny_model_path(), name), no_tokenizer / name)
    err = _one_line_error(["--model", str(no_tokenizer), "--output-dir", "o1"], capsys)
    assert "weights_only" in err and "no tokenizer files" in err, err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    err = _one_line_error(["--model", "rlcore-tests/no-such-model", "--output-dir", "o2"], capsys)
    assert "cannot load the tokenizer of 'rlcore-tests/no-such-model'" in err, err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()  # nothing was started


def test_policy_names_a_directory_that_is_not_a_model(tmp_path: Any) -> None:
    from rlcore import ConfigError
    from rlcore.loop import Policy
    with pytest.raises(ConfigError, match="has no config.json"):
        Policy(str(tmp_path))


def test_the_default_config_warns_about_nothing(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run printed transformers' FutureWarning about `gradient_checkpointing`, a name rlcore
    itself set by default; a newcomer's first `rlcore train` began with a deprecation warning."""
    import warnings

    from rlcore import GRPOConfig

    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        plan = build_plan([])
        default = GRPOConfig(output_dir=str(tmp_path / "a"))
    assert default.activation_checkpointing is True and default.gradient_checkpointing is True  # TRL's default
    assert plan.args.activation_checkpointing is True
    assert GRPOConfig(output_dir=str(tmp_path / "b"), activation_checkpointing=False).gradient_checkpointing is False
    with pytest.warns(FutureWarning, match="gradient_checkpointing"):  # TRL's (deprecated) name still works
        assert GRPOConfig(output_dir=str(tmp_path / "c"), gradient_checkpointing=False).activation_checkpointing is False


def test_reward_weights_as_name_equals_weight_like_rollout(tmp_path: Any) -> None:
    """`rlcore rollout --reward digits=2` sets a weight; `rlcore train` said "no reward named 'digits=2'"."""
    plan = build_plan(["--reward", "digits=2.5", "--reward", "length_penalty", "--output-dir", str(tmp_path / "a")])
    assert plan.args.reward_funcs == ["digits", "length_penalty"] and plan.args.reward_weights == [2.5, 1.0]
    with pytest.raises(rlcore_errors.ConfigError, match="either as --reward NAME=WEIGHT or with reward_weights"):
        build_plan(["--reward", "digits=2", "--reward-weights", "1", "--output-dir", str(tmp_path / "b")])
    with pytest.raises(rlcore_errors.ConfigError, match="the weight after '=' must be a number"):
        build_plan(["--reward", "digits=x", "--output-dir", str(tmp_path / "c")])


def test_an_interrupted_run_says_how_to_resume(tmp_path: Any) -> None:
    """Ctrl-C printed the summary and exit 130, but not how to continue (or that nothing can be)."""
    from rlcore.commands.train import resume_hint

    run = tmp_path / "run"
    assert "no checkpoint was written" in resume_hint(str(run)) and "--save-steps" in resume_hint(str(run))
    (run / "checkpoint-10").mkdir(parents=True)
    (run / "checkpoint-20").mkdir()
    hint = resume_hint(str(run))
    assert f"--resume_from_checkpoint true --output-dir {run}" in hint and "checkpoint-20" in hint


def test_a_reward_needing_a_column_the_dataset_lacks_fails_before_the_model_loads(
        tmp_path: Any, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Registered rewards are checked from their signatures, before anything is built or loaded."""
    import rlcore
    from rlcore.rewards import Reward

    class NeedsSolution(Reward):
        def score(self, completions, solution):
            return [0.0] * len(completions)

    def register_rewards(register):
        register("needs_solution_t", NeedsSolution)

    from rlcore.testing.packages import load_in_process

    load_in_process(monkeypatch, "needs_solution_plugin_t", register_rewards=register_rewards)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1", "answer": "2"}\n')
    err = fails_before_model_load(["--dataset", str(rows), "--reward", "needs_solution_t", "--output-dir", str(tmp_path / "o")],
                                   capsys, monkeypatch)
    assert "reward 'needs_solution_t' needs the column 'solution'" in err and "(columns: prompt, answer)" in err


def test_a_lora_runs_output_trains_further_as_a_model(tmp_path: Any) -> None:
    """`--model` = what a `--use_peft` run wrote (adapter_config.json, no config.json): transformers
    attached the adapter its own way and the first checkpoint save failed in its peft integration;
    it loads as a trainable PEFT model now, and its adapters keep training."""
    from safetensors.torch import load_file

    from rlcore import ConfigError, GRPOConfig, GRPOTrainer
    from rlcore.data.demo import tiny_model_path
    from rlcore.data.tasks import digits_dataset

    def args(out: str, **over: Any) -> Any:
        return GRPOConfig(output_dir=out, reward_funcs=["digits"], num_generations=2, per_device_train_batch_size=4,
                          max_completion_length=4, max_steps=1, learning_rate=1e-2, save_strategy="steps",
                          save_steps=1, report_to="none", plots=False, disable_tqdm=True, **over)

    GRPOTrainer(tiny_model_path(), args=args(str(tmp_path / "run"), use_peft=True), train_dataset=digits_dataset(8)).train()
    first = str(tmp_path / "run" / "checkpoint-1")
    second = str(tmp_path / "second")
    trainer = GRPOTrainer(first, args=args(second), train_dataset=digits_dataset(8))
    assert hasattr(trainer.model, "peft_config")
    trainer.train()
    before = load_file(os.path.join(first, "adapter_model.safetensors"))
    after = load_file(os.path.join(second, "checkpoint-1", "adapter_model.safetensors"))
    assert sorted(before) == sorted(after) and any(not before[k].equal(after[k]) for k in before)
    with pytest.raises(ConfigError, match="already a LoRA adapter"):
        GRPOTrainer(first, args=args(str(tmp_path / "third"), use_peft=True), train_dataset=digits_dataset(8))


def test_the_header_does_not_claim_the_tasks_reward_when_the_run_replaced_it(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    own = build_plan([])
    assert own.task_description == "made-up sums, rewarded for answering in digits"
    other = build_plan(["--reward", "length_penalty", "--output-dir", str(tmp_path / "o")])
    assert other.args.reward_funcs == ["length_penalty"]
    assert other.task_description.endswith("(its reward digits; this run scores with length_penalty)")
