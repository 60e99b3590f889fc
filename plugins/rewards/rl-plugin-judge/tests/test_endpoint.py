"""``llm_judge`` against a real OpenAI-compatible chat server on 127.0.0.1 (rlcore's test server with a
scripted judge): scores, the concurrency cap seen at the server, the cache, retries, deadlines and
every way a question can fail — each a ``None`` for its sample, counted, never a crash."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

import rlcore
from rl_plugin_judge.endpoint import JudgeError, chat_url
from rl_plugin_judge.reward import LLMJudge
from rlcore.errors import ConfigError

RUBRIC = "Question: {prompt}\nAnswer: {completion}\nGive a score from 0 to {max_score}."


def judge(server: Any, **options: Any) -> LLMJudge:
    options.setdefault("rubric", RUBRIC)
    options.setdefault("retry_backoff", 0.01)
    return LLMJudge(judge_url=server.url + "/v1", judge_model="judge", **options)


async def scored(reward: LLMJudge, trajs: list[Any]) -> list[float | None]:
    return (await reward.compute_reward(trajs))["llm_judge"]


async def test_scores_come_from_the_judges_replies(judge_server, make_traj) -> None:
    server = judge_server()
    reward = judge(server)
    trajs = [make_traj("4 WORTH 8"), make_traj("four FRACTION"), make_traj("BOLD 4"), make_traj("4 WORTH 10")]
    assert await scored(reward, trajs) == pytest.approx([0.8, 0.7, 0.9, 1.0])
    assert reward.errors == 0 and not reward.last_failures
    assert all(body["model"] == "judge" and body["temperature"] == 0.0 and body["max_tokens"] == 256
               for body in server.requests)
    asked = sorted(m["content"] for body in server.requests for m in body["messages"])  # in any order: concurrent
    assert asked[0] == "Question: What is 2 + 2?\nAnswer: 4 WORTH 10\nGive a score from 0 to 10."
    assert [m["role"] for body in server.requests for m in body["messages"]] == ["user"] * 4


async def test_the_registered_reward_takes_options_and_columns(judge_server, make_traj) -> None:
    server = judge_server()
    reward = rlcore.get("reward", "llm_judge")(
        judge_url=server.url, judge_model="judge", rubric="Reference: {answer}\nAnswer: {completion}",
        judge_system_prompt="You are a strict grader.", max_score=5, retry_backoff=0.01)
    assert await scored(reward, [make_traj("WORTH 4", answer="4"), make_traj("WORTH 5", answer=None)]) == pytest.approx([0.8, 1.0])
    assert all(body["messages"][0] == {"role": "system", "content": "You are a strict grader."} for body in server.requests)
    asked = sorted(body["messages"][1]["content"] for body in server.requests)
    assert asked == ["Reference: \nAnswer: WORTH 5", "Reference: 4\nAnswer: WORTH 4"]  # a None column is empty


async def test_a_row_without_a_rubric_column_is_that_samples_error(judge_server, make_traj) -> None:
    server = judge_server()
    reward = judge(server, rubric="Ref: {answer} Answer: {completion}")
    assert await scored(reward, [make_traj("WORTH 6", answer="4"), make_traj("WORTH 6")]) == [pytest.approx(0.6), None]
    assert reward.errors == 1 and "no 'answer' for the rubric" in str(reward.last_failures[0])
    with pytest.raises(ConfigError, match=r"the rubric names \{answer\}, which is neither"):  # no row has it: a config error
        reward.questions([[]], ["x"], [make_traj("x")])


async def test_concurrency_cap_is_what_the_server_sees(judge_server, make_traj) -> None:
    server = judge_server(delay=0.3)  # each reply takes 0.3 s: requests in flight overlap at the server
    trajs = [make_traj(f"WORTH {i}") for i in range(6)]
    assert await scored(judge(server, max_concurrency=2), trajs) == pytest.approx([i / 10 for i in range(6)])
    assert len(server.requests) == 6 and server.peak_running == 2
    server.peak_running = 0
    await scored(judge(server, max_concurrency=6), [make_traj(f"WORTH {i} again") for i in range(6)])
    assert server.peak_running == 6  # without the cap the same server takes all six at once


async def test_duplicates_are_judged_once_and_the_cache_outlives_the_reward(judge_server, make_traj, tmp_path) -> None:
    server = judge_server()
    path = tmp_path / "verdicts" / "judge.jsonl"
    reward = judge(server, cache_path=str(path))
    group = [make_traj("WORTH 3"), make_traj("WORTH 7"), make_traj("WORTH 3"), make_traj("WORTH 3")]
    assert await scored(reward, group) == pytest.approx([0.3, 0.7, 0.3, 0.3])
    assert len(server.requests) == 2 and (reward.calls, reward.cache_hits) == (2, 2)
    assert await scored(reward, group[:2]) == pytest.approx([0.3, 0.7])  # the next step: no new question
    assert len(server.requests) == 2
    other_question = [make_traj("WORTH 3", question="What is 3 + 1?")]
    assert await scored(reward, other_question) == pytest.approx([0.3]) and len(server.requests) == 3  # key: prompt + completion
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 3 and {round(line["score"], 3) for line in lines} == {0.3, 0.7}
    with path.open("a") as f:
        f.write('{"key": "cut short by a cra')  # a crash mid-write
    again = judge(server, cache_path=str(path))  # a new run with the same cache file
    assert await scored(again, group) == pytest.approx([0.3, 0.7, 0.3, 0.3])
    assert len(server.requests) == 3 and again.calls == 0 and again.cache_hits == 4


async def test_5xx_is_retried_until_it_answers(judge_server, make_traj) -> None:
    server = judge_server()
    server.faults.extend([503, 500])
    reward = judge(server, retries=2)
    assert await scored(reward, [make_traj("WORTH 9")]) == pytest.approx([0.9])
    assert len(server.requests) == 3 and reward.errors == 0


async def test_failed_calls_and_unparseable_replies_are_counted_errors(judge_server, make_traj) -> None:
    server = judge_server(slow_s=3.0)
    server.faults.extend([502, 502])  # the first question's two tries
    reward = judge(server, retries=1, judge_timeout=0.5, max_concurrency=1)  # one at a time: the faults go to the first
    trajs = [make_traj("WORTH 1"), make_traj("GARBAGE"), make_traj("SLOW"), make_traj("BOOM"), make_traj("WORTH 8")]
    t0 = time.monotonic()
    values = await scored(reward, trajs)
    elapsed = time.monotonic() - t0
    assert values[:4] == [None, None, None, None] and values[4] == pytest.approx(0.8)
    assert elapsed < 2.9, f"the slow reply was waited for ({elapsed:.1f} s), not stopped at the 0.5 s deadline"
    assert reward.errors == 4 and len(reward.last_failures) == 4
    assert (reward.call_errors, reward.parse_errors) == (3, 1)
    reasons = [str(f) for f in reward.last_failures]
    assert "failed 2 tries (502: injected fault 502)" in reasons[0]
    assert "no score from 0 to 10 in the judge's reply: 'I really cannot say.'" in reasons[1]
    assert "failed 2 tries (no reply within 0.5 s)" in reasons[2]
    assert "answered 400" in reasons[3] and "cannot read this" in reasons[3]
    assert all(isinstance(f, JudgeError) and "\n" not in str(f) for f in reward.last_failures)
    assert sum(1 for r in server.requests if "BOOM" in r["messages"][0]["content"]) == 1  # a 4xx is not asked again


async def test_a_wrong_model_name_is_not_retried(judge_server, make_traj) -> None:
    server = judge_server()
    reward = LLMJudge(judge_url=server.url, judge_model="no-such-model", retries=3, retry_backoff=0.01)
    assert await scored(reward, [make_traj("WORTH 2")]) == [None]
    assert len(server.requests) == 1 and "answered 404: The model `no-such-model` does not exist." in str(reward.last_failures[0])


async def test_a_judge_nobody_listens_on_fails_every_sample(closed_port, make_traj) -> None:
    reward = LLMJudge(judge_url=f"http://127.0.0.1:{closed_port}/v1", retries=1, retry_backoff=0.01)
    assert await scored(reward, [make_traj("a"), make_traj("b")]) == [None, None]
    assert reward.errors == 2 and "failed 2 tries (ConnectError" in str(reward.last_failures[0])


async def test_the_api_key_comes_from_the_named_variable(judge_server, make_traj, monkeypatch) -> None:
    server = judge_server()
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-test")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    await scored(judge(server, api_key_env="MY_JUDGE_KEY"), [make_traj("WORTH 1")])
    await scored(judge(server), [make_traj("WORTH 2")])  # OPENAI_API_KEY (unset here): no key sent
    assert [h.get("authorization") for h in server.request_headers] == ["Bearer sk-test", None]


def test_urls_and_option_errors(tmp_path) -> None:
    assert chat_url("http://h:1") == "http://h:1/v1/chat/completions"
    assert chat_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert chat_url("https://api.x.com/openai/v1/chat/completions") == "https://api.x.com/openai/v1/chat/completions"
    cases = [
        ({}, "llm_judge needs a judge: judge_url=URL"),
        ({"judge_url": "127.0.0.1:8000"}, "is not an http(s) URL"),
        ({"judge_url": "http://h", "rubric": "no completion here"}, "never shows the judge the completion"),
        ({"judge_url": "http://h", "max_score": 0}, "max_score (0) must be above min_score (0)"),
        ({"judge_url": "http://h", "max_concurrency": 0}, "max_concurrency must be a whole number of at least 1"),
        ({"judge_url": "http://h", "judge_timeout": 0}, "judge_timeout must be a positive number"),
        ({"judge_url": "http://h", "score_pattern": "(unclosed"}, "is not a regular expression"),
        ({"judge_url": "http://h", "rubric": "{completion}", "rubric_file": "x"}, "rubric or rubric_file, not both"),
        ({"judge_url": "http://h", "rubric_file": str(tmp_path / "none.txt")}, "cannot read rubric_file"),
        ({"judge_url": "http://h", "cache_path": str(tmp_path)}, "is a directory"),
        ({"judge_model": str(tmp_path / "missing-judge")}, "does not exist"),
    ]
    for options, message in cases:
        with pytest.raises(ConfigError) as err:
            LLMJudge(**options)
        assert message in str(err.value) and "\n" not in str(err.value), (options, str(err.value))
    (tmp_path / "rubric.txt").write_text("Rate {completion} from 0 to {max_score}.")
    assert LLMJudge(judge_url="http://h", rubric_file=str(tmp_path / "rubric.txt")).fields == ["completion", "max_score"]


async def test_a_cache_file_that_cannot_grow_keeps_verdicts_in_memory(judge_server, make_traj, tmp_path, caplog) -> None:
    import resource
    import signal

    server = judge_server()
    path = tmp_path / "judge.jsonl"
    reward = judge(server, cache_path=str(path))
    await scored(reward, [make_traj("WORTH 1")])
    size = path.stat().st_size
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))  # the file is as large as it may get: a full disk
    try:
        assert await scored(reward, [make_traj("WORTH 2"), make_traj("WORTH 3")]) == pytest.approx([0.2, 0.3])
        assert await scored(reward, [make_traj("WORTH 3"), make_traj("WORTH 4")]) == pytest.approx([0.3, 0.4])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    assert path.stat().st_size == size  # nothing was appended ...
    assert len(server.requests) == 4  # ... yet WORTH 3 was asked once: its verdict stayed in memory
    warned = [r.getMessage() for r in caplog.records if "cannot write the verdict cache" in r.getMessage()]
    assert len(warned) == 1 and "verdicts stay in memory for this run" in warned[0]
