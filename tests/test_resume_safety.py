"""Resume never mixes runs and never runs code (issue 14, points 4-7, 11, 12): checkpoints load
only tensors/JSON, a torn metrics line is tolerated and repaired, a run never adopts another run's
checkpoint, an interrupted + resumed CPU run logs exactly what an uninterrupted one does, and bad
rows / settings are one line before the model loads."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import pytest
from transformers import TrainerCallback

import rlcore.training.checkpoint as ckpt
from rlcore.errors import ConfigError, DatasetError
from rlcore.data.tasks import digits_dataset
from rlcore.trainer.grpo import GRPOConfig, GRPOTrainer
from rlcore.training.metrics import append_jsonl, read_jsonl, truncate_jsonl

KEYS = ("step", "reward", "loss", "completion_length", "entropy", "grad_norm", "learning_rate")


def config(out: str, **over: Any) -> GRPOConfig:
    values: dict[str, Any] = dict(
        output_dir=out, reward_funcs=["digits"], num_generations=4, per_device_train_batch_size=8,
        max_completion_length=6, max_steps=4, learning_rate=1e-3, save_strategy="steps", save_steps=2,
        seed=0, disable_tqdm=True, report_to="none", plots=False,
    )
    values.update(over)
    return GRPOConfig(**values)


def logged(out: str) -> list[dict[str, Any]]:
    return [{k: r.get(k) for k in KEYS} for r in read_jsonl(out)]


class Died(BaseException):
    """Stands for the process dying right after a checkpoint (fault injection)."""


class DieAfterSave(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == self.step:
            raise Died


# --- 4: only tensors and JSON ------------------------------------------------------------------------
class _Payload:
    def __reduce__(self) -> Any:
        return (os.system, (f"touch {os.environ['RLCORE_PWNED']}",))


def test_a_crafted_buffer_file_is_refused_not_executed(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    marker = tmp_path / "pwned"
    monkeypatch.setenv("RLCORE_PWNED", str(marker))
    ck = tmp_path / "checkpoint-2"
    ck.mkdir()
    (ck / ckpt.STATE_FILE).write_text(json.dumps({"global_step": 2}))
    torch.save([{"batch": _Payload()}], ck / ckpt.BUFFER_FILE)
    with pytest.raises(ConfigError, match="plain tensors"):
        ckpt.read_state(str(ck))
    assert not marker.exists()


# --- 5: whole lines, torn tails ------------------------------------------------------------------------
def test_a_torn_metrics_tail_is_skipped_and_repaired(tmp_path: Any) -> None:
    out = str(tmp_path)
    append_jsonl(out, {"step": 1, "reward": 0.5})
    append_jsonl(out, {"step": 2, "reward": float("nan")})
    path = tmp_path / "metrics.jsonl"
    with open(path, "a") as f:
        f.write('{"step": 3, "rew')  # the process died mid-append
    assert [r["step"] for r in read_jsonl(out)] == [1, 2]
    assert read_jsonl(out)[1]["reward"] is None
    append_jsonl(out, {"step": 3, "reward": 0.7})  # the next append cuts the torn tail first
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]
    with open(path, "a") as f:
        f.write('{"step": 4')
    truncate_jsonl(out, 2)  # what a resume from checkpoint-2 does
    assert path.read_text() == '{"step": 1, "reward": 0.5}\n{"step": 2, "reward": null}\n'


# --- 6 and 7: run identity, reproducible resume ---------------------------------------------------------
def test_interrupted_and_resumed_run_logs_what_an_uninterrupted_one_does(tmp_path: Any, tiny_model_dir: str) -> None:
    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    GRPOTrainer(tiny_model_dir, args=config(whole), train_dataset=digits_dataset(32)).train()
    first = GRPOTrainer(tiny_model_dir, args=config(parts), train_dataset=digits_dataset(32), callbacks=[DieAfterSave(2)])
    with pytest.raises(Died):
        first.train()
    with open(os.path.join(parts, "metrics.jsonl"), "a") as f:
        f.write('{"step": 3, "rewa')  # and it died mid-append
    resumed = GRPOTrainer(tiny_model_dir, args=config(parts), train_dataset=digits_dataset(32))
    resumed.train(resume_from_checkpoint=True)
    assert resumed.run_id == first.run_id
    assert logged(parts) == logged(whole)  # sampler RNG, data position, optimizer: all restored
    assert len(logged(whole)) == 4


def test_a_run_never_adopts_another_runs_checkpoint(tmp_path: Any, tiny_model_dir: str, capsys: Any) -> None:
    out = str(tmp_path / "run")
    a = GRPOTrainer(tiny_model_dir, args=config(out, max_steps=4), train_dataset=digits_dataset(32))
    a.train()
    # the case: a fresh run into the same directory is refused (it would resume checkpoint-4 later)
    b = GRPOTrainer(tiny_model_dir, args=config(out, max_steps=2), train_dataset=digits_dataset(32))
    with pytest.raises(ConfigError, match="already holds a run .*--overwrite_output_dir"):
        b.train()
    assert sorted(os.listdir(out)) == ["checkpoint-2", "checkpoint-4", "metrics.jsonl", ckpt.RUN_FILE]
    # a checkpoint copied in from another run is refused on resume
    other = str(tmp_path / "other")
    c = GRPOTrainer(tiny_model_dir, args=config(other, max_steps=2), train_dataset=digits_dataset(32))
    c.train()
    shutil.copytree(os.path.join(other, "checkpoint-2"), os.path.join(out, "checkpoint-6"))
    d = GRPOTrainer(tiny_model_dir, args=config(out, max_steps=8), train_dataset=digits_dataset(32))
    with pytest.raises(ConfigError, match=f"checkpoint-6 was written by run {c.run_id}, not by run {a.run_id}"):
        d.train(resume_from_checkpoint=True)
    # overwrite replaces the old run: its checkpoints are gone, the new run resumes only its own
    e = GRPOTrainer(tiny_model_dir, args=config(out, max_steps=2, overwrite_output_dir=True), train_dataset=digits_dataset(32))
    e.train()
    assert sorted(os.listdir(out)) == ["checkpoint-2", "metrics.jsonl", ckpt.RUN_FILE]
    assert ckpt.read_run_id(out) == e.run_id != a.run_id
    assert [r["step"] for r in read_jsonl(out)] == [1, 2]


# --- 11 and 12: every row, every setting, before the model loads ------------------------------------------
@pytest.mark.parametrize("rows, needle", [
    ([{"prompt": "a"}, {"prompt": "b"}, {"answer": "3"}], "row 2 has none of the columns"),
    ([{"prompt": "a"}, "just text"], "row 1 is a str"),
    ([{"prompt": "a"}, {"prompt": 7}], "row 1 column 'prompt' must be text"),
    ([{"env_config": {"seed": 1}}, {"env_config": {"seed": 2}}, {"x": 1}], "row 2 has no env_config"),
])
def test_every_row_is_checked_before_the_model_loads(rows: list[Any], needle: str, tmp_path: Any) -> None:
    with pytest.raises(DatasetError, match=needle):  # the model path does not exist: it is never reached
        GRPOTrainer(str(tmp_path / "no-model"), args=config(str(tmp_path / "o")), train_dataset=rows)


def test_bad_learning_rate_and_output_dir_are_one_line(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="learning_rate must be a finite number >= 0, got -1"):
        config(str(tmp_path), learning_rate=-1.0)
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        config(str(afile))
    with pytest.raises(ConfigError, match="cannot be created or written"):
        config(str(afile / "sub"))
