"""Tool calling: parse the tool calls of completions, run tools, reply with tool messages.

The calls are found by a tool parser (:mod:`rlcore.rollout.tool_parsers`, kind ``tool_parser``): the
model family's own format, picked from the chat template by default (``tool_parser="auto"``); the
hand-written one here is ``hermes``, the Hermes/Qwen format: ``<tool_call>{"name": …, "arguments":
{…}}</tool_call>``. Tools are plain functions (sync or ``async def``); their JSON schemas come from
their signatures so the chat template can show them to the model. A tool that raises does not end
the rollout: the error goes back to the model as the tool's answer, which is what it must learn
to handle. :class:`EnvTool` exposes an environment's actions as tools; :class:`ToolScheduler`
loops until the model stops calling tools or ``max_turns``.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import operator
import re
import warnings
import weakref
from typing import Any, Callable

from ..asyncutil import to_thread_if_sync
from ..bounded import DEFAULT_TIMEOUT
from ..types import Trajectory
from .scheduler import MultiTurnScheduler, ResponseChoice
from ..chat_template import ChatTemplateError, encode_prompt, render
from .tool_parsers import ToolCall, check_tool_parser_name, make_tool_parser, parse_tool_calls, run_parser  # noqa: F401 - ToolCall, parse_tool_calls: re-exported

#: A tool's answer longer than this is cut (the model's context is the limit that matters).
MAX_TOOL_REPLY_CHARS = 16_384
_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}


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
    """Registered tools by name: schemas for the template, parsing, and calling.

    ``timeout`` (seconds, default 5) bounds every call: an ``async def`` tool is cancelled, a sync
    tool's answer is no longer awaited (Python cannot stop a thread, so a sync tool that can run
    away on model input must bound its own work, as :func:`calculator` does, or run it in a
    :class:`rlcore.bounded.BoundedWorker`). Either way the model gets an ``Error:`` answer and
    ``timeouts`` counts it. ``None`` disables the bound.
    """

    def __init__(self, tools: dict[str, Callable[..., Any]] | list[Callable[..., Any]] | None = None, *,
                 timeout: float | None = DEFAULT_TIMEOUT, parser: Any = None) -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError(f"tool timeout must be a positive number of seconds or None, got {timeout!r}")
        self.timeout = timeout
        self.timeouts = 0
        #: finds the calls in a message's text (a :class:`~rlcore.rollout.tool_parsers.ToolParser`; None: hermes)
        self.parser = parser
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
        """The calls in ``text``, found by :attr:`parser` (typed by these tools' schemas)."""
        if self.parser is None:
            return parse_tool_calls(text)
        return run_parser(self.parser, text, tools=self.schemas)

    async def call(self, call: ToolCall, stats: dict[str, int] | None = None) -> str:
        """Run one call; any problem (unknown tool, bad arguments, exception, timeout) becomes the
        answer text. A timeout adds 1 to ``stats["tool_timeouts"]`` when ``stats`` is given."""
        if call.error:
            return f"Error: {call.error}"
        fn = self._tools.get(call.name)
        if fn is None:
            return f"Error: unknown tool {call.name!r}; available: {', '.join(self.names) or 'none'}"
        try:
            result = await asyncio.wait_for(to_thread_if_sync(fn, **call.arguments), self.timeout)
        except asyncio.TimeoutError:
            self.timeouts += 1
            if stats is not None:
                stats["tool_timeouts"] = stats.get("tool_timeouts", 0) + 1
            return f"Error: {call.name} did not finish within {self.timeout:g} s"
        except Exception as exc:  # noqa: BLE001 - the model sees the error and may retry
            return f"Error: {call.name} raised {type(exc).__name__}: {str(exc)[:500]}"
        text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
        if len(text) > MAX_TOOL_REPLY_CHARS:
            text = text[:MAX_TOOL_REPLY_CHARS] + f"… [cut: {len(text)} characters]"
        return text

    async def run(self, text: str, stats: dict[str, int] | None = None, *,
                  calls: list[ToolCall] | None = None) -> list[dict[str, Any]]:
        """Tool messages (role ``tool``) answering every call in ``text`` (the first ``max_calls``), in
        order; ``calls``: the calls already parsed from it."""
        out = []
        for call in (self.parse(text) if calls is None else calls)[: self.max_calls]:
            out.append({"role": "tool", "name": call.name, "content": await self.call(call, stats)})
        return out

    #: At most this many calls of one completion run (a completion of 10 000 calls is an attack).
    max_calls = 32


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


#: The calculator's bounds: longest expression (characters) and largest integer (bits) it makes.
MAX_EXPRESSION_CHARS = 1000
MAX_INT_BITS = 4096


def _check_size(value: Any) -> Any:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ValueError(f"result too large (over {MAX_INT_BITS} bits)")
    return value


def _bounded_op(op: ast.operator, left: Any, right: Any) -> Any:
    """Refuse, before computing, any integer product or power whose result would pass the bound:
    ``(((9**99)**99)**99)**99`` is rejected in microseconds instead of computed for hours."""
    if isinstance(left, int) and isinstance(right, int):
        if isinstance(op, ast.Pow) and right > 0 and abs(left) > 1:
            if (abs(left).bit_length() - 1) * right > MAX_INT_BITS:
                raise ValueError(f"result too large (over {MAX_INT_BITS} bits)")
        elif isinstance(op, ast.Mult) and left.bit_length() + right.bit_length() > MAX_INT_BITS + 1:
            raise ValueError(f"result too large (over {MAX_INT_BITS} bits)")
        elif isinstance(op, ast.Pow) and right < -MAX_INT_BITS and abs(left) > 1:
            return 0.0  # underflows to zero; int ** huge negative would still compute left ** |right|
    if isinstance(op, ast.Pow) and isinstance(right, int) and abs(right) > MAX_INT_BITS:
        right = float(right)  # float/complex power: constant time (overflow raises at once)
    return _check_size(_OPS[type(op)](left, right))


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (+ - * / // % ** and parentheses)."""
    text = str(expression)
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression too long ({len(text)} characters; at most {MAX_EXPRESSION_CHARS})")

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return _check_size(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _bounded_op(node.op, ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError(f"unsupported expression element {type(node).__name__}")

    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, MemoryError, RecursionError) as exc:
        raise ValueError(f"not an arithmetic expression: {str(exc)[:100]}") from None
    value = ev(tree)
    return str(int(value) if isinstance(value, float) and value.is_integer() else value)


def warn_if_tools_not_rendered(tokenizer: Any, tools: list[dict[str, Any]] | None) -> bool:
    """Warn (once per tokenizer) when its chat template ignores ``tools``: the prompt then never
    tells the model which tools exist or how to call them (SmolLM2's template, Llama 2's, …).
    Returns whether the template ignores them."""
    if not tools:
        return False
    try:
        if tokenizer in _TOOLS_CHECKED:
            return _TOOLS_CHECKED[tokenizer]
    except TypeError:  # not weak-referenceable: check every time
        pass
    probe = [{"role": "user", "content": "x"}]
    try:
        ignored = render(tokenizer, probe, tools=tools) == render(tokenizer, probe)
    except ChatTemplateError:
        return False
    try:
        _TOOLS_CHECKED[tokenizer] = ignored
    except TypeError:
        pass
    if ignored:
        names = ", ".join(str((t.get("function") or t).get("name", "?")) for t in tools if isinstance(t, dict))
        warnings.warn(f"the chat template of {getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__} does not "
                      f"render tool schemas: the model is never shown the tools ({names}) or how to call them; describe "
                      "them in a system message or use a template that renders `tools`", UserWarning, stacklevel=2)
    return ignored


_TOOLS_CHECKED: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


def tool_call_message(calls: list[ToolCall]) -> dict[str, Any] | None:
    """The assistant message (OpenAI shape: ``tool_calls``) making the well-formed ``calls``; None
    when there are none. How a template renders tool calls from a message's fields."""
    good = [c for c in calls if c.error is None]
    if not good:
        return None
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in good]}


def parse_reply_calls(parser: Any, tokenizer: Any, trajectory: Trajectory, text: str,
                      tools: list[dict[str, Any]] | None) -> list[ToolCall]:
    """The tool calls ``parser`` finds in ``text``, an assistant message of ``trajectory`` rendered
    with ``tools`` (a parser that reads the prompt gets the conversation before that message, as the
    template renders it with its generation prompt)."""
    prompt = None
    if getattr(parser, "wants_prompt", False):
        msgs = list(trajectory.messages)
        if msgs and msgs[-1].get("role") == "assistant":
            msgs = msgs[:-1]
        try:
            prompt = render(tokenizer, msgs, add_generation_prompt=True, tools=tools)
        except ChatTemplateError:
            prompt = ""
    return run_parser(parser, text, tools=tools, prompt=prompt)


class ToolScheduler(MultiTurnScheduler):
    """Runs the model's tool calls and feeds back the results until it stops calling tools.

    Options: ``tools`` (a :class:`ToolManager`, a dict name → function, or a list of functions;
    default: a safe ``calculator``), ``tool_timeout`` (seconds per call, default 5; see
    :class:`ToolManager`), ``tool_parser`` (a registered ``tool_parser`` name, default ``auto``: the
    format of the chat template's model family, see :mod:`rlcore.rollout.tool_parsers`),
    ``max_turns`` (4). The tool schemas are rendered into the prompt by the chat template. Stats in
    ``infos``: ``tool_calls``, ``tool_errors``, ``tool_timeouts``.
    """

    name = "tool_scheduler"

    def __init__(self, sampler: Any = None, *, tools: Any = None, tool_timeout: float | None = DEFAULT_TIMEOUT,
                 tool_parser: str = "auto", **kwargs: Any) -> None:
        if isinstance(tools, ToolManager):
            manager = tools
        else:
            manager = ToolManager(tools if tools is not None else [calculator], timeout=tool_timeout)
        super().__init__(sampler, tools=manager.schemas, **kwargs)
        self.tool_manager = manager
        self.tool_parser_name = check_tool_parser_name(tool_parser) if isinstance(tool_parser, str) or tool_parser is None \
            else tool_parser
        self._parser: Any = None
        if self.tokenizer is not None or getattr(sampler, "tokenizer", None) is not None:
            self.tool_parser  # noqa: B018 - resolve it now: a parser that cannot serve this tokenizer is one line here

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The JSON schemas of the tool manager's tools (what the chat template renders)."""
        return self.tool_manager.schemas

    @property
    def tool_parser(self) -> Any:
        """The parser that finds the model's calls (``auto`` resolved for the tokenizer on first use)."""
        if self._parser is None:
            self._parser = make_tool_parser(self.tool_parser_name or "auto", self._require_tokenizer())
        return self._parser

    def parse_calls(self, trajectory: Trajectory, text: str) -> list[ToolCall]:
        """The tool calls in ``text``, an assistant message of ``trajectory``, as the run's parser finds them."""
        return parse_reply_calls(self.tool_parser, self._require_tokenizer(), trajectory, text, self.tools_for(trajectory))

    def reply_reader(self, trajectory: Trajectory) -> Any:
        """A reply with calls, as the tool-call message a template renders from ``tool_calls``
        (the stream keeps it in that form only where the conversation then appends exactly)."""
        return lambda text: tool_call_message(self.parse_calls(trajectory, text))

    def on_trajectory_start(self, trajectories: list[Trajectory]) -> None:
        tok = self._require_tokenizer()
        for t in trajectories:
            if t.status == "running" and t.messages:
                t.prompt_ids = encode_prompt(tok, t.messages, tools=self.template_tools)
        warn_if_tools_not_rendered(tok, self.template_tools)
        self.tool_parser  # noqa: B018 - resolve it now: a parser that cannot serve this tokenizer says so before any turn

    def check_finished(self, trajectory: Trajectory, choice: ResponseChoice, turn: int) -> bool:
        if super().check_finished(trajectory, choice, turn):
            return True
        return not self.parse_calls(trajectory, choice.message.content)

    def manager_for(self, trajectory: Trajectory) -> ToolManager:
        """The tools ``trajectory``'s calls run against (one manager for all; a subclass may give
        each trajectory its own, e.g. the methods of its environment)."""
        return self.tool_manager

    async def step(self, trajectory: Trajectory, choice: ResponseChoice, turn: int) -> dict[str, Any]:
        stats: dict[str, int] = {}
        text = choice.message.content
        replies = await self.manager_for(trajectory).run(text, stats, calls=self.parse_calls(trajectory, text))
        trajectory.messages.extend(replies)
        infos = trajectory.infos
        infos["tool_timeouts"] = int(infos.get("tool_timeouts", 0)) + stats.get("tool_timeouts", 0)
        infos["tool_calls"] = int(infos.get("tool_calls", 0)) + len(replies)
        infos["tool_errors"] = int(infos.get("tool_errors", 0)) + sum(1 for r in replies if str(r["content"]).startswith("Error:"))
        return {"infer_request": trajectory}
