"""reasoning-gym access shared by the dataset source and the rewards: the import (with the install
hint when it is missing), task-name checks with close matches, and caches of task instances and
generated entries.

A row names its entry by ``(task, config, index)``: the task's generator is deterministic in its
config (which includes ``seed`` and ``size``), so the reward can always rebuild the entry that
``score_answer`` needs. Entries generated in this process are cached, so scoring during a run
never regenerates them.
"""

from __future__ import annotations

import difflib
import json
import threading
from typing import Any

from rlcore.errors import DatasetError, MissingDependencyError

#: the version rows are generated with (the package pins it; see pyproject.toml)
PINNED = "0.1.25"
INSTALL_HINT = f"reasoning-gym is not installed: pip install reasoning-gym=={PINNED} (or pip install rl-plugin-reasoning-gym)"
#: reasoning-gym registers its composite under a task name; we build composites from a spec instead
_NOT_TASKS = frozenset({"composite"})

_lock = threading.Lock()
_datasets: dict[tuple[str, str], Any] = {}
_entries: dict[tuple[str, str, int], dict[str, Any]] = {}
_keys: dict[int, tuple[dict[str, Any], str]] = {}
_MAX_CACHED_ENTRIES = 200_000


def import_reasoning_gym() -> Any:
    """The ``reasoning_gym`` module, or one line saying how to install it."""
    try:
        import reasoning_gym
        import reasoning_gym.composite  # noqa: F401 - CompositeDataset, used for weighted mixes
    except ImportError as exc:
        raise MissingDependencyError(INSTALL_HINT) from exc
    return reasoning_gym


def task_names() -> list[str]:
    """Every task family reasoning-gym registers (about a hundred)."""
    rg = import_reasoning_gym()
    return sorted(n for n in rg.factory.DATASETS if n not in _NOT_TASKS)


def check_task(name: str) -> None:
    """One line naming an unknown task and its closest names."""
    names = task_names()
    if name in names:
        return
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
    hint = f"close matches: {', '.join(close)}" if close else "no close match"
    raise DatasetError(
        f"reasoning_gym has no task {name!r}; {hint} ({len(names)} tasks: python -c "
        f"\"import reasoning_gym; print(sorted(reasoning_gym.factory.DATASETS))\")"
    )


def config_key(config: dict[str, Any]) -> str:
    """A stable text key of a config. Rows of one dataset share one config dict, so the key is
    remembered per dict object (held here, so its id cannot be reused while cached)."""
    hit = _keys.get(id(config))
    if hit is not None and hit[0] is config:
        return hit[1]
    key = json.dumps(config, sort_keys=True, default=str)
    with _lock:
        if len(_keys) >= 10_000:
            _keys.clear()
        _keys[id(config)] = (config, key)
    return key


def make_dataset(task: str, config: dict[str, Any], key: str | None = None) -> Any:
    """A task instance for ``config`` (``seed``, ``size`` and the task's own fields), cached.

    A field the task's config does not have, or a value its ``validate`` rejects, is one line
    naming the task and its fields.
    """
    key = (task, key or config_key(config))
    cached = _datasets.get(key)
    if cached is not None:
        return cached
    rg = import_reasoning_gym()
    check_options(task, config)
    try:
        dataset = rg.create_dataset(task, **config)
    except (AssertionError, ValueError, TypeError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DatasetError(f"reasoning_gym task {task!r} rejects options {config}: {detail}") from None
    with _lock:
        _datasets[key] = dataset
    return dataset


def check_options(task: str, config: dict[str, Any]) -> None:
    """One line for an unknown task or a field its config does not have (no dataset is built)."""
    rg = import_reasoning_gym()
    check_task(task)
    _, config_cls = rg.factory.DATASETS[task]
    fields = sorted(getattr(config_cls, "__dataclass_fields__", {}))
    unknown = sorted(set(config) - set(fields))
    if unknown:
        raise DatasetError(f"reasoning_gym task {task!r} has no option {', '.join(unknown)}; its options: {', '.join(fields)}")


def adopt(task: str, key: str, dataset: Any) -> None:
    """Cache a task instance built elsewhere (a mix's member) under its config key."""
    with _lock:
        _datasets.setdefault((task, key), dataset)


def remember(task: str, key: str, index: int, entry: dict[str, Any]) -> None:
    """Keep a generated entry (``key``: :func:`config_key` of its config) so scoring its
    completions does not regenerate it."""
    with _lock:
        if len(_entries) >= _MAX_CACHED_ENTRIES:
            _entries.clear()
        _entries[(task, key, index)] = entry


def entry_of(ref: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The task instance and the entry a row's ``reasoning_gym`` column names."""
    try:
        task, config, index = ref["task"], ref["config"], int(ref["index"])
        if not isinstance(config, dict):
            raise TypeError
    except (KeyError, TypeError, ValueError):
        raise DatasetError(
            f"the row's reasoning_gym column must be {{'task', 'config', 'index'}} (rows from --dataset reasoning_gym:…), got {ref!r}"
        ) from None
    key = config_key(config)
    dataset = make_dataset(task, config, key)
    entry = _entries.get((task, key, index))
    if entry is None:
        entry = dataset[index]
        remember(task, key, index, entry)
    return dataset, entry
