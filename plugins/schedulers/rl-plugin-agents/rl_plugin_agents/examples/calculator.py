"""An agent with a calculator tool, written against the ``openai`` SDK as it would be for any
OpenAI-compatible server — nothing in it knows about rlcore:

    rlcore train --scheduler agent_proxy --agent rl_plugin_agents.examples.calculator:run

It asks the question with the tool offered, runs each call the model makes and answers it with a
``tool`` message, until the model replies without calling (at most ``MAX_ROUNDS`` requests). The
reward: 1 for a final reply whose last number is the answer, plus ``TOOL_BONUS`` once the model has
called the calculator with an expression that evaluates (the episode's shape the task wants).
"""

from __future__ import annotations

import json
import re
from typing import Any

from rlcore.rollout.tools import calculator

MAX_ROUNDS = 3
TOOL_BONUS = 0.5
SYSTEM = "Use the calculator tool for arithmetic, then give the result."
TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def evaluate(arguments: str) -> tuple[str, bool]:
    """The tool's answer to a call's arguments (JSON text) and whether it computed something."""
    try:
        expression = json.loads(arguments or "{}").get("expression", "")
        return calculator(str(expression)), True
    except Exception as exc:  # noqa: BLE001 - the model is told what went wrong, as a real tool would
        return f"Error: {exc}", False


def score(answer: str, expected: Any, used_tool: bool) -> float:
    numbers = _NUMBER.findall(answer or "")
    correct = bool(numbers) and expected is not None and numbers[-1] == str(expected)
    return float(correct) + (TOOL_BONUS if used_tool else 0.0)


async def run(client: Any, row: dict[str, Any]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": row["prompt"]}]
    used_tool = False
    answer = ""
    for _ in range(MAX_ROUNDS):
        response = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        answer = message.content or ""
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            result, ok = evaluate(call.function.arguments)
            used_tool = used_tool or ok
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return {"reward": score(answer, row.get("answer"), used_tool), "used_tool": used_tool}
