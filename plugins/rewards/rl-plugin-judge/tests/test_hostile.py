"""Hostile text and a hostile server: the judge's reply is model output too, and a judge_url may
point at something that is not a chat server. Each stays bounded and ends as a counted error."""

from __future__ import annotations

import time

import pytest

from rl_plugin_judge.endpoint import MAX_REPLY_BYTES
from rl_plugin_judge.parse import parse_score
from rl_plugin_judge.reward import LLMJudge
from rlcore.testing.fuzz import HOSTILE_COMPLETIONS, flooding_http_server

#: replies built to make a backtracking regex quadratic in the reply's length
PATHOLOGICAL = {
    "score_then_spaces": "Score" + " " * 200_000,
    "score_then_dashes": "score" + " -" * 100_000,
    "digits_then_slash": "1" * 200_000 + "/",
    "bold_then_digits": "**" + "1" * 200_000,
    "score_flood": "Score: x " * 100_000,
    "fraction_flood": "1/" * 200_000,
    "think_open_flood": "<think>" * 100_000,
}


@pytest.mark.parametrize("name", sorted({**HOSTILE_COMPLETIONS, **PATHOLOGICAL}))
def test_reading_a_hostile_reply_is_quick(name: str) -> None:
    text = {**HOSTILE_COMPLETIONS, **PATHOLOGICAL}[name]
    t0 = time.perf_counter()
    value = parse_score(text)
    elapsed = time.perf_counter() - t0
    assert value is None or 0.0 <= value <= 1.0
    assert elapsed < 1.0, f"reading {name} took {elapsed:.2f} s"  # a hang detector: it takes milliseconds


async def test_a_judge_url_that_floods_is_stopped_at_the_size_cap(make_traj) -> None:
    prefix = b'{"choices": [{"message": {"role": "assistant", "content": "'
    with flooding_http_server(prefix, method="POST", megabytes=64) as url:
        reward = LLMJudge(judge_url=url, retries=2, retry_backoff=0.01)
        t0 = time.monotonic()
        values = (await reward.compute_reward([make_traj("4")]))["llm_judge"]
    assert values == [None] and time.monotonic() - t0 < 30
    assert f"sent more than {MAX_REPLY_BYTES} bytes" in str(reward.last_failures[0])  # not asked again: not transient
