"""Dataset rows -> prompts for a loop, exactly as ``GRPOTrainer`` builds them (same chat template,
same system prompt, same truncation, same TRL handling of a plain-text ``prompt`` column)."""

from __future__ import annotations

from typing import Any, Sequence

from ..types import Prompt


def make_prompts(rows: Sequence[dict[str, Any]], tokenizer: Any, *, prompt_column: str | None = None,
                 system_prompt: str | None = None, max_prompt_length: int | None = None) -> list[Prompt]:
    """One fresh :class:`Prompt` (its own group id) per row; the row's other columns (``answer`` …)
    stay in ``Prompt.data`` for the rewards."""
    from ..data.cursor import check_columns, make_prompt

    rows = list(rows)
    has_prompt = check_columns(rows, prompt_column, "rows")
    return [make_prompt(r, tokenizer, has_prompt, prompt_column, max_prompt_length, system_prompt) for r in rows]
