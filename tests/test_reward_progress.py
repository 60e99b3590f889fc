"""Rewards that see training progress (issue #31, TRL #3668): a reward that names ``trainer_state``,
``step`` or ``progress`` gets TRL's ``TrainerState``, the global step and ``step / max_steps`` — in
GRPOTrainer, ``rlcore train``, the loop API's ``Rewards`` and ``rlcore rollout`` (step 0)."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import rlcore  # noqa: E402
from rlcore.rewards import Reward  # noqa: E402


def _args(out: str, **over: Any) -> Any:
    return rlcore.GRPOConfig(output_dir=out, num_generations=2, per_device_train_batch_size=4, max_completion_length=3,
                             max_steps=3, learning_rate=1e-3, save_strategy="no", report_to="none", plots=False,
                             disable_tqdm=True, **over)


def test_trainer_rewards_get_step_progress_and_trainer_state(tmp_path: Any) -> None:
    from rlcore.data.demo import tiny_model_path
    from rlcore.data.tasks import digits_dataset

    seen: dict[str, list[Any]] = {"fn": [], "cls": [], "trl": [], "state": []}

    def curriculum(completions: list[str], step: int, progress: float) -> list[float]:
        seen["fn"].append((step, progress))
        return [progress] * len(completions)

    class Scheduled(Reward):
        name = "scheduled"

        def score(self, completions: list[str], progress: float, trainer_state: Any) -> list[float]:
            seen["cls"].append(progress)
            seen["state"].append(trainer_state.global_step)
            return [0.0] * len(completions)

    def trl_style(completions: list[Any], step: int, **kwargs: Any) -> list[float]:
        seen["trl"].append((step, kwargs["trainer_state"].global_step))
        return [0.0] * len(completions)

    trainer = rlcore.GRPOTrainer(tiny_model_path(), reward_funcs=[curriculum, Scheduled(), trl_style],
                                 args=_args(str(tmp_path / "o")), train_dataset=digits_dataset(8))
    trainer.train()
    assert seen["fn"] == [(0, 0.0), (1, pytest.approx(1 / 3)), (2, pytest.approx(2 / 3))]
    assert seen["cls"] == [0.0, pytest.approx(1 / 3), pytest.approx(2 / 3)]
    assert seen["state"] == [0, 1, 2]
    assert seen["trl"] == [(0, 0), (1, 1), (2, 2)]


def test_a_dataset_column_named_step_wins(tmp_path: Any) -> None:
    from rlcore.rewards import reward_inputs
    from rlcore.types import Trajectory

    t = Trajectory(messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], prompt_ids=[1],
                   data={"step": "s1"})
    assert reward_inputs([t])["step"] == ["s1"]
    assert reward_inputs([t])["progress"] == 0.0


def test_loop_rewards_take_step_and_max_steps() -> None:
    from rlcore.loop import Rewards
    from rlcore.types import Trajectory

    got: list[Any] = []

    def r(completions: list[str], step: int, progress: float, trainer_state: Any) -> list[float]:
        got.append((step, progress, getattr(trainer_state, "global_step", None), getattr(trainer_state, "max_steps", None)))
        return [progress] * len(completions)

    trajs = [Trajectory(messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], prompt_ids=[1])]
    rewards = Rewards([r])
    assert rewards(trajs, step=2, max_steps=8) == [0.25]
    assert rewards(trajs) == [0.0]
    assert got == [(2, 0.25, 2, 8), (0, 0.0, None, None)]
    with pytest.raises(rlcore.ConfigError, match=r"Rewards\(step=-1\)"):
        rewards(trajs, step=-1)


def test_train_cli_and_rollout_cli_pass_step(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from rlcore.commands.cli import _load_commands, cli
    from rlcore.testing.packages import load_in_process

    steps: list[tuple[int, float]] = []

    def by_step(completions: list[str], step: int, progress: float) -> list[float]:
        steps.append((step, progress))
        return [float(step)] * len(completions)

    load_in_process(monkeypatch, "by_step_plugin_t", register_rewards=lambda register: register("by_step_t", by_step))
    _load_commands()
    res = CliRunner().invoke(cli, ["train", "--reward", "by_step_t", "--max_steps", "2", "--num_generations", "2",
                                   "--per_device_train_batch_size", "2", "--max_completion_length", "3",
                                   "--save_strategy", "no", "--output_dir", str(tmp_path / "t"), "--report_to", "none"])
    assert res.exit_code == 0, res.output
    assert steps == [(0, 0.0), (1, 0.5)]
    steps.clear()
    out = tmp_path / "r.jsonl"
    res = CliRunner().invoke(cli, ["rollout", "--limit", "2", "--max-completion-length", "3", "--no-progress",
                                   "--reward", "by_step_t", "--output", str(out)])
    assert res.exit_code == 0, res.output
    assert steps and all(s == (0, 0.0) for s in steps)
    assert all(json.loads(line)["rewards"]["by_step_t"] == 0.0 for line in out.read_text().splitlines())


def test_trainer_state_global_step_per_call_matches_trl(tmp_path: Any) -> None:
    """The same reward under trl.GRPOTrainer and rlcore's: the same ``trainer_state.global_step``
    per call (steps_per_generation=2: a generation every other step, TRL's buffering)."""
    pytest.importorskip("trl")
    from pathlib import Path

    from rlcore.testing import load_script

    lockstep = load_script(Path(__file__).with_name("test_trl_objectives.py"), "trl_objectives_for_progress").lockstep

    calls: dict[str, list[int]] = {"trl": [], "rlcore": []}
    which = {"lib": "trl"}

    def r_state(completion_ids: list[list[int]], trainer_state: Any, **kwargs: Any) -> list[float]:
        calls[which["lib"]].append(int(trainer_state.global_step))
        return [float(len(c) % 4) for c in completion_ids]

    for lib in ("trl", "rlcore"):
        which["lib"] = lib
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lockstep(tmp_path / lib, dict(max_steps=4, steps_per_generation=2, per_device_train_batch_size=4),
                     rewards=(r_state,), libs=(lib,))
    assert calls["trl"] == [0, 2]
    assert calls["rlcore"] == calls["trl"]
