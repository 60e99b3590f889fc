"""The shaping rewards' formulas, math-verify's LaTeX handling, options, and error isolation."""

from __future__ import annotations

import math

import pytest

import rlcore
from rlcore.asyncutil import run_sync
from rlcore.errors import ConfigError
from rlcore.rewards import as_reward, compute_rewards
from rl_plugin_math import is_correct
from rl_plugin_math.cosine import Cosine
from rl_plugin_math.gsm8k import GSM8KFormat
from rl_plugin_math.mathverify import math_accuracy
from rl_plugin_math.overlong import SoftOverlong
from rl_plugin_math.repetition import Repetition

NAMES = ["gsm8k_accuracy", "gsm8k_format", "math_accuracy", "cosine", "repetition", "soft_overlong"]


def test_plugin_registers_every_reward_by_name() -> None:
    assert set(NAMES) <= set(rlcore.available("reward"))
    rec = next(r for r in rlcore.plugins().list() if r.dist == "rl-plugin-math")
    assert rec.error is None and sorted(rec.components["reward"]) == sorted(NAMES)
    for name in NAMES:  # every factory resolves and wraps into a compute_reward hook
        assert as_reward(name, rlcore.get("reward", name)).name == name


def test_cosine_formula_and_options() -> None:
    c = Cosine(max_len=100)
    assert c.value(True, 0) == pytest.approx(1.0) and c.value(True, 100) == pytest.approx(0.5)
    assert c.value(False, 0) == pytest.approx(-0.5) and c.value(False, 100) == pytest.approx(0.0)
    assert c.value(True, 50) == pytest.approx(0.75) and c.value(True, 500) == pytest.approx(0.5)  # clipped
    assert c.value(True, 10) > c.value(True, 60) and c.value(False, 10) < c.value(False, 60)
    got = c(completions=["#### 7", "#### 8", "#### 7"], completion_ids=[[0] * 0, [0] * 100, [0] * 50], answer=["7", "7", None])
    assert got == [pytest.approx(1.0), pytest.approx(0.0), None]  # None: row without a reference
    strict = Cosine(max_len=10, accuracy=lambda text, ref: text.strip() == ref)  # a user accuracy function
    assert strict(completions=["#### 7"], completion_ids=[[1]], answer=["7"])[0] < 0
    with pytest.raises(ConfigError):
        Cosine(max_len=0)


def test_repetition_penalty() -> None:
    r = Repetition(n=3, max_penalty=-1.0)
    assert r.value("the cat sat on the mat today") == 0.0
    looped = "i made a mistake " * 50
    assert -1.0 < r.value(looped) < -0.9
    assert r.value("too short") == 0.0 and r.value("") == 0.0
    half = "a b c d e f a b c d e f"  # 10 trigrams, 6 unique -> -0.4
    assert r.value(half) == pytest.approx(-0.4)
    assert Repetition(n=1, max_penalty=-2.0).value("x x x x") == pytest.approx(-1.5)
    with pytest.raises(ConfigError):
        Repetition(max_penalty=0.5)


def test_soft_overlong_is_dapo_eq13() -> None:
    s = SoftOverlong(max_len=100, cache_len=20)
    assert [s.value(n) for n in (0, 80, 90, 100, 150)] == [0.0, 0.0, -0.5, -1.0, -1.0]
    assert s(completion_ids=[[0] * 85]) == [pytest.approx(-0.25)]
    with pytest.raises(ConfigError):
        SoftOverlong(max_len=10, cache_len=20)


def test_format_tags_mode() -> None:
    f = GSM8KFormat(mode="tags")
    assert f.score(["<think>3 + 4 = 7</think>\n<answer>7</answer>"]) == [1.0]
    assert f.score(["<think></think><answer>7</answer>"]) == [0.0]  # empty thinking
    assert f.score(["<think>a</think><answer>7</answer><answer>8</answer>"]) == [0.0]
    assert f.score(["7 #### 7"]) == [0.0]
    with pytest.raises(ConfigError):
        GSM8KFormat(mode="xml")  # type: ignore[arg-type]


def test_math_accuracy_is_latex_aware() -> None:
    got = math_accuracy(
        completions=[
            "so the answer is $\\boxed{\\frac{1}{2}}$",
            "we get $\\boxed{0.5}$",
            "thus $x \\in \\boxed{[0, 1)}$",
            "the answer is $\\boxed{\\frac{1}{3}}$",
            "anything",
        ],
        solution=["$\\frac{1}{2}$", "$\\frac{1}{2}$", "$[0,1)$", "$\\frac{1}{2}$", None],
    )
    assert got == [1.0, 1.0, 1.0, 0.0, None]
    assert is_correct("$\\boxed{\\sqrt{2}/2}$", "$\\frac{\\sqrt{2}}{2}$") is True
    assert is_correct("#### 18", "#### 18") is True and is_correct("#### 19", "18") is False


def test_a_raising_sample_gives_none_and_is_counted(make_traj) -> None:
    """A row with a broken reference (a list, not text) raises inside the reward; rlcore retries
    sample by sample, so that one trajectory gets None, the others are scored, and it is counted."""
    rows = [{"answer": "#### 3"}, {"answer": ["3"]}, {"answer": "#### 4"}]
    trajs = [make_traj("#### 3", row) for row in rows]
    acc = as_reward("gsm8k_accuracy", rlcore.get("reward", "gsm8k_accuracy"))
    cos = as_reward("cosine", rlcore.get("reward", "cosine"))
    cols = run_sync(compute_rewards(rlcore.RunHooks(acc, cos, observers=False), trajs))
    assert cols["gsm8k_accuracy"] == [1.0, None, 0.0]
    assert cols["cosine"][1] is None and cols["cosine"][0] > 0 > cols["cosine"][2]
    assert acc.errors == 1 and cos.errors == 1
    assert trajs[1].reward is None and trajs[0].reward is not None and math.isfinite(trajs[0].reward)


async def test_compute_reward_hook_of_a_reward_object(make_traj) -> None:
    """Each registered reward, wrapped, implements the ``compute_reward`` hook: one named column."""
    fmt = as_reward("gsm8k_format", GSM8KFormat(mode="tags"))
    trajs = [make_traj("<think>a</think><answer>7</answer>"), make_traj("7")]
    assert await fmt.compute_reward(trajectories=trajs) == {"gsm8k_format": [1.0, 0.0]}
    over = as_reward("soft_overlong", SoftOverlong(max_len=10, cache_len=5))
    assert await over.compute_reward(trajectories=[make_traj("x", n_tokens=8)]) == {"soft_overlong": [pytest.approx(-0.6)]}
