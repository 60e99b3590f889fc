"""A real agent framework through the proxy: OpenAI's Agents SDK (``openai-agents``) running its
own tool-calling loop (``Runner.run`` with a ``function_tool``) on the client it is handed — with
scripted replies, the real tiny model, and the real SmolLM2 — every request recorded exactly.

Why the Agents SDK: it is OpenAI's own, actively released, built on the ``openai`` client (so
the proxy's client plugs straight in: ``OpenAIChatCompletionsModel(openai_client=client)``) and
runs fully offline once tracing is off."""

from __future__ import annotations

from typing import Any

import pytest

agents = pytest.importorskip("agents")

from rlcore.rollout.invariants import check_trajectory  # noqa: E402
from rlcore.testing.multi_turn import assert_rows_are_sampler_calls  # noqa: E402

from rl_plugin_agents.testing import CALL, prompt  # noqa: E402

agents.set_tracing_disabled(True)
CALLS: list[str] = []


@agents.function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    from rlcore.rollout.tools import calculator as evaluate

    CALLS.append(expression)
    return evaluate(expression)


async def framework_agent(client: Any, row: dict[str, Any]) -> dict[str, Any]:
    model = agents.OpenAIChatCompletionsModel(model="policy", openai_client=client)
    agent = agents.Agent(name="calc", instructions="Use the calculator tool, then answer.", tools=[calculator], model=model)
    try:
        result = await agents.Runner.run(agent, row["prompt"], max_turns=3)
    except agents.exceptions.MaxTurnsExceeded:
        return {"reward": 0.0, "answer": None}
    answer = str(result.final_output)
    return {"reward": 1.0 if row["answer"] in answer else 0.0, "answer": answer}


def test_the_agents_sdk_tool_loop_is_exact(scripted_sampler, make_proxy, rollout, recorded, tiny_tokenizer):
    CALLS.clear()
    rec = recorded(scripted_sampler([CALL, "The answer is 156."]))
    (traj,) = rollout(make_proxy(rec, agent=framework_agent))
    assert traj.status == "ok", traj.reason
    assert CALLS == ["12*13"] and traj.infos["agent"]["answer"] == "The answer is 156." and traj.infos["agent_reward"] == 1.0
    assert [m["role"] for m in traj.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert traj.infos["proxy"]["appended"] == 1 and traj.infos["proxy"]["new_samples"] == 0
    assert check_trajectory(traj, tiny_tokenizer) == []
    assert assert_rows_are_sampler_calls([traj], rec.records, tiny_tokenizer) == 1


def test_the_agents_sdk_with_the_tiny_model(tiny_hf_sampler, make_proxy, rollout, recorded, tiny_tokenizer):
    rec = recorded(tiny_hf_sampler)
    trajs = rollout(make_proxy(rec, agent=framework_agent, max_tokens=16), n=2)
    assert all(t.status in ("ok", "truncated") for t in trajs), [t.reason for t in trajs]
    assert all(t.infos["proxy"]["requests"] >= 1 for t in trajs)
    assert all(check_trajectory(t, tiny_tokenizer) == [] for t in trajs)
    assert assert_rows_are_sampler_calls(trajs, rec.records, tiny_tokenizer) == sum(len(t.turn_samples()) for t in trajs)


@pytest.mark.filterwarnings("ignore:the chat template of .* does not render tool schemas")  # SmolLM2's template shows no tools
def test_the_agents_sdk_with_smollm2(smollm2_hf_sampler, make_proxy, rollout, recorded, smollm2_tokenizer):
    rec = recorded(smollm2_hf_sampler)
    sched = make_proxy(rec, agent=framework_agent, max_tokens=48)
    (traj,) = rollout(sched, [prompt(smollm2_tokenizer)])
    assert traj.status in ("ok", "truncated"), traj.reason
    assert traj.messages[0] == {"role": "system", "content": "Use the calculator tool, then answer."}
    assert check_trajectory(traj, smollm2_tokenizer) == []
    assert assert_rows_are_sampler_calls([traj], rec.records, smollm2_tokenizer) == len(traj.turn_samples())
