"""Issue 35 item 4: a reward that gives ±inf for a sample is a reward error of that sample (``None``,
counted in ``reward_errors/NAME``, said once); ±inf on every sample stops the run like a reward that
raises on all. Huge finite rewards (±1e308) no longer crash the metrics, and metrics.jsonl is
strict JSON (no ``Infinity``/``NaN`` tokens). Checked through GRPOTrainer, ``rlcore train`` with an
installed reward plugin, and the loop API's ``Rewards``."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import pytest

from rlcore.asyncutil import run_sync
from rlcore.errors import RewardFunctionError
from rlcore.data.tasks import digits_dataset
from rlcore.testing.packages import write_site_plugin
from rlcore.trainer.grpo import GRPOConfig, GRPOTrainer
from rlcore.training.metrics import append_jsonl, rollout_metrics
from rlcore.types import Trajectory


def strict_rows(out: Path) -> list[dict[str, Any]]:
    """Every line of metrics.jsonl, parsed as strict JSON (``Infinity``/``NaN`` tokens fail)."""
    def refuse(token: str) -> Any:
        raise AssertionError(f"metrics.jsonl holds the non-JSON token {token}")

    return [json.loads(line, parse_constant=refuse) for line in (out / "metrics.jsonl").read_text().splitlines()]


def config(out: Path, **over: Any) -> GRPOConfig:
    values: dict[str, Any] = dict(
        output_dir=str(out), reward_funcs=[], num_generations=4, per_device_train_batch_size=8,
        max_completion_length=4, max_steps=2, learning_rate=1e-3, save_strategy="no", seed=0,
        disable_tqdm=True, report_to="none", plots=False,
    )
    values.update(over)
    return GRPOConfig(**values)


def test_inf_on_half_the_samples_is_counted_and_the_rest_still_train(tmp_path: Path, tiny_model_dir: str,
                                                                     caplog: Any) -> None:
    """Before: rc 0, ``reward: Infinity`` in metrics.jsonl, loss 0 and grad_norm 0 every step."""

    def half_inf(completions: list[str]) -> list[float]:
        return [math.inf if i % 2 else float(i % 4) for i in range(len(completions))]  # 0 and 2 in each group

    trainer = GRPOTrainer(tiny_model_dir, half_inf, args=config(tmp_path), train_dataset=digits_dataset(16))
    with caplog.at_level(logging.WARNING):
        trainer.train()
    rows = strict_rows(tmp_path)
    assert len(rows) == 2
    for r in rows:
        assert r["reward_errors/half_inf"] == 4.0
        assert r["reward"] == pytest.approx(1.0) and r["rewards/half_inf"] == pytest.approx(1.0)
        assert r["grad_norm"] > 0  # the finite half still carries a learning signal
    said = [rec.getMessage() for rec in caplog.records if "half_inf" in rec.getMessage()]
    assert said == ["reward 'half_inf' returned inf on 4 of 8 samples; they get no reward (counted in "
                    "reward_errors/half_inf) — a reward returns a finite number (or None) per completion"]


def test_one_inf_in_a_batch_does_not_make_the_step_reward_inf(tmp_path: Path, tiny_model_dir: str) -> None:
    """Before: one inf in the batch kept ``reward`` at inf every step (and -inf the std NaN)."""

    def one_inf(completions: list[str]) -> list[float]:
        return [-math.inf if i == 0 else float(i % 2) for i in range(len(completions))]

    GRPOTrainer(tiny_model_dir, one_inf, args=config(tmp_path), train_dataset=digits_dataset(16)).train()
    for r in strict_rows(tmp_path):
        assert r["reward_errors/one_inf"] == 1.0
        assert r["reward"] == pytest.approx(4 / 7) and math.isfinite(r["reward_std"])


def test_inf_on_every_sample_stops_the_run_like_a_reward_that_raises(tmp_path: Path, tiny_model_dir: str) -> None:
    def always_inf(completions: list[str]) -> list[float]:
        return [math.inf if i % 3 else -math.inf for i in range(len(completions))]

    trainer = GRPOTrainer(tiny_model_dir, always_inf, args=config(tmp_path), train_dataset=digits_dataset(16))
    with pytest.raises(RewardFunctionError) as exc:
        trainer.train()
    assert str(exc.value) == ("reward 'always_inf' returned inf or -inf on all 8 samples; a reward returns a finite "
                              "number (or None) per completion — fix the reward function")
    assert exc.value.__cause__ is None  # no traceback to show: nothing raised
    assert trainer.state.global_step == 0


def test_a_reward_that_raises_on_some_samples_and_is_inf_on_the_rest_stops_the_run(tmp_path: Path,
                                                                                   tiny_model_dir: str) -> None:
    calls = {"n": 0}

    def mixed(completions: list[str]) -> list[float]:
        calls["n"] += 1
        if len(completions) > 1 or calls["n"] % 2:  # the batch raises; retried per sample, every other one does
            raise KeyError("solution")
        return [math.inf]

    trainer = GRPOTrainer(tiny_model_dir, mixed, args=config(tmp_path), train_dataset=digits_dataset(16))
    with pytest.raises(RewardFunctionError) as exc:
        trainer.train()
    message = str(exc.value)
    assert message == ("reward 'mixed' raised on 4 and returned inf on 4 of 8 samples (KeyError: 'solution'); a reward "
                       "returns a finite number (or None) per completion — fix the reward function (its traceback is above)")
    assert isinstance(exc.value.__cause__, KeyError)


def test_huge_finite_rewards_do_not_crash_the_metrics(tmp_path: Path, tiny_model_dir: str) -> None:
    """Before: ±1e308 raised OverflowError in metrics._std and ended the run."""

    def huge(completions: list[str]) -> list[float]:
        return [1e308 if i % 2 else -1e308 for i in range(len(completions))]

    GRPOTrainer(tiny_model_dir, huge, args=config(tmp_path), train_dataset=digits_dataset(16)).train()
    rows = strict_rows(tmp_path)
    assert len(rows) == 2
    for r in rows:
        assert r["reward"] == 0.0 and r["reward_errors/huge"] == 0.0
        assert r["reward_std"] == pytest.approx(math.sqrt(8 / 7) * 1e308)
        assert r["rewards/huge/std"] == pytest.approx(math.sqrt(8 / 7) * 1e308)


def test_a_metric_beyond_the_float_range_is_logged_as_null(tmp_path: Path) -> None:
    """Any inf or NaN (a reward's own log_metric, a mean of huge values) is written as null."""
    trajs = []
    for v in (1.7e308, 1.7e308):
        t = Trajectory(prompt_ids=[1])
        t.reward = v
        trajs.append(t)
    m = rollout_metrics(trajs, {"r": [1.7e308, 1.7e308]}, 0.0)
    assert m["reward"] == 1.7e308 and m["reward_std"] == 0.0
    append_jsonl(str(tmp_path), {"step": 1, **m, "mine": math.inf, "nested": [math.nan, 1.0], "neg": -math.inf})
    (row,) = strict_rows(tmp_path)
    assert row["mine"] is None and row["neg"] is None and row["nested"] == [None, 1.0] and row["reward"] == 1.7e308


PLUGIN = """
import math
import rlcore

def inf_some(completions):
    return [math.inf if i % 4 == 0 else float(i % 2) for i in range(len(completions))]

def inf_all(completions):
    return [math.inf] * len(completions)

@rlcore.hookimpl
def register_rewards(register):
    register("inf_some", inf_some)
    register("inf_all", inf_all)
"""


@pytest.fixture
def inf_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reward plugin installed as an installer would (module + dist-info) in a site directory."""
    import rlcore.plugins

    site = write_site_plugin(tmp_path / "site", "rl-plugin-infreward", "infreward_plugin", PLUGIN)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("RLCORE_PLUGINS", "rl-plugin-infreward")
    rlcore.plugins.reload_plugins()
    yield
    monkeypatch.undo()
    rlcore.plugins.reload_plugins()


def test_rlcore_train_counts_an_installed_rewards_inf_samples(tmp_path: Path, inf_plugin: None, capsys: Any,
                                                              caplog: Any) -> None:
    from rlcore.commands.cli import main

    out = tmp_path / "o"
    with caplog.at_level(logging.WARNING):
        main(["train", "--reward", "inf_some", "--max_steps", "2", "--output_dir", str(out)])
    assert "done" in capsys.readouterr().out
    rows = strict_rows(out)
    assert [r["reward_errors/inf_some"] for r in rows] == [8.0, 8.0]  # 32 samples, every 4th inf
    assert all(r["reward"] == pytest.approx(16 / 24) for r in rows)
    assert sum("reward 'inf_some' returned inf on 8 of 32 samples" in rec.getMessage() for rec in caplog.records) == 1


def test_rlcore_train_stops_with_one_line_when_a_reward_is_inf_everywhere(tmp_path: Path, inf_plugin: None,
                                                                        capsys: Any) -> None:
    from rlcore.commands.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["train", "--reward", "inf_all", "--max_steps", "2", "--output_dir", str(tmp_path / "o")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("Error: reward 'inf_all' returned inf on all 32 samples; a reward returns a finite number "
                       "(or None) per completion — fix the reward function")
    assert not any("Traceback" in line for line in err)


def test_the_loop_apis_rewards_score_an_inf_sample_none_and_count_it() -> None:
    from rlcore.loop import Rewards

    def capped(completions: list[str]) -> list[float]:
        return [math.inf if c == "boom" else float(len(c)) for c in completions]

    trajs = []
    for text in ("ab", "boom", "abc"):
        t = Trajectory(prompt_ids=[1], messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": text}])
        trajs.append(t)
    rewards = Rewards([capped])
    assert rewards(trajs) == [2.0, None, 3.0]
    assert rewards.columns == {"capped": [2.0, None, 3.0]}
    assert rewards.rewards[0].errors == 1


def test_a_plugins_own_compute_reward_hook_cannot_pass_inf_through(caplog: Any) -> None:
    """A reward with its own ``compute_reward`` (not scored per sample by rlcore) gets its infs
    dropped as well, with a line."""
    import rlcore
    from rlcore.plugins import RunHooks
    from rlcore.rewards import compute_rewards

    class OwnHook:
        @rlcore.hookimpl
        def compute_reward(self, trajectories: list[Trajectory]) -> dict[str, list[float | None]]:
            return {"own_hook_inf": [1.0, math.inf][: len(trajectories)]}

    trajs = [Trajectory(prompt_ids=[1]), Trajectory(prompt_ids=[2])]
    with caplog.at_level(logging.WARNING):
        columns = run_sync(compute_rewards(RunHooks(OwnHook()), trajs))
    assert columns == {"own_hook_inf": [1.0, None]} and [t.reward for t in trajs] == [1.0, None]
    assert any("reward 'own_hook_inf' returned inf for 1 of 2 samples" in rec.getMessage() for rec in caplog.records)
