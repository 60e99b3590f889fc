"""``rlcore train --reward llm_judge --judge-url …``: the built-in tiny model trains two steps on the
judge's scores (rlcore's test server as the judge), a failed judge call is a counted reward error in
the step's metrics, and a judge that answers nothing stops the run with one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlcore.testing.runs import run_steps


def train(out: Path, *options: str) -> None:
    from rlcore.commands.cli import main

    main(["train", "--reward", "llm_judge", "--max_steps", "2", "--output_dir", str(out), "--plots", "false",
          "--disable_tqdm", "true", "--retry-backoff", "0.01", *options])


@pytest.mark.timeout(600)
def test_two_steps_train_on_the_judges_scores(judge_server, tmp_path: Path) -> None:
    server = judge_server()
    server.faults.extend([503, 503, 503])  # three questions of step 1 fail (no retries): counted, not fatal
    train(tmp_path / "run", "--judge-url", server.url + "/v1", "--judge-model", "judge", "--retries", "0",
          "--log_completions", "true")
    steps = run_steps(tmp_path / "run")
    assert len(steps) == 2
    for s in steps:
        assert 0.0 <= s["rewards/llm_judge"] <= 1.0 and s["reward_std"] > 0  # the judge's scores differ
        assert s["llm_judge/calls"] + s["llm_judge/cache_hits"] == s["episodes"] == 32
    first, second = steps
    assert first["llm_judge/call_errors"] == 3 and first["reward_errors/llm_judge"] >= 3  # duplicates share a failure
    assert second["llm_judge/call_errors"] == 0 and second["reward_errors/llm_judge"] == 0
    questions = sum(s["llm_judge/calls"] for s in steps)
    assert len(server.requests) == questions  # no retries: one request per question, the three faulted ones too
    assert all(m["role"] == "user" and "Score: N" in m["content"] for r in server.requests for m in r["messages"])
    logged = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert len(logged) == 64
    for row in logged:  # beside each completion: the judge's reply, and the reward read from it
        if row["rewards"]["llm_judge"] is None:
            assert row["llm_judge_reply"] == ""  # a faulted call: no reply
        else:
            assert row["llm_judge_reply"] == f"Score: {round(row['rewards']['llm_judge'] * 10)}"
    assert sum(1 for row in logged if row["rewards"]["llm_judge"] is None) == first["reward_errors/llm_judge"]


@pytest.mark.timeout(600)
def test_a_judge_that_is_down_stops_the_run_with_one_line(closed_port: int, tmp_path: Path, capsys: Any) -> None:
    with pytest.raises(SystemExit) as exc:
        train(tmp_path / "run", "--judge-url", f"http://127.0.0.1:{closed_port}/v1", "--retries", "0")
    assert exc.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("Error: reward 'llm_judge' raised on all 32 samples (JudgeError: the judge at "
                           f"http://127.0.0.1:{closed_port}/v1/chat/completions failed 1 try (ConnectError"), last


def test_llm_judge_without_a_judge_is_one_line(tmp_path: Path, capsys: Any) -> None:
    with pytest.raises(SystemExit) as exc:
        train(tmp_path / "run")
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("Error: llm_judge needs a judge: judge_url=URL") and "\n" not in err, err
