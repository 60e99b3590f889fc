"""Exact tokens across an agent's requests: tool calls read by the family's parser, conversations
that extend (one sequence), re-serialized messages that render the same (appended), and agents that
rewrite their history (a new sample each time, each held to its own conversation)."""

from __future__ import annotations

import json
from typing import Any

import openai

from rlcore.rollout.invariants import check_trajectory
from rlcore.testing.multi_turn import assert_rows_are_sampler_calls

from rl_plugin_agents.examples.calculator import TOOLS, run as calculator_agent
from rl_plugin_agents.testing import CALL


def test_a_tool_calling_agent_is_one_exact_sequence(scripted_sampler, make_proxy, rollout, recorded, tiny_tokenizer):
    rec = recorded(scripted_sampler([CALL, "It is 156."]))
    (traj,) = rollout(make_proxy(rec, agent=calculator_agent))
    assert traj.status == "ok", traj.reason
    assert traj.infos["agent_reward"] == 1.5 and traj.infos["agent"] == {"used_tool": True}
    assert traj.infos["proxy"] == {"requests": 2, "appended": 1, "rerendered": 0, "new_samples": 0, "sampling_ignored": 0,
                                   "tool_choice_unmet": 0}
    assert [m["role"] for m in traj.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert traj.messages[3]["content"] == "156" and traj.infos["template_tools"] == TOOLS
    assert [t.role for t in traj.turns] == ["assistant", "tool", "assistant"]
    assert check_trajectory(traj, tiny_tokenizer) == []
    assert assert_rows_are_sampler_calls([traj], rec.records, tiny_tokenizer) == 1


def test_the_reply_carries_parsed_calls(scripted_sampler, make_proxy, rollout):
    got: dict[str, Any] = {}

    async def agent(client: openai.AsyncOpenAI, row: dict[str, Any]) -> float:
        r = await client.chat.completions.create(model="m", messages=row["messages"], tools=TOOLS)
        got["plain"] = r
        r = await client.chat.completions.create(model="m", messages=row["messages"], tools=TOOLS, tool_choice="none")
        got["none"] = r
        return 0.0

    (traj,) = rollout(make_proxy(scripted_sampler([f"Let me compute. {CALL}"]), agent=agent))
    assert traj.status == "ok", traj.reason
    choice = got["plain"].choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me compute."
    (call,) = choice.message.tool_calls
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {"expression": "12*13"}
    assert call.id.startswith("call_")
    assert got["none"].choices[0].message.tool_calls is None and CALL in got["none"].choices[0].message.content


def _compacting_agent(edit: str):
    """An agent that calls the model, then sends a history of its own making (see ``edit``)."""

    async def agent(client: openai.AsyncOpenAI, row: dict[str, Any]) -> float:
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": row["prompt"]}]
        first = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        reply = first.choices[0].message.model_dump(exclude_none=True)
        if edit == "reasoning":  # sent back with a field the template does not render: the same text
            history = messages + [{**reply, "reasoning_content": "I should use the tool."}, {"role": "user", "content": "Go on."}]
        elif edit == "compact":  # the exchange summarized into one user message
            history = [messages[0], {"role": "user", "content": f"{row['prompt']} The calculator says 156."}]
        else:  # the first user message edited, the reply kept
            history = [messages[0], {"role": "user", "content": "Compute 12 * 13."}, reply,
                       {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "156"}]
        second = await client.chat.completions.create(model="m", messages=history, tools=TOOLS)
        third = await client.chat.completions.create(
            model="m", messages=history + [second.choices[0].message.model_dump(exclude_none=True),
                                           {"role": "user", "content": "Sure?"}], tools=TOOLS)
        return 1.0 if "156" in (third.choices[0].message.content or "") else 0.0

    return agent


def test_a_history_that_renders_the_same_is_appended(scripted_sampler, make_proxy, rollout, recorded, tiny_tokenizer):
    rec = recorded(scripted_sampler(["Let me think.", "156", "Yes, 156."]))
    (traj,) = rollout(make_proxy(rec, agent=_compacting_agent("reasoning")))
    assert traj.status == "ok", traj.reason
    assert traj.infos["proxy"]["rerendered"] == 1 and traj.infos["proxy"]["new_samples"] == 0
    assert not traj.has_turn_samples
    assert check_trajectory(traj, tiny_tokenizer) == []
    assert assert_rows_are_sampler_calls([traj], rec.records, tiny_tokenizer) == 1


def test_rewritten_histories_are_new_samples_each_exact(scripted_sampler, make_proxy, rollout, recorded, tiny_tokenizer):
    for edit in ("compact", "edit"):
        rec = recorded(scripted_sampler([CALL, "156", "Yes, 156."]))
        (traj,) = rollout(make_proxy(rec, agent=_compacting_agent(edit)))
        assert traj.status == "ok", (edit, traj.reason)
        assert traj.infos["agent_reward"] == 1.0
        assert traj.infos["proxy"]["new_samples"] == 1 and traj.infos["proxy"]["appended"] == 1, edit
        samples = traj.turn_samples()
        assert len(samples) == 2
        # the first sample is the first request and its reply, in the conversation it was made in
        assert samples[0].messages[:2] == [{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": "What is 12 * 13?"}]
        assert samples[0].messages[2]["content"] == CALL
        # the second: the agent's own history, then two replies appended in one sequence
        assert samples[1].messages[-1] == {"role": "assistant", "content": "Yes, 156."}
        assert samples[1].messages == traj.messages
        assert all(s.reward == traj.reward and s.uuid == traj.uuid for s in samples)
        assert check_trajectory(traj, tiny_tokenizer) == []
        assert assert_rows_are_sampler_calls([traj], rec.records, tiny_tokenizer) == 2
