"""Accuracy and format rewards on real GSM8K rows: the references score 100 %, perturbed ones 0 %."""

from __future__ import annotations

from typing import Any


import rlcore
from rlcore.asyncutil import run_sync
from rlcore.rewards import as_reward, compute_rewards
from rl_plugin_math.extract import extract_number


def _perturb(answer: str) -> str:
    """The reference solution with its final number changed (+1): right reasoning, wrong answer."""
    head, _, final = answer.rpartition("####")
    n = extract_number("####" + final)
    assert n is not None
    return f"{head}#### {n + 1}"


def _score(names: list[str], trajs: list[Any]) -> dict[str, list[float | None]]:
    rewards = [as_reward(n, rlcore.get("reward", n)) for n in names]
    return run_sync(compute_rewards(rlcore.RunHooks(*rewards, observers=False), trajs))


def test_reference_answers_score_100_percent(gsm8k_rows: list[dict[str, Any]], make_traj) -> None:
    trajs = [make_traj(row["answer"], row) for row in gsm8k_rows]
    cols = _score(["gsm8k_accuracy", "gsm8k_format"], trajs)
    assert len(cols["gsm8k_accuracy"]) == len(gsm8k_rows) == 1319
    wrong = [i for i, v in enumerate(cols["gsm8k_accuracy"]) if v != 1.0]
    assert not wrong, f"references scored wrong: {[gsm8k_rows[i]['answer'][-40:] for i in wrong[:3]]}"
    bad_format = [i for i, v in enumerate(cols["gsm8k_format"]) if v != 1.0]
    assert not bad_format, f"references judged badly formatted: {[gsm8k_rows[i]['answer'][-40:] for i in bad_format[:3]]}"
    assert all(t.reward == 2.0 for t in trajs)  # weighted sum of both columns, weights 1


def test_perturbed_answers_score_0_percent(gsm8k_rows: list[dict[str, Any]], make_traj) -> None:
    trajs = [make_traj(_perturb(row["answer"]), row) for row in gsm8k_rows]
    cols = _score(["gsm8k_accuracy"], trajs)
    assert sum(v for v in cols["gsm8k_accuracy"] if v is not None) == 0.0
    assert None not in cols["gsm8k_accuracy"]


def test_other_final_answer_forms_on_real_rows(gsm8k_rows: list[dict[str, Any]], make_traj) -> None:
    """The same reference numbers written as a model might: boxed, with $ and commas, in tags, last number."""
    rows = gsm8k_rows[:200]
    forms = []
    for row in rows:
        n = extract_number(row["answer"])
        assert n is not None and n.denominator == 1
        v = int(n)
        forms.append(
            [
                f"The answer is \\boxed{{{v}}}.",
                f"She ends up with ${v:,}.00 in total.",
                f"<think>some steps</think><answer>{v} units</answer>",
                f"Step 1: 3 + 4. Step 2: so we get {v}.0",
            ]
        )
    trajs = [make_traj(text, row) for row, texts in zip(rows, forms) for text in texts]
    assert _score(["gsm8k_accuracy"], trajs)["gsm8k_accuracy"] == [1.0] * len(trajs)
    wrong = [make_traj(f"The answer is \\boxed{{{int(extract_number(r['answer'])) - 1}}}.", r) for r in rows]
    assert _score(["gsm8k_accuracy"], wrong)["gsm8k_accuracy"] == [0.0] * len(rows)


def test_math_accuracy_on_real_rows(gsm8k_rows: list[dict[str, Any]], make_traj) -> None:
    """math-verify agrees on the references and rejects the perturbed answers (runs in a worker
    thread, as rlcore runs sync rewards: math-verify's signal timeout must not break it)."""
    rows = gsm8k_rows[:40]
    good = [make_traj(f"So the result is $\\boxed{{{row['answer'].rsplit('####', 1)[1].strip()}}}$", row) for row in rows]
    bad = [make_traj(f"So the result is $\\boxed{{{extract_number(row['answer']) + 1}}}$", row) for row in rows]
    cols = _score(["math_accuracy"], good + bad)
    assert cols["math_accuracy"] == [1.0] * len(rows) + [0.0] * len(rows)


def test_hash_format_rejects_other_shapes(make_traj) -> None:
    texts = {
        "Some reasoning.\n#### 42": 1.0,
        "reasoning\n#### $1,000": 1.0,
        "#### 42": 0.0,  # no reasoning before the answer
        "reasoning\n#### forty-two": 0.0,  # not a number
        "reasoning\n#### 42\nmore text after": 0.0,  # the answer line is not last
        "reasoning, answer 42": 0.0,
    }
    got = _score(["gsm8k_format"], [make_traj(t) for t in texts])["gsm8k_format"]
    assert got == list(texts.values())
