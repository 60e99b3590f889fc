"""Atomic checkpoints and resume: same step, same data position, pending mini-batches kept, and a
process killed in the middle of a save never leaves a checkpoint that resume would load."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

import rlcore.training.checkpoint as ckpt
from rlcore.data.tasks import digits_dataset
from rlcore.trainer.grpo import GRPOConfig, GRPOTrainer


def config(out: str, **over: Any) -> GRPOConfig:
    values: dict[str, Any] = dict(
        output_dir=out, reward_funcs=["digits"], num_generations=4, per_device_train_batch_size=8,
        max_completion_length=4, max_steps=4, learning_rate=1e-3, save_strategy="steps", save_steps=2,
        seed=0, disable_tqdm=True, report_to="none",
    )
    values.update(over)
    return GRPOConfig(**values)


def steps_logged(out: str) -> list[int]:
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line)["step"] for line in f]


def test_resume_continues_at_the_same_step_and_data_position(tmp_path: Any, tiny_model_dir: str) -> None:
    out = str(tmp_path)
    a = GRPOTrainer(tiny_model_dir, args=config(out), train_dataset=digits_dataset(32))
    a.train()
    final_cursor = a.cursor.state_dict()
    assert sorted(os.listdir(out)) == ["checkpoint-2", "checkpoint-4", "metrics.jsonl", "plots", "rlcore_run.json"]
    ck2 = os.path.join(out, "checkpoint-2")
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "rlcore_state.json"):
        assert os.path.exists(os.path.join(ck2, name)), name
    state = json.load(open(os.path.join(ck2, "rlcore_state.json")))
    assert state["global_step"] == 2 and state["cursor"]["pos"] == 4  # 2 generations × 2 prompts

    b = GRPOTrainer(tiny_model_dir, args=config(out), train_dataset=digits_dataset(32))
    b.train(resume_from_checkpoint=ck2)
    assert b.state.global_step == 4
    assert b.cursor.state_dict() == final_cursor
    assert steps_logged(out) == [1, 2, 3, 4]  # steps after the checkpoint were logged again, once


def test_pending_minibatches_survive_a_resume(tmp_path: Any, tiny_model_dir: str) -> None:
    # two optimizer steps per generation, checkpoint after every step: checkpoint-1 holds a half-used batch
    out = str(tmp_path)
    args = config(out, per_device_train_batch_size=4, steps_per_generation=2, save_steps=1, max_steps=3)
    a = GRPOTrainer(tiny_model_dir, args=args, train_dataset=digits_dataset(32))
    a.train()
    assert os.path.exists(os.path.join(out, "checkpoint-1", "rlcore_buffer.pt"))
    b = GRPOTrainer(tiny_model_dir, args=args, train_dataset=digits_dataset(32))
    b.train(resume_from_checkpoint=os.path.join(out, "checkpoint-1"))
    assert b.state.global_step == 3
    assert b._generations == 2  # step 2 used the saved half, step 3 generated anew
    assert b.cursor.state_dict() == a.cursor.state_dict()


class Killed(BaseException):
    """Stands for the process dying: nothing after the raise point runs (fault injection)."""


def test_killed_mid_save_resume_ignores_the_half_written_checkpoint(
    tmp_path: Any, tiny_model_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = str(tmp_path / "run")
    real_write = ckpt.write_state

    def write_then_die(path: str, state: dict, buffer: Any = None) -> None:
        real_write(path, state, buffer)  # every file of checkpoint-4 is on disk ...
        if state["global_step"] == 4:
            raise Killed  # ... but the process dies before the rename publishes it

    monkeypatch.setattr(ckpt, "write_state", write_then_die)
    a = GRPOTrainer(tiny_model_dir, args=config(out, max_steps=6), train_dataset=digits_dataset(32))
    with pytest.raises(Killed):
        a.train()
    monkeypatch.setattr(ckpt, "write_state", real_write)
    names = os.listdir(out)
    assert "checkpoint-2" in names and "checkpoint-4" not in names
    assert any(n.startswith(".incomplete-checkpoint-4") for n in names)

    b = GRPOTrainer(tiny_model_dir, args=config(out, max_steps=6), train_dataset=digits_dataset(32))
    b.train(resume_from_checkpoint=True)  # the latest *complete* checkpoint: checkpoint-2
    assert b.state.global_step == 6
    names = os.listdir(out)
    assert not any(n.startswith(".incomplete") for n in names)
    assert {"checkpoint-2", "checkpoint-4", "checkpoint-6"} <= set(names)
    assert steps_logged(out) == [1, 2, 3, 4, 5, 6]
    state = json.load(open(os.path.join(out, "checkpoint-4", "rlcore_state.json")))
    assert state["global_step"] == 4 and state["cursor"]["pos"] == 8
