"""Rewards for rows from ``reasoning_gym:``: the generating task's own ``score_answer``, and the
``<answer>…</answer>`` format it pairs with."""

from __future__ import annotations

import functools
import re
from typing import Any, Literal

from rlcore.errors import ConfigError, DatasetError
from rlcore.rewards import Reward

from .tasks import entry_of, import_reasoning_gym

Extract = Literal["auto", "tag", "text"]
_EXTRACT = ("auto", "tag", "text")


@functools.lru_cache(maxsize=32)
def _tag_pattern(tag: str) -> re.Pattern[str]:
    return re.compile(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", flags=re.DOTALL)


def extract_answer(text: str, mode: Extract = "auto", tag: str = "answer") -> str | None:
    """The answer to score. ``auto``: inside the last ``<tag>…</tag>`` when there is one, else the
    whole text; ``tag``: only inside the tags (``None``, scored 0, without them); ``text``: the
    whole text. Surrounding whitespace is dropped, as reasoning-gym's own extraction does."""
    if mode == "text":
        return text.strip()
    matches = _tag_pattern(tag).findall(text)
    if matches:
        return matches[-1].strip()
    return text.strip() if mode == "auto" else None


class ReasoningGymReward(Reward):
    """``score_answer(answer, entry)`` of the task that generated the row, in [0, 1].

    The row's ``reasoning_gym`` column (``{"task", "config", "index"}``) names the task and entry;
    rows without it (another dataset) get ``None``. A scorer that raises on a malformed answer
    counts as a wrong answer (0.0). A row whose ``answer`` differs from the regenerated entry's
    was made by another reasoning-gym version: that sample raises, so it gets ``None`` and is
    counted in ``errors`` rather than scored against the wrong entry.
    """

    name = "reasoning_gym"

    def __init__(self, extract: Extract = "auto", tag: str = "answer") -> None:
        if extract not in _EXTRACT:
            raise ConfigError(f"reasoning_gym: extract must be one of {', '.join(_EXTRACT)}, got {extract!r}")
        if not isinstance(tag, str) or not re.fullmatch(r"[A-Za-z_][\w-]*", tag):
            raise ConfigError(f"reasoning_gym: tag must be a tag name such as 'answer', got {tag!r}")
        import_reasoning_gym()  # one line saying how to install it, before any batch is scored
        self.extract = extract
        self.tag = tag

    def score(self, completions: list[str], reasoning_gym: list[Any], answer: list[Any] | None = None) -> list[float | None]:
        answers = answer if answer is not None else [None] * len(completions)
        out: list[float | None] = []
        for text, ref, expected in zip(completions, reasoning_gym, answers):
            if not ref:
                out.append(None)
                continue
            dataset, entry = entry_of(ref)
            if expected is not None and entry.get("answer") is not None and str(entry["answer"]) != str(expected):
                raise DatasetError(
                    f"reasoning_gym row {ref['task']}#{ref['index']} has answer {expected!r} but its generator gives "
                    f"{entry['answer']!r}: it was made by another reasoning-gym version; regenerate the rows"
                )
            out.append(self.score_one(dataset, entry, text))
        return out

    def score_one(self, dataset: Any, entry: dict[str, Any], text: str) -> float:
        candidate = extract_answer(text or "", self.extract, self.tag)
        try:
            value = dataset.score_answer(candidate, entry)
        except Exception:  # noqa: BLE001 - a task scorer choking on a malformed answer = wrong answer
            return 0.0
        return float(value or 0.0)


class ReasoningGymFormat(Reward):
    """1.0 when the completion ends with exactly one non-empty ``<answer>…</answer>`` (``mode="answer"``,
    what reasoning-gym's default system prompt asks for), or is ``<think>…</think>`` followed by
    it (``mode="think"``, the DeepSeekZero prompt); else 0.0."""

    name = "reasoning_gym_format"

    def __init__(self, mode: Literal["answer", "think"] = "answer", tag: str = "answer") -> None:
        if mode not in ("answer", "think"):
            raise ConfigError(f"reasoning_gym_format: mode must be 'answer' or 'think', got {mode!r}")
        t = re.escape(tag)
        body = rf"<{t}>\s*\S.*?</{t}>\s*"
        self.pattern = re.compile(rf"(?s)\s*<think>\s*\S.*?</think>\s*{body}" if mode == "think" else rf"(?s).*?{body}")
        self.tags = (f"<{tag}>", f"</{tag}>") + (("<think>", "</think>") if mode == "think" else ())
        self.mode = mode

    def score(self, completions: list[str]) -> list[float]:
        out = []
        for text in completions:
            text = text or ""
            # tag counts first (linear): with each tag exactly once the pattern cannot backtrack
            # super-linearly, while a tag flood in hostile output would stall it
            ok = all(text.count(t) == 1 for t in self.tags) and self.pattern.fullmatch(text) is not None
            out.append(1.0 if ok else 0.0)
        return out
