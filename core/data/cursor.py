"""The trainer's prompt stream — how it walks its dataset: rows become :class:`rlcore.Prompt` through
:mod:`rlcore.data` (prompt / messages / question-style columns, chat template with the generation
prompt, every other column kept for rewards and schedulers), in a seeded order whose position is
saved in checkpoints.

Rows that carry only ``env_config`` are accepted for environment schedulers, which build the
first observation themselves at reset.

(Named ``prompts`` so that ``data`` means one thing: :mod:`rlcore.data` reads datasets and turns
rows into prompts for every command; this module is only the trainer's walk over them.)
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Iterable

from . import PROMPT_COLUMNS
from ..errors import DatasetError
from ..types import Prompt


def check_columns(rows: list[dict[str, Any]], prompt_column: str | None = None, source: str = "dataset") -> bool:
    """Fail early (one line naming the row) when any row cannot make a prompt — every row, before
    the model loads, not the first only. Returns False for env_config-only datasets."""
    from . import row_messages

    if not rows:
        raise DatasetError(f"{source} has no rows")
    first = rows[0]
    if not isinstance(first, dict):
        raise DatasetError(f"{source}: row 0 is a {type(first).__name__}, expected an object with columns")
    env_only = prompt_column is None and "env_config" in first and not any(c in first for c in PROMPT_COLUMNS)
    # a lazy sequence (rows a dataset source generates when read) is checked by its first row: checking
    # all would generate them all; each later row is still checked when a step draws it (make_prompt)
    checked = rows if isinstance(rows, (list, tuple)) else rows[:1]
    for index, row in enumerate(checked):
        if env_only:
            if not isinstance(row, dict):
                raise DatasetError(f"{source}: row {index} is a {type(row).__name__}, expected an object with columns")
            if row.get("env_config") is None:
                raise DatasetError(f"{source}: row {index} has no env_config (row 0 has one); every row needs it")
            continue
        try:
            row_messages(row, prompt_column=prompt_column, index=index)
        except DatasetError as exc:
            raise DatasetError(f"{source}: {exc}") from None
    return not env_only


def make_prompt(row: dict[str, Any], tokenizer: Any, has_prompt: bool, prompt_column: str | None = None,
                max_prompt_length: int | None = None, system_prompt: str | None = None) -> Prompt:
    """The trainer's prompt for one row: :func:`rlcore.data.row_to_prompt` (the one rule, TRL's: a
    plain-text ``prompt`` column is not chat-templated), or, for a dataset of ``env_config``-only rows
    (``has_prompt`` False, see :func:`check_columns`), an empty prompt the environment fills at reset."""
    from . import row_to_prompt

    if not has_prompt:
        return Prompt(messages=[], prompt_ids=[], data=dict(row))
    return row_to_prompt(row, tokenizer, prompt_column=prompt_column, system_prompt=system_prompt,
                         max_prompt_length=max_prompt_length)


class PromptCursor:
    """Walks the rows in a seeded random order, epoch after epoch; its position is saved in
    checkpoints so a resumed run sees exactly the prompts it would have seen."""

    def __init__(self, n_rows: int, seed: int = 0, shuffle: bool = True) -> None:
        if n_rows < 1:
            raise DatasetError("dataset has no rows")
        self.n, self.seed, self.shuffle = n_rows, seed, shuffle
        self.epoch, self.pos = 0, 0
        self._order = self._make_order()

    def _make_order(self) -> list[int]:
        order = list(range(self.n))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return order

    def take(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            if self.pos >= self.n:
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._make_order()
            out.append(self._order[self.pos])
            self.pos += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos, "n": self.n, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
        self._order = self._make_order()


def as_rows(dataset: Any) -> Sequence[dict[str, Any]]:
    """A list of dicts from a list, a ``datasets.Dataset`` or any iterable of mappings. A lazy
    sequence of rows (a dataset source that generates rows when read) is kept as it is, so a
    step generates only the rows it draws."""
    if dataset is None:
        return []
    if isinstance(dataset, Sequence) and not isinstance(dataset, (list, tuple, str, bytes)):
        return dataset
    return [_row(i, r) for i, r in enumerate(dataset if isinstance(dataset, list) else _iter(dataset))]


def _row(index: int, row: Any) -> dict[str, Any]:
    from collections.abc import Mapping

    if not isinstance(row, Mapping):
        raise DatasetError(f"train_dataset row {index} is a {type(row).__name__}, expected an object with columns")
    return dict(row)


def _iter(ds: Iterable[Any]) -> Iterable[Any]:
    return iter(ds)
