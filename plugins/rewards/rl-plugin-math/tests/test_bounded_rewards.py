"""Nothing a model writes stalls a math reward (issue 14): math-verify runs in a worker process
that is killed at the deadline, a timed-out sample scores 0.0 and is counted; GSM8K parsing is
linear time and exact on answers too big for a float."""

from __future__ import annotations

import time

import pytest

import rlcore
from rlcore.asyncutil import run_sync
from rlcore.errors import ConfigError
from rlcore.rewards import as_reward, compute_rewards
from rl_plugin_math import accuracy
from rl_plugin_math.cosine import Cosine
from rl_plugin_math.gsm8k import GSM8KFormat, gsm8k_accuracy
from rl_plugin_math.mathverify import MathAccuracy

TOWER = "The answer is \\boxed{9^{9^{9^{9}}}}"


def _pid_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().split()[2] == "Z"
    except FileNotFoundError:
        return True


def test_a_tower_in_a_reward_thread_scores_zero_within_the_bound_and_is_counted(make_traj) -> None:
    """The issue's case: rewards run in worker threads, where math-verify's own signal-based
    timeout is off; before, this ran > 90 s. Now the worker is killed at 1 s."""
    reward = as_reward("math_accuracy", rlcore.get("reward", "math_accuracy")(timeout=1.0))
    assert isinstance(reward, MathAccuracy)
    run_sync(compute_rewards(rlcore.RunHooks(reward, observers=False), [make_traj("\\boxed{1}", {"solution": "1"})]))
    pid = accuracy._math_worker()._proc.pid  # type: ignore[union-attr]
    trajs = [make_traj(TOWER, {"solution": "3"}), make_traj("\\boxed{\\frac{1}{2}}", {"solution": "0.5"})]
    t0 = time.monotonic()
    cols = run_sync(compute_rewards(rlcore.RunHooks(reward, observers=False), trajs))  # scored in a thread
    assert time.monotonic() - t0 < 30
    assert cols["math_accuracy"] == [0.0, 1.0]
    assert reward.timeouts == 1 and reward.errors == 0
    assert _pid_gone(pid)  # the work really stopped


def test_the_sample_timeout_is_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLCORE_SAMPLE_TIMEOUT", "0.5")
    assert accuracy.default_timeout() == 0.5
    t0 = time.monotonic()
    assert accuracy.math_verify_correct(TOWER, "3") is False
    assert time.monotonic() - t0 < 20
    with pytest.raises(ConfigError, match="timeout"):
        MathAccuracy(timeout=0)
    with pytest.raises(ConfigError, match="timeout"):
        Cosine(timeout=-1)
    cos = Cosine(timeout=0.5)
    got = cos.score(completions=[TOWER], completion_ids=[[1]], solution=["$\\pi$"])  # no number in it: math-verify
    assert got == [pytest.approx(-0.5, abs=1e-3)]
    assert cos.timeouts == 1


def test_gsm8k_accuracy_is_exact_on_a_400_digit_answer() -> None:
    """Before: ``OverflowError`` (float() of the Fraction) -> None and an error count."""
    big = "9" * 400 + ".5"
    assert gsm8k_accuracy(["#### " + big], [big]) == [1.0]
    assert gsm8k_accuracy(["#### " + "9" * 399 + ".5"], [big]) == [0.0]
    assert gsm8k_accuracy(["#### 0.333333"], ["1/3"]) == [1.0]  # the relative tolerance still holds


def test_quadratic_patterns_are_gone() -> None:
    """Unclosed-tag floods made the old lazy regexes quadratic (minutes on a megabyte)."""
    t0 = time.monotonic()
    assert gsm8k_accuracy(["<answer>" * 200_000], ["5"]) == [0.0]
    assert gsm8k_accuracy(["\\text{" * 150_000 + "5"], ["5"]) == [1.0]
    assert GSM8KFormat().score(["x" + "\n" * 300_000 + "#"]) == [0.0]
    assert GSM8KFormat(mode="tags").score(["<think>x" + "</think>" * 100_000]) == [0.0]
    assert time.monotonic() - t0 < 20
    fmt = GSM8KFormat()  # the shape rules are unchanged
    assert fmt.score(["3 + 4 = 7\n#### 7", "reasoning\n\n  #### $1,000.", "#### 7", "7\n#### 7 apples", "a\n#### 5\n#### 6"]) == \
        [1.0, 1.0, 0.0, 0.0, 1.0]
