"""The ``reasoning_gym`` reward scores with each task's own ``score_answer`` through rlcore's reward
path: reference answers get 1.0, perturbed ones less, for tasks from several families."""

from __future__ import annotations

import pytest

from rlcore.data import load_rows

#: task families across reasoning-gym's categories (arithmetic, algorithmic, logic, graphs, games, …)
FAMILIES = [
    "leg_counting", "basic_arithmetic", "chain_sum", "gcd", "spell_backward", "word_sorting",
    "letter_counting", "caesar_cipher", "number_sorting", "family_relationships", "knights_knaves",
    "mini_sudoku", "base_conversion", "simple_equations",
]


def _perturb(answer: str) -> str:
    """A wrong answer of the same kind: the last character changed (digit stays a digit)."""
    last = answer[-1]
    if last.isdigit():
        new = str((int(last) + 1) % 10)
    elif last.isalpha():
        new = "b" if last.lower() == "a" else "a"
    else:
        new = "0"
    return answer[:-1] + new


@pytest.mark.parametrize("task", FAMILIES)
def test_reference_scores_one_and_perturbed_less(task: str, score) -> None:
    rows = load_rows(f"reasoning_gym:{task}?size=6&seed=11")
    rows = [r for r in rows if isinstance(r["answer"], str) and r["answer"].strip()]
    assert rows, f"{task} gave no rows with a single reference answer"
    good = score(rows, [f"Thinking…\n<answer>{r['answer']}</answer>" for r in rows])
    assert good == [1.0] * len(rows)
    bad = score(rows, [f"<answer>{_perturb(r['answer'])}</answer>" for r in rows])
    assert all(v is not None and v < 1.0 for v in bad), bad
    assert score.last.errors == 0


def test_extraction_modes(score) -> None:
    rows = load_rows("reasoning_gym:leg_counting?size=2&seed=1")
    bare = [r["answer"] for r in rows]
    tagged = [f"<answer>{a}</answer>" for a in bare]
    assert score(rows, bare) == [1.0, 1.0]                       # auto: no tags -> the whole text
    assert score(rows, tagged) == [1.0, 1.0]
    assert score(rows, bare, extract="tag") == [0.0, 0.0]        # tag: no tags, no answer
    assert all(v < 1.0 for v in score(rows, tagged, extract="text"))  # text: the tags are part of the answer
    assert score(rows, [f"<final>{a}</final>" for a in bare], extract="tag", tag="final") == [1.0, 1.0]
    # the last tagged answer counts, as in reasoning-gym's own extraction
    assert score(rows, [f"<answer>1</answer> no: <answer>{a}</answer>" for a in bare]) == [1.0, 1.0]


def test_rows_from_elsewhere_are_not_scored_and_stale_rows_are_counted(score) -> None:
    rows = load_rows("reasoning_gym:leg_counting?size=2&seed=1")
    other = {"question": "2+2?", "answer": "4"}
    stale = dict(rows[1], answer=str(int(rows[1]["answer"]) + 1))  # made by "another version"
    values = score([rows[0], other, stale], [f"<answer>{rows[0]['answer']}</answer>", "4", stale["answer"]])
    assert values == [1.0, None, None] and score.last.errors == 1


def test_format_reward(score) -> None:
    rows = load_rows("reasoning_gym:leg_counting?size=4&seed=1")
    texts = ["Two dogs: 8 legs.\n<answer>8</answer>", "<answer>8</answer> and more", "<answer> </answer>",
             "<answer>8</answer><answer>9</answer>"]
    assert score(rows, texts, name="reasoning_gym_format") == [1.0, 0.0, 0.0, 0.0]
    think = ["<think>2 dogs</think>\n<answer>8</answer>", "<answer>8</answer>", "<think></think><answer>8</answer>",
             "x <think>a</think><answer>8</answer>"]
    assert score(rows, think, name="reasoning_gym_format", mode="think") == [1.0, 0.0, 0.0, 0.0]


def test_bad_reward_options_are_one_line() -> None:
    import rlcore
    from rlcore import ConfigError

    with pytest.raises(ConfigError, match="extract must be one of auto, tag, text"):
        rlcore.get("reward", "reasoning_gym")(extract="json")
    with pytest.raises(ConfigError, match="mode must be 'answer' or 'think'"):
        rlcore.get("reward", "reasoning_gym_format")(mode="xml")
