"""The EnvTool path: OpenEnv actions as tool calls, against a real server."""

from __future__ import annotations

import json

import pytest
import rlcore
from rlcore.rollout import render, run_rollouts
from rlcore.testing import ScriptedSampler
from rlcore.types import Prompt, SamplingParams

from rl_plugin_openenv.server import ServerThread
from rl_plugin_openenv.tools import discover_tools


def call(name: str, **arguments) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


async def test_action_schema_becomes_one_typed_tool(server):
    (spec,) = await discover_tools(server)
    assert spec.name == "guess" and not spec.mcp
    assert set(spec.parameters["properties"]) == {"guess", "message"}
    assert spec.action({"guess": 3}) == {"guess": 3}
    (named,) = await discover_tools(server, tool_name="play")
    assert named.name == "play"


async def test_tool_calls_step_the_env_and_rewards_flow(server, tokenizer):
    replies = [call("guess", guess="ten"), call("guess", guess=10), call("guess", guess=12)]
    sampler = ScriptedSampler(replies, tokenizer=tokenizer)
    sched = rlcore.get("scheduler", "openenv_tool_scheduler")(sampler, tokenizer=tokenizer, env_url=server, max_turns=5)
    prompts = [Prompt([], [], data={"env_config": {"target": 12}})]
    (t,) = (await run_rollouts(sched, prompts, sampling_params=SamplingParams(max_tokens=40), progress=False)).trajectories
    assert t.status == "ok" and t.num_turns == 3
    assert t.step_rewards == [0.0, 0.0, 1.0] and t.total_reward == 1.0
    assert t.infos["tool_calls"] == 3 and t.infos["tool_errors"] == 1
    tool_msgs = [m for m in t.messages if m["role"] == "tool"]
    assert tool_msgs[0]["content"].startswith("Error: guess raised ActionRejected") and "valid integer" in tool_msgs[0]["content"]
    assert tool_msgs[1]["content"].startswith("10 is too low.")
    assert len(tool_msgs) == 2  # the winning call ends the episode: nothing appended after it
    assert '"name": "guess"' in tokenizer.decode(t.prompt_ids)  # the tool schema is in the prompt
    # token-exact: the stream equals the template rendering of the final conversation
    assert tokenizer.decode(t.input_ids, skip_special_tokens=False) + "\n" == render(tokenizer, t.messages, tools=sched.tools)


async def test_a_qwen3_5_model_calls_the_env_in_its_xml_format(server, tokenizer):
    """Under Qwen3.5's original template (TRL's copy) the calls are its XML, found by tool_parser
    auto and typed by the tool's schema ("10" is the integer the action wants)."""
    import copy

    from rlcore.rollout.tool_parsers import trl_template_dir

    if trl_template_dir() is None:
        pytest.skip("TRL's chat templates are not installed")
    tok = copy.copy(tokenizer)
    tok.chat_template = (trl_template_dir() / "qwen3_5_nothink.jinja").read_text(encoding="utf-8")

    def xml(n: int) -> str:
        return f"<tool_call>\n<function=guess>\n<parameter=guess>\n{n}\n</parameter>\n</function>\n</tool_call>"

    sched = rlcore.get("scheduler", "openenv_tool_scheduler")(ScriptedSampler([xml(10), xml(12)], tokenizer=tok),
                                                               tokenizer=tok, env_url=server, max_turns=5)
    prompts = [Prompt([], [], data={"env_config": {"target": 12}})]
    (t,) = (await run_rollouts(sched, prompts, sampling_params=SamplingParams(max_tokens=60), progress=False)).trajectories
    assert t.status == "ok" and t.step_rewards == [0.0, 1.0]
    assert t.infos["tool_calls"] == 2 and t.infos["tool_errors"] == 0
    assert [m for m in t.messages if m["role"] == "tool"][0]["content"].startswith("10 is too low.")


async def test_reply_without_tool_call_ends_episode(server, tokenizer):
    sampler = ScriptedSampler(["I give up."], tokenizer=tokenizer)
    sched = rlcore.get("scheduler", "openenv_tool_scheduler")(sampler, tokenizer=tokenizer, env_url=server, max_turns=5)
    (t,) = (await run_rollouts(sched, [Prompt([], [], data={})], sampling_params=SamplingParams(max_tokens=20),
                               progress=False)).trajectories
    assert t.status == "ok" and t.num_turns == 1 and t.total_reward == 0.0


@pytest.fixture(scope="module")
def mcp_server():
    with ServerThread("guess_number_mcp", max_concurrent_envs=4) as url:
        yield url


async def test_mcp_environment_tools_are_listed_and_called(mcp_server, tokenizer):
    specs = await discover_tools(mcp_server)
    assert [s.name for s in specs] == ["guess", "hint"] and all(s.mcp for s in specs)
    assert specs[0].action({"number": 3}) == {"type": "call_tool", "tool_name": "guess", "arguments": {"number": 3}}
    replies = [call("hint"), call("guess", number="x"), call("guess", number=9)]
    sched = rlcore.get("scheduler", "openenv_tool_scheduler")(ScriptedSampler(replies, tokenizer=tokenizer),
                                                               tokenizer=tokenizer, env_url=mcp_server, max_turns=5)
    prompts = [Prompt([], [], data={"env_config": {"target": 9, "high": 10}})]
    (t,) = (await run_rollouts(sched, prompts, sampling_params=SamplingParams(max_tokens=40), progress=False)).trajectories
    assert t.status == "ok" and t.step_rewards == [0.0, 0.0, 1.0]
    assert t.messages[0]["content"].startswith("I am thinking of a number between 1 and 10.")
    tool_msgs = [m["content"] for m in t.messages if m["role"] == "tool"]
    assert tool_msgs[0] == "The number is between 1 and 10."
    assert tool_msgs[1].startswith("Error: 1 validation error for call[guess]")
