"""ToolManager parsing/calling, EnvTool, and the tool scheduler end to end with the tiny template."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from rlcore.rollout import EnvTool, ToolManager, ToolScheduler, parse_tool_calls, render, run_rollouts
from rlcore.rollout.tools import calculator
from rlcore.data import load_prompts
from rlcore.testing import ScriptedSampler
from rlcore.types import SamplingParams


@pytest.fixture(scope="module")
def tok(tiny_model_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_parse_tool_calls() -> None:
    text = 'ok <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call> and ' \
           '<tool_call>{"name": "echo", "arguments": "{\\"x\\": \\"hi\\"}"}</tool_call><tool_call>{oops}</tool_call>'
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in calls[:2]] == [("add", {"a": 1, "b": 2}), ("echo", {"x": "hi"})]
    assert calls[2].error and "invalid tool call" in calls[2].error
    assert parse_tool_calls("no calls here") == []


async def test_tool_manager_sync_async_and_errors() -> None:
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    async def shout(text: str) -> str:
        await asyncio.sleep(0)
        return text.upper()

    def broken() -> str:
        raise ValueError("disk full")

    tm = ToolManager([add, shout, broken])
    schema = tm.schemas[0]["function"]
    assert schema["name"] == "add" and schema["description"] == "Add two integers."
    assert schema["parameters"]["properties"] == {"a": {"type": "integer"}, "b": {"type": "integer"}}
    text = ('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 5}}</tool_call>'
            '<tool_call>{"name": "shout", "arguments": {"text": "hi"}}</tool_call>'
            '<tool_call>{"name": "broken", "arguments": {}}</tool_call>'
            '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
            '<tool_call>{"name": "add", "arguments": {"z": 1}}</tool_call>')
    msgs = await tm.run(text)
    assert [m["content"] for m in msgs[:3]] == ["7", "HI", "Error: broken raised ValueError: disk full"]
    assert msgs[3]["content"].startswith("Error: unknown tool 'nope'; available: add, shout, broken")
    assert msgs[4]["content"].startswith("Error: add raised TypeError")
    assert all(m["role"] == "tool" for m in msgs)


def test_calculator() -> None:
    assert calculator("(2 + 3) * 4") == "20" and calculator("7 / 2") == "3.5"
    with pytest.raises(ValueError):
        calculator("__import__('os')")


async def test_env_tool() -> None:
    class Lamp:
        actions = ["switch_on", "switch_off"]

        def __init__(self) -> None:
            self.on = False

        def step(self, action: str):
            self.on = action == "switch_on"
            return ("light" if self.on else "dark"), (1.0 if self.on else 0.0), self.on, {}

    tool = EnvTool(Lamp())
    tm = tool.register_into(ToolManager())
    assert tm.names == ["switch_on", "switch_off"]
    out = await tm.run('<tool_call>{"name": "switch_off", "arguments": {}}</tool_call>'
                       '<tool_call>{"name": "switch_on", "arguments": {}}</tool_call>')
    assert out[0]["content"] == "dark" and out[1]["content"].startswith("light")
    assert tool.done and tool.total_reward == 1.0

    class Free:
        def step(self, action: str):
            return f"you said {action}", 0.5, False, {}

    free = EnvTool(Free(), name="say")
    tm2 = free.register_into(ToolManager())
    out = await tm2.run('<tool_call>{"name": "say", "arguments": {"action": "hello"}}</tool_call>')
    assert out[0]["content"] == "you said hello" and free.rewards == [0.5]


async def test_tool_scheduler_rollout(tok: Any) -> None:
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "26 + 9"}}\n</tool_call>'
    sampler = ScriptedSampler([call, "35"], tok)
    sched = ToolScheduler(sampler, max_turns=4)
    prompts = load_prompts(None, tok, limit=1, tools=sched.tools)
    res = await run_rollouts(sched, prompts, sampling_params=SamplingParams(max_tokens=40), progress=False)
    t = res.trajectories[0]
    assert t.status == "ok" and t.num_turns == 2 and t.infos["tool_calls"] == 1 and t.infos["tool_errors"] == 0
    assert t.messages[2] == {"role": "tool", "name": "calculator", "content": "35"}
    assert "calculator" in tok.decode(t.prompt_ids)  # the tool schema is in the prompt
    text = tok.decode(t.input_ids, skip_special_tokens=False)
    assert text + "\n" == render(tok, t.messages, tools=sched.tools)
    assert "<tool_response>\n35\n</tool_response>" in t.turns[1].text and set(t.turns[1].loss_mask) == {0}


# --- hostile input: nothing a model writes stalls a tool call (issue 14) ----------------------------
def test_calculator_refuses_towers_before_computing() -> None:
    import time

    t0 = time.monotonic()
    for expr in ("(((9**99)**99)**99)**99", "9**9**9**9", "2**4097", "(9**999)*(9**999)*(9**999)", "1+" * 5000 + "1"):
        with pytest.raises(ValueError, match="too large|too long"):
            calculator(expr)
    assert time.monotonic() - t0 < 5  # microseconds each; the old guard computed (9**99)**99 ...
    assert calculator("2**4095").startswith("5221944407") and calculator("(-1)**(10**100)") == "1"
    assert calculator("((((((((((1))))))))))") == "1"


async def test_tool_calls_have_a_deadline_and_it_is_counted() -> None:
    started = asyncio.Event()

    async def hang(x: str) -> str:
        """Never answers."""
        started.set()
        await asyncio.Event().wait()
        return x

    manager = ToolManager([hang], timeout=0.2)
    stats: dict[str, int] = {}
    replies = await manager.run('<tool_call>{"name": "hang", "arguments": {"x": "a"}}</tool_call>', stats)
    assert started.is_set()
    assert replies[0]["content"] == "Error: hang did not finish within 0.2 s"
    assert stats == {"tool_timeouts": 1} and manager.timeouts == 1
    with pytest.raises(ValueError, match="timeout"):
        ToolManager([hang], timeout=0)


def test_tool_call_floods_and_deep_json_are_bounded() -> None:
    assert parse_tool_calls("<tool_call>" * 100_000) == []
    deep = parse_tool_calls("<tool_call>" + "[" * 100_000 + "</tool_call>")
    assert len(deep) == 1 and deep[0].error
    many = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>' * 500
    replies = asyncio.run(ToolManager([calculator]).run(many))
    assert len(replies) == ToolManager.max_calls and replies[0]["content"] == "2"
