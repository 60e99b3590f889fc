"""Renamed :mod:`rlcore.training.prompts` (``rlcore.data`` is the dataset module); importable here as before."""

from .prompts import PromptCursor, as_rows, check_columns, make_prompt

__all__ = ["PromptCursor", "as_rows", "check_columns", "make_prompt"]
