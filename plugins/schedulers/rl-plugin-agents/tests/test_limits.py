"""Limits and failing agents: a crashed, hung or misbehaving agent fails its own trajectory with a
reason and the rest of the batch trains; request count, size and token caps; concurrency."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from rlcore.errors import ConfigError

from rl_plugin_agents.scheduler import AgentProxyScheduler
from rl_plugin_agents.testing import prompt

ASK = [{"role": "user", "content": "hi"}]


async def _agent(client: openai.AsyncOpenAI, row: dict[str, Any]) -> Any:
    mode = row["mode"]
    if mode == "raise":
        raise ValueError("boom")
    if mode == "hang":
        await asyncio.sleep(60)
    if mode == "silent":
        return 1.0
    if mode == "loop":
        for _ in range(5):
            await client.chat.completions.create(model="m", messages=ASK)
        return 1.0
    if mode == "big":
        try:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 5000}])
        except openai.APIStatusError as exc:
            assert exc.status_code == 413
        await client.chat.completions.create(model="m", messages=ASK)
        return 0.5
    if mode == "long":
        try:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "what " * 300}])
        except openai.BadRequestError as exc:
            assert exc.code == "context_length_exceeded"
        await client.chat.completions.create(model="m", messages=ASK)
        return 0.5
    await client.chat.completions.create(model="m", messages=ASK)
    return "a string" if mode == "weird" else 1.0


def test_each_failure_is_its_trajectorys_with_a_reason(scripted_sampler, make_proxy, rollout, tiny_tokenizer):
    modes = ["ok", "raise", "hang", "silent", "loop", "weird", "big", "long"]
    sched = make_proxy(scripted_sampler(["fine"]), agent=_agent, agent_timeout=2, max_requests=3,
                       max_request_bytes=4096, max_request_tokens=200)
    trajs = rollout(sched, [prompt(tiny_tokenizer, mode=m) for m in modes])
    by = dict(zip(modes, trajs))
    assert by["ok"].status == "ok" and by["ok"].infos["agent_reward"] == 1.0
    assert by["big"].status == "ok" and by["long"].status == "ok"
    assert by["raise"].status == "failed" and by["raise"].reason.endswith("raised ValueError: boom")
    assert by["hang"].status == "failed" and "did not finish within 2 s (agent_timeout)" in by["hang"].reason
    assert by["silent"].status == "failed" and "made no request to the proxy" in by["silent"].reason
    assert by["loop"].status == "failed"
    assert by["loop"].reason.startswith("this trajectory made 4 requests; max_requests is 3")
    assert by["weird"].status == "failed" and "returned str 'a string'" in by["weird"].reason


def test_agent_concurrency_bounds_the_agents_running(scripted_sampler, make_proxy, rollout, tiny_tokenizer):
    live = {"now": 0, "peak": 0}

    async def agent(client: openai.AsyncOpenAI, row: dict[str, Any]) -> float:
        live["now"] += 1
        live["peak"] = max(live["peak"], live["now"])
        try:
            await client.chat.completions.create(model="m", messages=ASK)
            await asyncio.sleep(0.05)
        finally:
            live["now"] -= 1
        return 1.0

    trajs = rollout(make_proxy(scripted_sampler(["a"], delay=0.02), agent=agent, agent_concurrency=2), n=6)
    assert all(t.status == "ok" for t in trajs) and live["peak"] == 2


def test_a_request_after_the_trajectory_is_refused(scripted_sampler, make_proxy, rollout):
    kept: dict[str, Any] = {}

    async def agent(client: openai.AsyncOpenAI, row: dict[str, Any]) -> float:
        await client.chat.completions.create(model="m", messages=ASK)
        kept["key"], kept["url"] = client.api_key, str(client.base_url)
        return 1.0

    sched = make_proxy(scripted_sampler(["a"]), agent=agent)
    (traj,) = rollout(sched)
    assert traj.status == "ok"
    late = openai.OpenAI(base_url=kept["url"], api_key=kept["key"], max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="unknown or expired API key"):
        late.chat.completions.create(model="m", messages=ASK)
    late.close()


def test_options_are_checked_in_one_line(tiny_tokenizer):
    with pytest.raises(ConfigError, match="needs one agent: --agent my_pkg.agent:run"):
        AgentProxyScheduler(tokenizer=tiny_tokenizer)
    with pytest.raises(ConfigError, match="not both"):
        AgentProxyScheduler(tokenizer=tiny_tokenizer, agent=_agent, agent_cmd="python x.py")
    with pytest.raises(ConfigError, match="cannot import 'no_such_module_x'"):
        AgentProxyScheduler(tokenizer=tiny_tokenizer, agent="no_such_module_x:run")
    with pytest.raises(ConfigError, match="agent_sampling 'loose' is not one of refuse, ignore"):
        AgentProxyScheduler(tokenizer=tiny_tokenizer, agent=_agent, agent_sampling="loose")
    with pytest.raises(ConfigError, match="takes no tools option: each request carries its own tools"):
        AgentProxyScheduler(tokenizer=tiny_tokenizer, agent=_agent, tools=[{"type": "function", "function": {"name": "f"}}])
    with pytest.raises(ConfigError, match="agent_timeout must be a positive number"):
        AgentProxyScheduler(tokenizer=tiny_tokenizer, agent=_agent, agent_timeout=0)
