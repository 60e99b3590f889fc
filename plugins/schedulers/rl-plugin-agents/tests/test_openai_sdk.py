"""The real ``openai`` SDK against the proxy, generating with the real tiny model: async, sync and
streaming clients; what the reply says matches what the trajectory trains on, exactly."""

from __future__ import annotations

import socket
from typing import Any

import openai
import pytest

from rlcore.rollout.invariants import check_trajectory
from rlcore.testing.multi_turn import assert_rows_are_sampler_calls

from rl_plugin_agents.server import HOST

ASK = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 12 * 13?"}]


def _sampled_text(traj: Any) -> str:
    return traj.messages[-1]["content"]


def test_async_client_two_requests_one_exact_sequence(tiny_hf_sampler, make_proxy, rollout, recorded, tiny_tokenizer):
    seen: dict[str, Any] = {}

    async def agent(client: openai.AsyncOpenAI, row: dict[str, Any]) -> float:
        assert row["answer"] == "156" and row["prompt"] == "What is 12 * 13?"
        seen["models"] = [m.id async for m in client.models.list()]
        first = await client.chat.completions.create(model="policy", messages=ASK, max_tokens=6)
        seen["first"] = first
        messages = ASK + [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Again."}]
        second = await client.chat.completions.create(model="policy", messages=messages, max_tokens=6, logprobs=True)
        seen["second"] = second
        return 0.25

    rec = recorded(tiny_hf_sampler)
    (traj,) = rollout(make_proxy(rec, agent=agent))
    assert traj.status in ("ok", "truncated"), traj.reason
    assert traj.infos["agent_reward"] == 0.25
    assert traj.infos["proxy"]["requests"] == 2 and traj.infos["proxy"]["appended"] == 1
    assert traj.infos["proxy"]["new_samples"] == 0 and not traj.has_turn_samples
    first, second = seen["first"], seen["second"]
    assert first.choices[0].message.content == traj.messages[2]["content"]
    assert second.choices[0].message.content == _sampled_text(traj)
    assert first.usage.completion_tokens == len(rec.records[0][1].token_ids)
    assert first.usage.prompt_tokens == len(rec.records[0][0]) == len(traj.prompt_ids)
    assert [lp.logprob for lp in second.choices[0].logprobs.content] == pytest.approx(rec.records[1][1].logprobs)
    assert seen["models"] and traj.num_turns == 2
    assert check_trajectory(traj, tiny_tokenizer) == []
    assert assert_rows_are_sampler_calls([traj], rec.records, tiny_tokenizer) == 1


def test_sync_client_in_a_plain_function(tiny_hf_sampler, make_proxy, rollout, recorded, tiny_tokenizer):
    def agent(client: openai.OpenAI, row: dict[str, Any]) -> dict[str, Any]:
        reply = client.chat.completions.create(model="policy", messages=row["messages"], max_tokens=5)
        return {"reward": 1.0, "said": reply.choices[0].message.content}

    rec = recorded(tiny_hf_sampler)
    (traj,) = rollout(make_proxy(rec, agent=agent))
    assert traj.status in ("ok", "truncated"), traj.reason
    assert traj.infos["agent_reward"] == 1.0 and traj.infos["agent"]["said"] == _sampled_text(traj)
    assert assert_rows_are_sampler_calls([traj], rec.records, tiny_tokenizer) == 1


def test_streaming_gives_the_same_reply_and_its_usage(tiny_hf_sampler, make_proxy, rollout, recorded, tiny_tokenizer):
    got: dict[str, Any] = {}

    async def agent(client: openai.AsyncOpenAI, row: dict[str, Any]) -> float:
        stream = await client.chat.completions.create(model="policy", messages=ASK, max_tokens=6, stream=True,
                                                      stream_options={"include_usage": True})
        parts, finish, usage = [], None, None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                parts.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        got.update(text="".join(parts), finish=finish, usage=usage)
        return 0.0

    rec = recorded(tiny_hf_sampler)
    (traj,) = rollout(make_proxy(rec, agent=agent))
    assert traj.status in ("ok", "truncated"), traj.reason
    assert got["text"] == _sampled_text(traj)
    assert got["finish"] == ("length" if rec.records[0][1].finish_reason == "length" else "stop")
    assert got["usage"].completion_tokens == len(rec.records[0][1].token_ids)
    assert assert_rows_are_sampler_calls([traj], rec.records, tiny_tokenizer) == 1


def test_another_temperature_is_refused_or_with_ignore_counted(tiny_hf_sampler, make_proxy, rollout):
    errors: list[Any] = []

    async def agent(client: openai.AsyncOpenAI, row: dict[str, Any]) -> float:
        try:
            await client.chat.completions.create(model="policy", messages=ASK, temperature=0.2, max_tokens=4)
        except openai.BadRequestError as exc:
            errors.append(exc)
        await client.chat.completions.create(model="policy", messages=ASK, temperature=1.0, top_p=1.0, max_tokens=4)
        return 1.0

    (traj,) = rollout(make_proxy(tiny_hf_sampler, agent=agent))
    assert traj.status in ("ok", "truncated") and traj.infos["proxy"]["requests"] == 2
    (err,) = errors
    assert err.status_code == 400 and err.body["param"] == "temperature"
    assert "temperature=0.2" in err.message and "--agent-sampling ignore" in err.message
    errors.clear()
    (traj,) = rollout(make_proxy(tiny_hf_sampler, agent=agent, agent_sampling="ignore"))
    assert not errors and traj.infos["proxy"]["sampling_ignored"] == 1


def test_bad_requests_are_one_clear_error_each(tiny_hf_sampler, make_proxy, rollout):
    caught: dict[str, Any] = {}

    async def agent(client: openai.AsyncOpenAI, row: dict[str, Any]) -> float:
        for name, kwargs in {"n": {"n": 2}, "json": {"response_format": {"type": "json_object"}},
                             "image": {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
                             "last_assistant": {"messages": ASK + [{"role": "assistant", "content": "1"}]}}.items():
            try:
                await client.chat.completions.create(model="policy", **{"messages": ASK, **kwargs})
            except openai.BadRequestError as exc:
                caught[name] = exc.message
        stranger = openai.AsyncOpenAI(base_url=str(client.base_url), api_key="not-a-session", max_retries=0)
        try:
            await stranger.chat.completions.create(model="policy", messages=ASK)
        except openai.AuthenticationError as exc:
            caught["key"] = exc.message
        await stranger.close()
        await client.chat.completions.create(model="policy", messages=ASK, max_tokens=3)
        return 0.0

    (traj,) = rollout(make_proxy(tiny_hf_sampler, agent=agent))
    assert traj.status in ("ok", "truncated"), traj.reason
    assert "n=2" in caught["n"] and "constrained decoding" in caught["json"]
    assert "'image_url' part" in caught["image"] and "last message is an assistant" in caught["last_assistant"]
    assert "unknown or expired API key" in caught["key"]
    assert traj.infos["proxy"]["requests"] == 5  # the stranger's request never reached the session


def test_the_endpoint_listens_on_loopback_only(tiny_hf_sampler, make_proxy):
    sched = make_proxy(tiny_hf_sampler, agent=lambda client, row: 0.0)
    server = sched.ensure_server()
    assert HOST == "127.0.0.1" and server.url.startswith("http://127.0.0.1:")
    sock = server._server.servers[0].sockets[0]
    assert sock.getsockname()[0] == "127.0.0.1" and sock.family == socket.AF_INET
