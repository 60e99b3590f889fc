"""`rlcore rollout` end to end (real tiny model, hf sampler) and the plugin-option mapping."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import rlcore
from rlcore.rollout import EnvScheduler
from rlcore.rollout.options import convert, factory_parameters, parse_flags, plugin_options


def run_cli(args: list[str]) -> Any:
    from click.testing import CliRunner

    from rlcore.commands.cli import _load_commands, cli

    _load_commands()
    return CliRunner().invoke(cli, args)


def test_rollout_command_writes_jsonl(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    res = run_cli(["rollout", "--limit", "2", "--num-generations", "2", "--max-tokens", "6", "--no-progress",
                   "--reward", "length_penalty", "--reward", "env_reward=0.5", "--output", str(out), "--seed", "1"])
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 4
    for d in lines:
        n = len(d["completion_ids"])
        assert n == len(d["loss_mask"]) == len(d["logprobs"]) and 0 < n <= 6
        assert d["prompt_ids"] and d["num_turns"] == 1 and d["messages"][-1]["role"] == "assistant"
        assert d["status"] in ("ok", "truncated") and (d["reason"] is None) == (d["status"] == "ok")
        assert set(d["rewards"]) == {"length_penalty", "env_reward"}
        assert d["reward"] == pytest.approx(d["rewards"]["length_penalty"] + 0.5 * d["rewards"]["env_reward"])
        assert d["infos"]["logprobs_complete"] is True and d["data"]["answer"]
    assert "wrote 4 trajectories" in res.output


def test_rollout_tokenizes_a_plain_text_prompt_as_trl_and_the_trainer_do(tmp_path: Path) -> None:
    """A plain-text ``prompt`` column is TRL's standard prompt: TRL 1.16's GRPOTrainer tokenizes its
    text as is (no chat template, ``_tokenize_prompts``) and rlcore's trainer does too; `rlcore
    rollout` used to template it. Its trajectories keep the prompt as written in ``data`` (what a
    TRL-style reward is given as ``prompts``), as the trainer's do."""
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from rlcore.data.cursor import make_prompt
    from rlcore.data.demo import tiny_model_path

    rows = [{"prompt": "What is 2 + 2?", "answer": "4"}, {"prompt": "What is 3 + 5?", "answer": "8"}]
    path = tmp_path / "standard.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "r.jsonl"
    res = run_cli(["rollout", "--dataset", str(path), "--num-generations", "1", "--max-tokens", "2", "--no-progress",
                   "--output", str(out), "--seed", "1"])
    assert res.exit_code == 0, res.output
    got = {d["data"]["answer"]: d for d in map(json.loads, out.read_text().splitlines())}
    args = trl.GRPOConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, report_to="none", per_device_train_batch_size=2,
                          num_generations=2, max_completion_length=2)
    trainer = trl.GRPOTrainer(model=tiny_model_path(), reward_funcs=lambda completions, **_: [0.0] * len(completions),
                              args=args, train_dataset=datasets.Dataset.from_list(rows))
    want, _, _ = trainer._tokenize_prompts([r["prompt"] for r in rows])
    for row, ids in zip(rows, want):
        d = got[row["answer"]]
        assert d["prompt_ids"] == list(ids)
        assert d["prompt_ids"] == make_prompt(row, trainer.processing_class, True).prompt_ids  # rlcore's trainer
        assert d["data"]["prompt"] == row["prompt"]


def test_rollout_speaks_trains_vocabulary_in_both_spellings(tmp_path: Path) -> None:
    """`rlcore rollout` takes `rlcore train`'s (TRL's) names, dash or underscore; rlcore 0.1's stay aliases."""
    for flags in (["--max_completion_length", "3", "--num_generations", "2", "--rollout_concurrency", "1",
                   "--rollout_timeout", "60", "--dataset_split", "train", "--sampler_options", '{"seed": 3}'],
                  ["--max-completion-length", "3", "--num-generations", "2", "--rollout-concurrency", "1",
                   "--rollout-timeout", "60", "--dataset-split", "train", "--sampler-options", '{"seed": 3}'],
                  ["--max-tokens", "3", "--num-generations", "2", "--concurrency", "1", "--timeout", "60",
                   "--split", "train"]):
        out = tmp_path / f"r{len(list(tmp_path.iterdir()))}.jsonl"  # a new file each time (an existing one is kept)
        res = run_cli(["rollout", "--limit", "1", "--no-progress", "--output", str(out), *flags])
        assert res.exit_code == 0, (flags, res.output)
        lines = [json.loads(x) for x in out.read_text().splitlines()]
        assert len(lines) == 2 and all(0 < len(d["completion_ids"]) <= 3 for d in lines)
    res = run_cli(["rollout", "--limit", "1", "--no-progress", "--sampler-options", '{"sede": 3}', "--output", str(out)])
    assert res.exit_code != 0 and str(res.exception).startswith("unknown option --sede: sampler 'hf' accepts")


def test_unknown_option_is_one_line(tmp_path: Path) -> None:
    res = run_cli(["rollout", "--env-url", "http://x", "--output", str(tmp_path / "r.jsonl")])
    assert res.exit_code != 0
    msg = str(res.exception)
    assert msg.startswith("unknown option --env-url: scheduler 'default' accepts --max-total-tokens, --max-turns, --tools")
    assert "\n" not in msg


class UrlScheduler(EnvScheduler):
    def __init__(self, sampler: Any = None, *, env: str = "guess", env_url: str | None = None, retries: int = 2,
                 verbose: bool = False, **kw: Any) -> None:
        super().__init__(sampler, **kw)
        self.env, self.env_url, self.retries, self.verbose = env, env_url, retries, verbose


def test_plugin_options_mapping() -> None:
    flags = parse_flags(["--env-url", "http://127.0.0.1:8000", "--env", "wordle", "--retries=5", "--verbose",
                         "--env-timeout", "2.5", "--max-concurrent-envs", "8", "--no-cache"])
    assert flags == {"env_url": "http://127.0.0.1:8000", "env": "wordle", "retries": "5", "verbose": True,
                     "env_timeout": "2.5", "max_concurrent_envs": "8", "cache": False}
    params = factory_parameters(UrlScheduler)
    assert {"env", "env_url", "retries", "verbose", "max_turns", "env_timeout", "max_concurrent_envs"} <= set(params)
    routed = plugin_options(["--env-url", "u", "--env", "wordle", "--retries", "5", "--env-timeout", "2.5",
                             "--max-concurrent-envs", "8", "--verbose", "false"], {"scheduler": UrlScheduler})["scheduler"]
    assert routed == {"env_url": "u", "env": "wordle", "retries": 5, "env_timeout": 2.5, "max_concurrent_envs": 8, "verbose": False}
    sched = UrlScheduler(**routed)
    assert sched.env_timeout == 2.5 and sched.max_concurrent_envs == 8 and sched.retries == 5
    assert convert("[1, 2]", params["env_url"]) == "[1, 2]"
    with pytest.raises(rlcore.ConfigError, match=r"unknown option --cache: scheduler accepts .*--env-url"):
        plugin_options(["--no-cache"], {"scheduler": UrlScheduler})


@pytest.mark.parametrize("flags, needle", [
    (["--num-generations", "0"], "--num-generations must be at least 1, got 0"),
    (["--num-generations", "-3"], "--num-generations must be at least 1, got -3"),
    (["--max-tokens", "0"], "--max-completion-length must be at least 1, got 0"),  # rlcore 0.1's spelling
    (["--max_completion_length", "0"], "--max-completion-length must be at least 1, got 0"),
    (["--rollout-concurrency", "0"], "--rollout-concurrency must be at least 1, got 0"),
    (["--limit", "-1"], "--limit must be 0 (all prompts) or a positive number of prompts, got -1"),
    (["--timeout", "0"], "--rollout-timeout must be a positive number of seconds"),
    (["--rollout_timeout", "0"], "--rollout-timeout must be a positive number of seconds"),
    (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
    (["--model", "./no/such/model"], "model path ./no/such/model does not exist"),  # was a hub-id error about repo names
])
def test_bad_numbers_are_one_line_before_anything_loads(flags: list[str], needle: str, tmp_path: Path,
                                                        capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 14: these wrote 0 trajectories, or failed every one, and exited 0."""
    from rlcore.commands.cli import main
    import rlcore.sampling.hf.sampler as hf

    def no_load(*a: Any, **k: Any) -> Any:  # fault injection: loading a sampler here is the bug
        raise AssertionError("the sampler loaded before the options were checked")

    monkeypatch.setattr(hf.HFSampler, "__init__", no_load)
    with pytest.raises(SystemExit) as exc:
        main(["rollout", *flags, "--output", str(tmp_path / "r.jsonl")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == f"Error: {err[7:]}" and needle in err and "\n" not in err
    assert not (tmp_path / "r.jsonl").exists()


def test_nothing_succeeded_exits_non_zero_and_keeps_the_file(tmp_path: Path, capsys: Any) -> None:
    from rlcore.commands.cli import main

    out = tmp_path / "r.jsonl"
    with pytest.raises(SystemExit) as exc:  # a deadline no trajectory can meet: every one fails
        main(["rollout", "--limit", "2", "--max-tokens", "4", "--no-progress", "--timeout", "0.000001", "--output", str(out)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("Error: no trajectory succeeded: wrote 2 trajectories") and "2 failed" in err
    assert [json.loads(x)["status"] for x in out.read_text().splitlines()] == ["failed", "failed"]


def test_check_rollouts_names_a_model_path_that_does_not_exist(tmp_path: Path, capsys: Any) -> None:
    from rlcore.commands.cli import main

    rollouts = tmp_path / "r.jsonl"
    rollouts.write_text("")
    with pytest.raises(SystemExit) as exc:
        main(["check-rollouts", "--model", str(tmp_path / "gone"), str(rollouts)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("Error: model path ") and "gone does not exist" in err and "\n" not in err


def test_a_dataset_without_a_prompt_column_is_one_line_before_the_sampler_loads(
        tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """As in `rlcore train`: the rows are checked first (the model loaded, then the error came)."""
    from rlcore.commands.cli import main
    import rlcore.sampling.hf.sampler as hf

    def no_load(*a: Any, **k: Any) -> Any:  # fault injection: loading a sampler here is the bug
        raise AssertionError("the sampler loaded before the dataset was checked")

    monkeypatch.setattr(hf.HFSampler, "__init__", no_load)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "hi", "answer": "1"}\n')
    with pytest.raises(SystemExit) as exc:
        main(["rollout", "--dataset", str(rows), "--output", str(tmp_path / "r.jsonl")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"Error: dataset {rows}: dataset row 0 has none of the columns") and "\n" not in err


def test_a_model_directory_without_tokenizer_files_is_one_line(tmp_path: Path, capsys: Any) -> None:
    """transformers builds a tokenizer with an empty vocabulary for it; rollouts were then garbage."""
    import shutil

    from rlcore.commands.cli import main
    from rlcore.data.demo import tiny_model_path

    model = tmp_path / "weights_only"
    model.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(Path(tiny_model_path()) / name, model / name)
    with pytest.raises(SystemExit) as exc:
        main(["rollout", "--model", str(model), "--limit", "1", "--output", str(tmp_path / "r.jsonl")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("Error: the tokenizer of ") and "empty vocabulary" in err
    assert not (tmp_path / "r.jsonl").exists()


def test_an_hf_sampler_built_directly_refuses_a_directory_without_tokenizer_files(tmp_path: Path) -> None:
    """The same check as the CLI's and the trainer's (one place: rlcore.chat_template.check_vocabulary)."""
    import shutil

    import rlcore
    from rlcore.data.demo import tiny_model_path

    model = tmp_path / "weights_only"
    model.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(Path(tiny_model_path()) / name, model / name)
    with pytest.raises(rlcore.ConfigError, match=r"^the tokenizer of .*weights_only' has an empty vocabulary"):
        rlcore.get("sampler", "hf")(str(model))
    from transformers import AutoTokenizer

    sampler = rlcore.get("sampler", "hf")(str(model), tokenizer=AutoTokenizer.from_pretrained(tiny_model_path()))
    assert len(sampler.tokenizer) > 1  # a tokenizer passed in is the way out the message names
