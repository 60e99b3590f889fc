"""Finding the score in what judges really write, and the rubric template's rules."""

from __future__ import annotations

import pytest

from rl_plugin_judge.parse import compile_pattern, parse_score
from rl_plugin_judge.rubric import DEFAULT_RUBRIC, prompt_text, render, rubric_fields
from rlcore.errors import ConfigError


@pytest.mark.parametrize("reply, score", [
    ("Score: 7", 0.7),
    ("The answer is correct but terse.\n\nScore: 8", 0.8),
    ("**Score:** 9/10", 0.9),
    ("score = 6.5", 0.65),
    ("Rating: 4", 0.4),
    ("I'd give it 7/10.", 0.7),
    ("Overall 3 out of 10", 0.3),
    ("Final verdict: **8**", 0.8),
    ("10", 1.0),
    ("0.", 0.0),
    # numbers in the reasoning do not fool it: the explicit score, the last one, wins
    ("The answer 42 uses 3 steps; on a scale from 0 to 10 I'd say... Score: 6", 0.6),
    ("Score: 3 at first sight. Re-reading it, Score: 7", 0.7),
    ("<think>Maybe Score: 2? The user wants 10/10 though.</think>Score: 9", 0.9),
])
def test_scores_judges_write(reply: str, score: float) -> None:
    assert parse_score(reply, max_score=10) == pytest.approx(score)


@pytest.mark.parametrize("reply", [
    "", "I cannot grade this.", "Score: 42", "Score: -1", "The reasoning is sound.",
    "<think>Score: 8</think>",  # only reasoning, no verdict
])
def test_no_score_in_range_is_none(reply: str) -> None:
    assert parse_score(reply, max_score=10) is None


def test_scale_and_user_pattern() -> None:
    assert parse_score("Score: 4", max_score=5) == pytest.approx(0.8)
    assert parse_score("Score: 3", max_score=5, min_score=1) == pytest.approx(0.5)
    assert parse_score("Score: 0", max_score=5, min_score=1) is None
    verdict = (compile_pattern(r"<grade>(\d+)</grade>"),)
    assert parse_score("Score: 2 ... <grade>9</grade>", patterns=verdict) == pytest.approx(0.9)
    assert parse_score("Score: 2", patterns=verdict) is None  # the user's pattern replaces the defaults
    assert parse_score("GOOD", max_score=1, patterns=(compile_pattern(r"\bGOOD\b"),)) is None  # no number in the match


def test_rubric_fields_and_rendering() -> None:
    assert rubric_fields(DEFAULT_RUBRIC) == ["prompt", "completion", "max_score"]
    assert rubric_fields("Q: {prompt} A: {completion} ref: {answer} {{literal}}") == ["prompt", "completion", "answer"]
    assert render("{prompt}|{completion}|{{x}}", {"prompt": "p", "completion": None}) == "p||{x}"
    with pytest.raises(ConfigError, match="not a valid template"):
        rubric_fields("Score {completion")
    with pytest.raises(ConfigError, match=r"the field \{0\}"):
        rubric_fields("{0} {completion}")
    with pytest.raises(ConfigError, match=r"the field \{row.answer\}"):
        rubric_fields("{row.answer} {completion}")


def test_prompt_text_is_the_question() -> None:
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
    assert prompt_text(chat) == "What is 2 + 2?"
    assert prompt_text([{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "!"}]}]) == "hi!"
    assert prompt_text([{"role": "system", "content": "only a system"}]) == "only a system"
    assert prompt_text("plain text") == "plain text" and prompt_text(None) == ""
