"""``--dataset reasoning_gym:…`` through rlcore's dataset loading: determinism, options, mixes,
one-line errors, and a missing reasoning-gym."""

from __future__ import annotations

import builtins
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import rlcore
from rlcore import DatasetError, MissingDependencyError
from rlcore.data import load_rows


def _entry(row: dict) -> dict:
    """The reasoning-gym entry a row names (what the reward scores against)."""
    from rl_plugin_reasoning_gym.tasks import entry_of

    return entry_of(row["reasoning_gym"])[1]


def test_registered_names() -> None:
    assert "reasoning_gym" in rlcore.available("dataset")
    assert {"reasoning_gym", "reasoning_gym_format"} <= set(rlcore.available("reward"))


def test_rows_are_deterministic_in_the_seed() -> None:
    a = load_rows("reasoning_gym:leg_counting?size=20&seed=3")
    b = load_rows("reasoning_gym:leg_counting", options={"size": 20, "seed": 3})
    c = load_rows("reasoning_gym:leg_counting?size=20&seed=4")
    assert a == b and len(a) == 20
    assert [r["question"] for r in a] != [r["question"] for r in c]
    assert a[5]["reasoning_gym"] == {"task": "leg_counting", "config": {"seed": 3, "size": 20}, "index": 5}
    assert a[0]["prompt"][0]["role"] == "system" and "<answer>" in a[0]["prompt"][0]["content"]
    assert a[0]["prompt"][1] == {"role": "user", "content": a[0]["question"]}
    mix1 = load_rows("reasoning_gym:leg_counting:3,basic_arithmetic:1?size=30&seed=5")
    mix2 = load_rows("reasoning_gym:leg_counting:3,basic_arithmetic:1?size=30&seed=5")
    assert mix1 == mix2


def test_rows_are_the_same_in_a_fresh_process() -> None:
    """Rows depend on the seed only (not on hash seeds or process state): the reward can rebuild them."""
    code = ("from rlcore.data import load_rows; import json; "
            "print(json.dumps(list(load_rows('reasoning_gym:spell_backward,gcd?size=8&seed=9&system_prompt=none'))))")
    import json

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300,
                         env={**__import__("os").environ, "PYTHONHASHSEED": "123"})
    assert json.loads(out.stdout.strip().splitlines()[-1]) == load_rows("reasoning_gym:spell_backward,gcd?size=8&seed=9&system_prompt=none")


def test_rows_are_generated_when_read() -> None:
    """A huge dataset costs nothing up front; a training step pays only for the rows it draws."""
    rows = load_rows("reasoning_gym:leg_counting?size=1000000&seed=3")
    assert len(rows) == 1_000_000 and "1 generated" in repr(rows)  # the core checked the first row's columns
    row = rows[123_456]
    assert "2 generated" in repr(rows) and rows[123_456] is row and rows[-1] == rows[999_999]
    assert row == load_rows("reasoning_gym:leg_counting?size=1000000&seed=3")[123_456]  # same row, generated afresh
    assert rows[:3] == [rows[0], rows[1], rows[2]]
    limited = load_rows("reasoning_gym:gcd?size=50", limit=4)
    assert limited == load_rows("reasoning_gym:gcd?size=50")[:4] and isinstance(limited, list)
    with pytest.raises(IndexError):
        rows[1_000_000]


def test_task_options_and_system_prompt() -> None:
    rows = load_rows("reasoning_gym:leg_counting?size=30&seed=1&min_animals=1&max_animals=1&system_prompt=none")
    assert all("prompt" not in r for r in rows)
    assert all(_entry(r)["metadata"]["num_animals"] == 1 for r in rows)
    assert rows[0]["reasoning_gym"]["config"] == {"min_animals": 1, "max_animals": 1, "seed": 1, "size": 30}
    ds = load_rows("reasoning_gym:leg_counting?size=2", options={"system_prompt": "DeepSeekZero"})
    assert "<think>" in ds[0]["prompt"][0]["content"]


def test_a_weighted_mix() -> None:
    rows = load_rows("reasoning_gym:leg_counting:3,basic_arithmetic:1?size=400&seed=2&leg_counting.max_animals=3")
    counts = Counter(r["reasoning_gym"]["task"] for r in rows)
    assert set(counts) == {"leg_counting", "basic_arithmetic"}
    assert 0.65 < counts["leg_counting"] / 400 < 0.85  # weight 3:1
    legs = [r for r in rows if r["reasoning_gym"]["task"] == "leg_counting"]
    assert legs[0]["reasoning_gym"]["config"]["max_animals"] == 3
    assert all(_entry(r)["metadata"]["num_animals"] <= 3 for r in legs)
    assert [r["reasoning_gym"]["index"] for r in rows] == list(range(400))


def test_a_mix_from_reasoning_gym_yaml(tmp_path: Path) -> None:
    f = tmp_path / "mix.yaml"
    f.write_text("size: 12\nseed: 7\ndatasets:\n"
                 "  - {name: gcd, weight: 1, config: {min_numbers: 2, max_numbers: 2}}\n"
                 "  - {name: spell_backward, weight: 1, config: {}}\n")
    rows = load_rows(f"reasoning_gym:{f}")
    assert len(rows) == 12 and {r["reasoning_gym"]["task"] for r in rows} == {"gcd", "spell_backward"}
    assert len(load_rows(f"reasoning_gym:{f}?size=5")) == 5  # the run's size wins over the file's


@pytest.mark.parametrize(
    ("dataset", "message"),
    [
        ("reasoning_gym:leg_countin", "reasoning_gym has no task 'leg_countin'; close matches: leg_counting"),
        ("reasoning_gym:", "reasoning_gym needs a task"),
        ("reasoning_gym:leg_counting?colour=red", "task 'leg_counting' has no option colour; its options: max_animals"),
        ("reasoning_gym:leg_counting?min_animals=5&max_animals=2", "rejects options"),
        ("reasoning_gym:leg_counting?size=0", "size must be positive"),
        ("reasoning_gym:leg_counting?seed=abc", "seed must be an integer"),
        ("reasoning_gym:gcd,spell_backwrd", "no task 'spell_backwrd'; close matches: spell_backward"),
        ("reasoning_gym:gcd:2,spell_backward?max_animals=3", "must name its task, TASK.FIELD"),
        ("reasoning_gym:gcd:-1,spell_backward", "weight of 'gcd' must be positive"),
    ],
)
def test_bad_input_is_one_line(dataset: str, message: str) -> None:
    with pytest.raises(DatasetError) as err:
        load_rows(dataset)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_missing_reasoning_gym_only_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inject the import failure: the plugin still loads and lists its names; using them says what
    to pip install, in one line."""
    real_import = builtins.__import__

    def no_reasoning_gym(name, *args, **kwargs):
        if name == "reasoning_gym" or name.startswith("reasoning_gym."):
            raise ModuleNotFoundError("No module named 'reasoning_gym'")
        return real_import(name, *args, **kwargs)

    for mod in [m for m in sys.modules if m == "reasoning_gym" or m.startswith("reasoning_gym.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setattr(builtins, "__import__", no_reasoning_gym)
    for mod in [m for m in sys.modules if m.startswith("rl_plugin_reasoning_gym")]:
        monkeypatch.delitem(sys.modules, mod)
    p = rlcore.reload_plugins()
    (rec,) = [r for r in p.list() if r.dist == "rl-plugin-reasoning-gym"]
    assert rec.error is None and rec.components == {"dataset": ["reasoning_gym"], "reward": ["reasoning_gym", "reasoning_gym_format"]}
    expected = "reasoning-gym is not installed: pip install reasoning-gym==0.1.25 (or pip install rl-plugin-reasoning-gym)"
    with pytest.raises(MissingDependencyError) as err:
        load_rows("reasoning_gym:leg_counting")
    assert str(err.value) == expected
    with pytest.raises(MissingDependencyError) as err:
        rlcore.get("reward", "reasoning_gym")()
    assert str(err.value) == expected
