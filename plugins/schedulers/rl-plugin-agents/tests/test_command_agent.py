"""A command-line agent in a subprocess: the row on stdin, the session in OPENAI_BASE_URL /
OPENAI_API_KEY, the reward as the last stdout line; crashes, bad output and the deadline fail only
its trajectory, and the deadline kills its whole process group."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

from rlcore.rollout.invariants import check_trajectory
from rlcore.testing.multi_turn import assert_rows_are_sampler_calls

from rl_plugin_agents.testing import prompt

AGENT = textwrap.dedent('''
    import json, os, subprocess, sys, time
    import openai

    row = json.loads(sys.stdin.read())
    mode = row.get("mode", "ok")
    if mode == "hang":  # a child in the same process group, then hang: the deadline must take both
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open(row["pidfile"], "w").write(str(child.pid))
        time.sleep(60)
    if mode == "crash":
        print("thinking...")
        sys.exit("the agent fell over")
    client = openai.OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    reply = client.chat.completions.create(model=os.environ["OPENAI_MODEL"], messages=[{"role": "user", "content": row["prompt"]}])
    print("some log line")
    if mode == "garbage":
        print("no json here")
    else:
        print(json.dumps({"reward": 0.5 if reply.choices[0].message.content is not None else 0.0, "cwd": os.getcwd()}))
''')


def _agent_file(tmp_path: Path) -> str:
    path = tmp_path / "agent.py"
    path.write_text(AGENT)
    return str(path)


def test_a_command_agent_trains_exactly(scripted_sampler, make_proxy, rollout, recorded, tiny_tokenizer, tmp_path):
    rec = recorded(scripted_sampler(["156"]))
    sched = make_proxy(rec, agent_cmd=[sys.executable, _agent_file(tmp_path)], agent_cwd=str(tmp_path))
    trajs = rollout(sched, n=2)
    assert [t.status for t in trajs] == ["ok", "ok"], [t.reason for t in trajs]
    assert all(t.infos["agent_reward"] == 0.5 and t.infos["agent"]["cwd"] == str(tmp_path) for t in trajs)
    assert all(check_trajectory(t, tiny_tokenizer) == [] for t in trajs)
    assert assert_rows_are_sampler_calls(trajs, rec.records, tiny_tokenizer) == 2


def test_failures_end_their_own_trajectory_only(scripted_sampler, make_proxy, rollout, tiny_tokenizer, tmp_path):
    pidfile = tmp_path / "child.pid"
    sched = make_proxy(scripted_sampler(["156"]), agent_cmd=f"{sys.executable} {_agent_file(tmp_path)}", agent_timeout=8)
    prompts = [prompt(tiny_tokenizer, mode=m, pidfile=str(pidfile)) for m in ("ok", "crash", "garbage", "hang")]
    started = time.monotonic()
    ok, crash, garbage, hang = rollout(sched, prompts)
    assert time.monotonic() - started < 30
    assert ok.status == "ok" and ok.infos["agent_reward"] == 0.5
    assert crash.status == "failed" and crash.reason == "the agent command exited with status 1: the agent fell over"
    assert garbage.status == "failed" and "last stdout line is not JSON: 'no json here'" in garbage.reason
    assert hang.status == "failed" and "did not finish within 8 s (its process group was killed)" in hang.reason
    child = int(pidfile.read_text())
    for _ in range(50):  # the killed child is gone (or a zombie of a dead parent, reaped by init)
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        state = Path(f"/proc/{child}/stat").read_text().split()[2] if Path(f"/proc/{child}/stat").exists() else "X"
        if state in ("Z", "X"):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the agent's child {child} outlived the deadline")


def test_a_command_that_cannot_start_is_one_line(scripted_sampler, make_proxy, rollout, tmp_path):
    (traj,) = rollout(make_proxy(scripted_sampler(["x"]), agent_cmd=str(tmp_path / "no-such-agent")))
    assert traj.status == "failed" and "could not start: No such file or directory" in traj.reason
