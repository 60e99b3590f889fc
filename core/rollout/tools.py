"""Tool calling: parse ``<tool_call>`` JSON from completions, run tools, reply with tool messages.

The format is the Hermes/Qwen one the chat templates render: ``<tool_call>{"name": …, "arguments":
{…}}</tool_call>``. Tools are plain functions (sync or ``async def``); their JSON schemas come from
their signatures so the chat template can show them to the model. A tool that raises does not end
the rollout: the error goes back to the model as the tool's answer, which is what it must learn
to handle. :class:`EnvTool` exposes an environment's actions as tools; :class:`ToolScheduler`
loops until the model stops calling tools or ``max_turns``.
"""

from __future__ import annotations

import ast
import inspect
import json
import operator
import re
from typing import Any, Callable

import attrs

from ..asyncutil import to_thread_if_sync
from ..types import Completion, Trajectory
from .scheduler import MultiTurnScheduler
from .tokens import encode_prompt

_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}


@attrs.define
class ToolCall:
    """One parsed call; ``error`` is set when the JSON could not be understood."""

    name: str
    arguments: dict[str, Any] = attrs.field(factory=dict)
    error: str | None = None


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>`` block in ``text``, in order; malformed ones carry an ``error``."""
    calls = []
    for raw in _CALL_RE.findall(text or ""):
        try:
            obj = json.loads(raw)
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                raise ValueError("expected an object with a string 'name'")
            args = obj.get("arguments", obj.get("parameters", {}))
            if isinstance(args, str):
                args = json.loads(args) if args.strip() else {}
            if not isinstance(args, dict):
                raise ValueError("'arguments' must be an object")
            calls.append(ToolCall(obj["name"], args))
        except (ValueError, json.JSONDecodeError) as exc:
            calls.append(ToolCall("", {}, error=f"invalid tool call {raw[:80]!r}: {exc}"))
    return calls


def schema_of(fn: Callable[..., Any], name: str | None = None, description: str | None = None) -> dict[str, Any]:
    """An OpenAI-style function schema from a Python signature (type hints → JSON types)."""
    sig = inspect.signature(fn)
    props: dict[str, Any] = {}
    required = []
    for pname, p in sig.parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        ann = p.annotation if p.annotation is not inspect.Parameter.empty else str
        if isinstance(ann, str):
            ann = {"int": int, "float": float, "str": str, "bool": bool, "list": list, "dict": dict}.get(ann, str)
        props[pname] = {"type": _JSON_TYPES.get(ann, "string")}
        if p.default is inspect.Parameter.empty:
            required.append(pname)
    doc = description or (inspect.getdoc(fn) or "").split("\n\n")[0]
    return {
        "type": "function",
        "function": {
            "name": name or fn.__name__,
            "description": doc,
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


class ToolManager:
    """Registered tools by name: schemas for the template, parsing, and calling."""

    def __init__(self, tools: dict[str, Callable[..., Any]] | list[Callable[..., Any]] | None = None) -> None:
        self._tools: dict[str, Callable[..., Any]] = {}
        self._schemas: dict[str, dict[str, Any]] = {}
        items = tools.items() if isinstance(tools, dict) else [(None, t) for t in (tools or [])]
        for name, fn in items:
            self.register(fn, name=name)

    def register(self, fn: Callable[..., Any], *, name: str | None = None, description: str | None = None,
                 schema: dict[str, Any] | None = None) -> Callable[..., Any]:
        """Add a tool (usable as a decorator). ``schema`` overrides the one derived from the signature."""
        tool_name = name or getattr(fn, "__name__", None) or type(fn).__name__
        self._tools[tool_name] = fn
        self._schemas[tool_name] = schema or schema_of(fn, tool_name, description)
        return fn

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """What the chat template renders (``apply_chat_template(..., tools=schemas)``)."""
        return list(self._schemas.values())

    def parse(self, text: str) -> list[ToolCall]:
        return parse_tool_calls(text)

    async def call(self, call: ToolCall) -> str:
        """Run one call; any problem (unknown tool, bad arguments, exception) becomes the answer text."""
        if call.error:
            return f"Error: {call.error}"
        fn = self._tools.get(call.name)
        if fn is None:
            return f"Error: unknown tool {call.name!r}; available: {', '.join(self.names) or 'none'}"
        try:
            result = await to_thread_if_sync(fn, **call.arguments)
        except Exception as exc:  # noqa: BLE001 - the model sees the error and may retry
            return f"Error: {call.name} raised {type(exc).__name__}: {exc}"
        return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)

    async def run(self, text: str) -> list[dict[str, Any]]:
        """Tool messages (role ``tool``) answering every call in ``text``, in order."""
        out = []
        for call in self.parse(text):
            out.append({"role": "tool", "name": call.name, "content": await self.call(call)})
        return out


class EnvTool:
    """An environment's actions as tools: each call steps the env and answers with its observation.

    If the env lists ``actions`` (names), each becomes a tool without arguments; otherwise one tool
    ``name(action: str)`` takes the action text. Rewards accumulate in ``rewards``; ``done`` turns
    True when the env says so (a :class:`ToolScheduler` then stops).
    """

    def __init__(self, env: Any, *, name: str = "act", actions: list[str] | None = None) -> None:
        self.env = env
        self.name = name
        self.actions = list(actions if actions is not None else getattr(env, "actions", None) or [])
        self.rewards: list[float] = []
        self.done = False

    async def reset(self, request: Any) -> Any:
        return await to_thread_if_sync(self.env.reset, request)

    async def act(self, action: str) -> str:
        """Step the environment with ``action``; the observation comes back as the tool's answer."""
        if self.done:
            return "The episode is over."
        out = await to_thread_if_sync(self.env.step, action)
        obs, reward, done = (out.observation, out.reward, out.done) if hasattr(out, "observation") else out[:3]
        self.rewards.append(float(reward or 0.0))
        self.done = bool(done)
        return f"{obs}" + ("\n(episode finished)" if self.done else "")

    def register_into(self, manager: ToolManager) -> ToolManager:
        """Add this env's tools to ``manager``."""
        if self.actions:
            for action in self.actions:
                async def fn(_a: str = action) -> str:
                    return await self.act(_a)

                manager.register(fn, name=action, schema=schema_of(lambda: None, action, f"take the action {action!r}"))
        else:
            async def step(action: str) -> str:
                return await self.act(action)

            manager.register(step, name=self.name, description="take an action in the environment")
        return manager

    @property
    def total_reward(self) -> float:
        return float(sum(self.rewards))


# --- a safe calculator: the built-in tool of the tool scheduler ---------------------------------------
_OPS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos,
}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (+ - * / // % ** and parentheses)."""

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            if isinstance(node.op, ast.Pow) and abs(ev(node.right)) > 100:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError(f"unsupported expression element {type(node).__name__}")

    value = ev(ast.parse(str(expression), mode="eval"))
    return str(int(value) if isinstance(value, float) and value.is_integer() else value)


class ToolScheduler(MultiTurnScheduler):
    """Runs the model's tool calls and feeds back the results until it stops calling tools.

    Options: ``tools`` (a :class:`ToolManager`, a dict name → function, or a list of functions;
    default: a safe ``calculator``), ``max_turns`` (4). The tool schemas are rendered into the
    prompt by the chat template. Stats in ``infos``: ``tool_calls``, ``tool_errors``.
    """

    name = "tool_scheduler"

    def __init__(self, sampler: Any = None, *, tools: Any = None, **kwargs: Any) -> None:
        manager = tools if isinstance(tools, ToolManager) else ToolManager(tools if tools is not None else [calculator])
        super().__init__(sampler, tools=manager.schemas, **kwargs)
        self.tool_manager = manager

    def on_trajectory_start(self, trajectories: list[Trajectory]) -> None:
        tok = self._require_tokenizer()
        for t in trajectories:
            if t.status == "running" and t.messages:
                t.prompt_ids = encode_prompt(tok, t.messages, tools=self.template_tools)

    def check_finished(self, infer_request: Trajectory, response_choice: Completion, current_turn: int) -> bool:
        if super().check_finished(infer_request, response_choice, current_turn):
            return True
        return not self.tool_manager.parse(response_choice.message.content)

    async def step(self, infer_request: Trajectory, response_choice: Completion, current_turn: int) -> dict[str, Any]:
        replies = await self.tool_manager.run(response_choice.message.content)
        infer_request.messages.extend(replies)
        infos = infer_request.infos
        infos["tool_calls"] = int(infos.get("tool_calls", 0)) + len(replies)
        infos["tool_errors"] = int(infos.get("tool_errors", 0)) + sum(1 for r in replies if str(r["content"]).startswith("Error:"))
        return {"infer_request": infer_request}
