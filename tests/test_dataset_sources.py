"""Dataset sources (the ``register_datasets`` hook): ``--dataset SOURCE:SPEC?key=value`` anywhere a
dataset path goes, options merged from the query and ``--dataset-options``, one-line errors."""

from __future__ import annotations

import sys
import types
from collections.abc import Sequence
from typing import Any

import pytest

from rlcore import DatasetError, UnknownComponentError, hookimpl
from rlcore.data import load_rows, parse_dataset_options, parse_dataset_source, rows_from_source
from rlcore.plugins import Plugins
from rlcore.data.tasks import digits_dataset


def _plugin(name: str, **hooks: Any) -> str:
    mod = types.ModuleType(name)
    for k, v in hooks.items():
        setattr(mod, k, v)
    sys.modules[name] = mod
    return name


def _countdown(spec: str, start: int = 3, step: int = 1, tag: str = "x") -> list[dict[str, Any]]:
    """A third-party source: ``countdown:LABEL?start=5&step=2``."""
    return [{"question": f"{spec} {tag} {n}?", "answer": str(n)} for n in range(start, 0, -step)]


def test_register_datasets_adds_a_source_the_core_resolves() -> None:
    @hookimpl
    def register_datasets(register):
        register("countdown", _countdown)

    p = Plugins(allow=[], builtins=[_plugin("ds_plugin_t", register_datasets=register_datasets)])
    assert p.available("dataset") == ["countdown"]
    name, spec, options = parse_dataset_source("countdown:go?start=5&step=2&tag=hi", registry=p)
    assert (name, spec, options) == ("countdown", "go", {"start": 5, "step": 2, "tag": "hi"})  # JSON-parsed values
    rows = rows_from_source(name, spec, {**options, "step": 1}, registry=p)  # run options win over the query
    assert [r["answer"] for r in rows] == ["5", "4", "3", "2", "1"] and rows[0]["question"] == "go hi 5?"


def test_a_source_that_raises_is_one_line_naming_it() -> None:
    def broken(spec: str, **options: Any) -> list[dict[str, Any]]:
        raise ValueError(f"cannot make {spec}\nsecond line of detail")

    def not_rows(spec: str) -> Any:
        return "rows"

    @hookimpl
    def register_datasets(register):
        register("broken", broken)
        register("notrows", not_rows)

    p = Plugins(allow=[], builtins=[_plugin("ds_broken_t", register_datasets=register_datasets)])
    with pytest.raises(DatasetError) as err:
        rows_from_source("broken", "abc", {}, registry=p)
    assert str(err.value) == "dataset source 'broken' (rlcore) failed on 'abc': ValueError: cannot make abc"
    with pytest.raises(DatasetError, match=r"'notrows'.*must return a list \(or sequence\) of row dicts, got str"):
        rows_from_source("notrows", "", {}, registry=p)
    # an option the source does not take is the source's error (TypeError), reported the same way
    with pytest.raises(DatasetError, match="failed on '': TypeError"):
        rows_from_source("notrows", "", {"size": 3}, registry=p)


class LazyRows(Sequence):
    """Rows made when read, recording which were."""

    def __init__(self, n: int) -> None:
        self.n, self.read = n, set()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if not 0 <= i < self.n:
            raise IndexError(i)
        self.read.add(i)
        return {"question": f"q{i}", "answer": str(i)}


def test_a_lazy_source_stays_lazy_through_loading_and_the_trainer_rows() -> None:
    from rlcore.data.cursor import as_rows, check_columns

    made: list[LazyRows] = []

    @hookimpl
    def register_datasets(register):
        register("lazy", lambda spec, n=10: made.append(LazyRows(int(n))) or made[-1])

    p = Plugins(allow=[], builtins=[_plugin("ds_lazy_t", register_datasets=register_datasets)])
    rows = rows_from_source("lazy", "", {"n": 1_000_000}, registry=p)
    assert rows is made[-1] and as_rows(rows) is rows and check_columns(rows)
    assert rows.read == {0}  # only the first row was looked at
    assert rows_from_source("lazy", "", {"n": 5}, registry=p)[2:4] == [{"question": "q2", "answer": "2"}, {"question": "q3", "answer": "3"}]


def test_builtin_rlcore_source_through_load_rows() -> None:
    assert load_rows("rlcore:digits?n=16&seed=4") == digits_dataset(16, 4)
    assert load_rows("rlcore:digits", options={"n": 5, "seed": 4}) == digits_dataset(5, 4)
    assert load_rows("rlcore:digits?n=5&seed=1", options={"seed": 4}) == digits_dataset(5, 4)
    assert load_rows("rlcore:arithmetic") == load_rows(None)
    with pytest.raises(DatasetError, match="rlcore:digits has no option size; its options: n, seed, max_operand"):
        load_rows("rlcore:digits?size=3")
    with pytest.raises(DatasetError, match="built-in ones are: rlcore:digits, rlcore:arithmetic"):
        load_rows("rlcore:nope")


def test_not_a_source(tmp_path) -> None:
    assert parse_dataset_source("openai/gsm8k:main") is None  # a datasets name with a config
    assert parse_dataset_source("gsm8k") is None
    f = tmp_path / "rows.jsonl"
    f.write_text('{"question": "q", "answer": "a"}\n')
    assert parse_dataset_source(str(f)) is None
    with pytest.raises(DatasetError, match="apply only to a registered dataset source"):
        load_rows(str(f), options={"size": 3})


def test_a_source_from_a_plugin_that_is_not_loaded_names_the_package() -> None:
    """Core tests load built-ins only: rl-plugin-reasoning-gym is installed (requirements-dev.txt) but
    not in RLCORE_PLUGINS, and its metadata (rlcore.components entry points) names it in one line."""
    from rlcore.plugins import provider_of

    assert provider_of("reasoning_gym") == "rl-plugin-reasoning-gym", (
        "rl-plugin-reasoning-gym's installed metadata declares no rlcore.components: reinstall it "
        "(pip install -e plugins/rewards/rl-plugin-reasoning-gym, or pip install -r requirements-dev.txt)")
    with pytest.raises(UnknownComponentError) as err:
        load_rows("reasoning_gym:leg_counting")
    msg = str(err.value)
    assert msg.startswith("no dataset named 'reasoning_gym'") and "rl-plugin-reasoning-gym" in msg and "\n" not in msg


def test_parse_dataset_options() -> None:
    assert parse_dataset_options("size=2000,seed=3,name=x") == {"size": 2000, "seed": 3, "name": "x"}
    assert parse_dataset_options('{"size": 2, "config": {"a": [1, 2]}}') == {"size": 2, "config": {"a": [1, 2]}}
    assert parse_dataset_options({"size": 2}) == {"size": 2}
    assert parse_dataset_options(None) == {} and parse_dataset_options("") == {}
    with pytest.raises(DatasetError, match="'size' is not key=value"):
        parse_dataset_options("size")
    with pytest.raises(DatasetError, match="not valid JSON"):
        parse_dataset_options("{size")


def test_rlcore_train_plan_reads_a_source_with_flag_options() -> None:
    from rlcore.commands.train import build_plan

    plan = build_plan(["--dataset", "rlcore:digits?n=16", "--dataset-options", "seed=4", "--reward", "digits",
                       "--max_steps", "1", "--report_to", "none"])
    assert plan.rows == digits_dataset(16, 4) and plan.task == "rlcore:digits?n=16"
    with pytest.raises(Exception, match="--dataset-options needs --dataset"):
        build_plan(["--dataset-options", "seed=4"])
