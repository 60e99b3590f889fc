"""A failing run looks like one (issue 14, points 8-9): failed trajectories are left out of reward
means and reported separately; a run whose trajectories keep failing, or whose reward raises on
every sample, stops with one line and a non-zero exit instead of "training" on zeros."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from rlcore.errors import ConfigError, RlcoreError, RunFailedError
from rlcore.data.tasks import digits_dataset
from rlcore.trainer.grpo import GRPOConfig, GRPOTrainer
from rlcore.training.health import RunHealth
from rlcore.training.metrics import rollout_metrics
from rlcore.types import Trajectory


def traj(status: str, reward: float | None, reason: str | None = None) -> Trajectory:
    t = Trajectory(prompt_ids=[1], status=status, reason=reason)
    t.reward = reward
    return t


def test_failed_trajectories_are_not_averaged_in_as_zero() -> None:
    trajs = [traj("ok", 1.0), traj("truncated", 0.5), traj("failed", 0.0, "env down"), traj("failed", 0.0, "env down")]
    m = rollout_metrics(trajs, {"acc": [1.0, 0.5, 0.0, 0.0]}, 0.0)
    assert m["reward"] == pytest.approx(0.75) and m["rewards/acc"] == pytest.approx(0.75)
    assert m["failed_trajectories"] == 2 and m["failed_fraction"] == 0.5
    m = rollout_metrics([traj("failed", 0.0, "x")], {"acc": [0.0]}, 0.0)
    assert m["failed_fraction"] == 1.0 and m["reward"] != m["reward"]  # NaN -> logged as null, not 0.0


def test_health_stops_after_patience_bad_steps_and_resets_on_a_good_one() -> None:
    h = RunHealth(threshold=0.5, patience=3)
    bad = [traj("failed", None, "env step failed: connection refused")] * 3 + [traj("ok", 1.0)]
    good = [traj("ok", 1.0)] * 4
    h.check(bad)
    h.check(bad)
    h.check(good)  # a healthy step in between: the count starts again
    h.check(bad)
    h.check(bad)
    with pytest.raises(RunFailedError, match=r"75% of trajectories failed .* last 3 generation steps; most common reason \(3/3\): env step failed: connection refused"):
        h.check(bad)
    half = [traj("failed", None, "x"), traj("ok", 1.0)]
    for _ in range(10):  # exactly at the threshold is not over it
        RunHealth(0.5, 1).check(half)


def config(out: str, **over: Any) -> GRPOConfig:
    values: dict[str, Any] = dict(
        output_dir=out, reward_funcs=["digits"], num_generations=4, per_device_train_batch_size=8,
        max_completion_length=4, max_steps=8, learning_rate=1e-3, save_strategy="no", seed=0,
        disable_tqdm=True, report_to="none", plots=False,
    )
    values.update(over)
    return GRPOConfig(**values)


def test_a_run_where_every_trajectory_fails_stops(tmp_path: Any, tiny_model_dir: str) -> None:
    """The issue's case (an unreachable env server) by fault injection: a rollout deadline no
    trajectory can meet. Before: 8 steps of loss 0, reward 0.000, 'done', rc 0."""
    out = str(tmp_path)
    trainer = GRPOTrainer(tiny_model_dir, args=config(out, rollout_timeout=1e-6), train_dataset=digits_dataset(16))
    with pytest.raises(RunFailedError, match="100% of trajectories failed .* last 3 generation steps"):
        trainer.train()
    assert trainer.state.global_step == 2  # the third bad generation stopped it before its step
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["failed_fraction"] for r in rows] == [1.0, 1.0] and all(r["reward"] is None for r in rows)


def test_a_reward_that_raises_on_every_sample_stops_the_run(tmp_path: Any, tiny_model_dir: str) -> None:
    """Stops at once (the trainer's reward check), with the reward's name and error."""

    def broken_reward(completions: list[str], **kwargs: Any) -> list[float]:
        raise KeyError("solution")

    trainer = GRPOTrainer(tiny_model_dir, broken_reward, args=config(str(tmp_path), reward_funcs=[]),
                          train_dataset=digits_dataset(16))
    with pytest.raises(RlcoreError, match="broken_reward.*KeyError"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_the_cli_exits_non_zero_with_one_line(tmp_path: Any, capsys: Any) -> None:
    from rlcore.commands.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["train", "--rollout_timeout", "0.000001", "--max_steps", "6", "--output_dir", str(tmp_path / "o"),
              "--failure_patience", "2", "--save_strategy", "no"])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()[-1]
    assert err.startswith("Error: 100% of trajectories failed") and "last 2 generation steps" in err
    assert "reward (first 10% → last 10%)" not in captured.out  # no "done" summary


def test_failure_settings_are_checked(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="failure_threshold"):
        config(str(tmp_path), failure_threshold=1.5)
    with pytest.raises(ConfigError, match="failure_patience"):
        config(str(tmp_path), failure_patience=0)


def test_plots_of_a_run_where_everything_failed_warn_about_nothing(tmp_path) -> None:
    """A run stopped because every trajectory failed logs no reward: its plot printed matplotlib's
    'No artists with labels found to put in legend' warning next to the one-line error."""
    import json
    import warnings

    from rlcore.training.plots import write_plots

    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "reward": None, "failed_trajectories": 8.0}) + "\n" for s in (1, 2, 3)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        paths = write_plots(str(tmp_path))
    assert [p.rsplit("/", 1)[-1] for p in paths] == ["reward.png", "completion_length.png"]
    assert all((tmp_path / "plots" / name).stat().st_size > 1000 for name in ("reward.png", "completion_length.png"))


def test_a_run_whose_rewards_score_nothing_stops(tmp_path: Any, tiny_model_dir: str) -> None:
    """A reward giving None (or NaN) for every sample trained on nothing for the whole run, logged
    reward null and ended 'done' with exit 0; now it stops after failure_patience steps."""
    h = RunHealth(threshold=0.5, patience=2)
    unscored, scored = [traj("ok", None)] * 4, [traj("ok", None)] * 3 + [traj("ok", 0.0)]
    h.check(unscored)
    h.check(scored)  # one scored trajectory is a learning signal: the count starts again
    h.check(unscored)
    with pytest.raises(RunFailedError, match="no reward scored any trajectory .* last 2 generation steps"):
        h.check(unscored)

    def nothing(completions: list[str]) -> list[float]:
        return [float("nan")] * len(completions)

    trainer = GRPOTrainer(tiny_model_dir, nothing, args=config(str(tmp_path), reward_funcs=[]),
                          train_dataset=digits_dataset(16))
    with pytest.raises(RunFailedError, match="no reward scored any trajectory"):
        trainer.train()
    assert trainer.state.global_step == 2


def test_the_cli_shows_where_a_reward_raised_before_its_one_line(tmp_path: Any, capsys: Any, monkeypatch) -> None:
    """The line says "its traceback is above", but the CLI printed only the line: the user could not
    see where their reward broke. Now the reward's own frames come first, rlcore's left out."""
    import sys
    import types

    from rlcore.commands.cli import main
    from rlcore.testing.packages import load_in_process

    def fragile_reward_t(completions: list[str]) -> list[float]:
        return [{}["solution"] for _ in completions]  # the bug the user must find

    load_in_process(monkeypatch, "fragile_reward_plugin_t",
                    register_rewards=lambda register: register("fragile_reward_t", fragile_reward_t))
    with pytest.raises(SystemExit) as exc:
        main(["train", "--reward", "fragile_reward_t", "--max_steps", "2", "--output_dir", str(tmp_path / "o")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("Error: reward 'fragile_reward_t' raised on all") and "traceback is above" in err[-1]
    shown = "\n".join(err[:-1])
    assert "in fragile_reward_t" in shown and "[\"solution\"]" in shown and "KeyError: 'solution'" in shown
    assert "rlcore/" not in shown.replace("rlcore's", "")  # none of rlcore's own frames


@pytest.mark.parametrize("logs, shown", [
    ({"reward": 0.5, "completion_length": 7.5, "num_turns": 1, "completions/mean_length": 7.5}, "reward 0.500 · len 7.5"),
    # multi-turn: completion_length counts observations too; the bar shows turns and sampled tokens
    ({"reward": 0.25, "completion_length": 200.0, "num_turns": 4.5, "completions/mean_length": 18.0},
     "reward 0.250 · turns 4.5 · sampled 18.0"),
])
def test_the_progress_bar_shows_what_the_model_sampled(logs: dict, shown: str) -> None:
    from transformers import TrainerState

    from rlcore.training.step_progress import RichProgressCallback

    bar, state = RichProgressCallback(), TrainerState(max_steps=3)
    bar.on_train_begin(None, state, None)
    try:
        bar.on_log(None, state, None, logs=logs)
        assert bar.progress.tasks[0].fields["info"] == shown
    finally:
        bar.stop()
