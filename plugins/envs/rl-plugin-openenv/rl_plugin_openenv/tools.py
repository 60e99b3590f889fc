"""The EnvTool path: an OpenEnv environment driven through tool calls instead of free-text actions.

The model sees the environment's actions as tools (rendered by the chat template) and calls them
in its family's format (``tool_parser``, default ``auto``: e.g. ``<tool_call>{"name": …, "arguments":
{…}}</tool_call>``, or Qwen3.5's ``<function=…><parameter=…>`` XML). Which tools:

* an MCP environment (its action schema is OpenEnv's ``CallToolAction``/``ListToolsAction``): every
  MCP tool the server lists, called as ``{"type": "call_tool", "tool_name": …, "arguments": …}``;
* any other environment: one tool whose parameters are the action's fields (from ``GET /schema``),
  named after the action class (``GuessAction`` → ``guess``) unless ``tool_name`` says otherwise.

Each trajectory gets an :class:`rlcore.rollout.EnvTool` over its own session, registered into its
own :class:`rlcore.rollout.ToolManager`: rewards and ``done`` are EnvTool's bookkeeping. A rejected
action (validation error) is the tool's answer (``Error: …``) so the model can correct itself;
a lost session fails the trajectory.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import attrs
from rlcore.errors import EnvError
from rlcore.rollout import EnvTool, ToolManager, make_tool_parser
from rlcore.rollout.tools import tool_call_message
from rlcore.rollout.tool_parsers import check_tool_parser_name
from rlcore.types import Completion, Trajectory

from .client import ActionRejected, OpenEnvSession
from .env import OpenEnvEnv
from .limiter import MAX_SCHEMA_BYTES, get_json_capped, http_url
from .scheduler import OpenEnvScheduler

MCP_ACTIONS = ("CallToolAction", "ListToolsAction")


@attrs.define
class ToolSpec:
    """One tool shown to the model and how a call becomes an OpenEnv action."""

    name: str
    description: str
    parameters: dict[str, Any]
    mcp: bool = False

    @property
    def schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}

    def action(self, arguments: dict[str, Any]) -> dict[str, Any]:
        if self.mcp:
            return {"type": "call_tool", "tool_name": self.name, "arguments": dict(arguments)}
        return dict(arguments)


async def discover_tools(base_url: str, *, tool_name: str | None = None, timeout: float = 10.0) -> list[ToolSpec]:
    """The tools of the server at ``base_url`` (see the module docstring)."""
    import httpx

    try:
        async with httpx.AsyncClient(timeout=timeout) as client:
            status, body = await get_json_capped(client, http_url(base_url) + "/schema", MAX_SCHEMA_BYTES)
        if status != 200:
            raise ValueError(f"HTTP {status}")
        action = body["action"]
    except (httpx.HTTPError, KeyError, ValueError, TypeError) as exc:
        raise EnvError(f"cannot read the action schema of OpenEnv server {base_url} (GET /schema): {exc}") from None
    props = dict(action.get("properties") or {})
    if action.get("title") in MCP_ACTIONS or "tool_name" in props:
        return await _mcp_tools(base_url)
    props.pop("metadata", None)
    title = str(action.get("title") or "")
    name = tool_name or (_snake(title[: -len("Action")]) if title.endswith("Action") and title != "Action" else "step")
    params = {"type": "object", "properties": props, "required": [r for r in action.get("required", []) if r in props]}
    doc = str(action.get("description") or f"take an action in the environment ({title or 'action'})")
    return [ToolSpec(name, doc, params)]


async def _mcp_tools(base_url: str) -> list[ToolSpec]:
    session = OpenEnvSession(base_url)
    try:
        await session.reset()
        listed = await session.step({"type": "list_tools"})
    finally:
        await session.close()
    tools = listed.observation.get("tools") or []
    return [
        ToolSpec(t["name"], str(t.get("description") or ""), dict(t.get("input_schema") or {"type": "object", "properties": {}}), mcp=True)
        for t in tools
    ]


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower() or "step"


class _SessionAsEnv:
    """What :class:`EnvTool` steps: an OpenEnv session whose observations come back as text."""

    def __init__(self, env: OpenEnvEnv, scheduler: "OpenEnvToolScheduler") -> None:
        self.env = env
        self.scheduler = scheduler
        self.fatal: str | None = None

    async def step(self, action: Any) -> tuple[str, float, bool, dict[str, Any]]:
        try:
            observation, reward, done, info = await self.scheduler._env_call("step", self.env.step, action)
        except ActionRejected:
            raise  # ToolManager turns it into "Error: …", the model's to fix
        except Exception as exc:  # noqa: BLE001 - the session is gone: the trajectory fails after this turn
            self.fatal = self.scheduler.failure_reason("step", exc)
            raise
        return self.scheduler.format_observation(observation), reward, done, info


class OpenEnvToolScheduler(OpenEnvScheduler):
    """``openenv_tool_scheduler``: OpenEnv actions as tool calls (one session per trajectory).

    Options: those of ``openenv_scheduler`` plus ``tool_name`` (the single tool's name for non-MCP
    environments) and ``tool_parser`` (how the model's calls are found; default ``auto``, the chat
    template's family format). The episode ends when the environment says done, when the model replies
    without a tool call, or at ``max_turns``. Tools are discovered once, from the first
    trajectory's server: one scheduler drives one kind of environment.
    """

    name = "openenv_tool_scheduler"

    def __init__(self, sampler: Any = None, *, tool_name: str | None = None, tool_parser: str = "auto", **kwargs: Any) -> None:
        super().__init__(sampler, **kwargs)
        self.tool_name = tool_name
        self.tool_parser_name = check_tool_parser_name(tool_parser)
        self._parser: Any = None
        self.specs: list[ToolSpec] | None = None
        self._discover_lock: asyncio.Lock | None = None
        self._tools_by_traj: dict[str, tuple[EnvTool, ToolManager, _SessionAsEnv]] = {}
        self._pending_tools: dict[str, list[dict[str, Any]]] = {}

    async def ensure_tools(self, base_url: str) -> list[ToolSpec]:
        """Discover the tools once and render them into every prompt (``self.tools``)."""
        if self.specs is None:
            if self._discover_lock is None:
                self._discover_lock = asyncio.Lock()
            async with self._discover_lock:
                if self.specs is None:
                    specs = await discover_tools(base_url, tool_name=self.tool_name)
                    self.tools = [s.schema for s in specs]
                    self.specs = specs
        return self.specs

    async def make_env(self, trajectory: Trajectory) -> OpenEnvEnv:
        env = await super().make_env(trajectory)
        specs = await self.ensure_tools(env.session.base_url)
        adapter = _SessionAsEnv(env, self)
        env_tool = EnvTool(adapter)
        if self._parser is None:
            self._parser = make_tool_parser(self.tool_parser_name, self._require_tokenizer())
        manager = ToolManager(timeout=None, parser=self._parser)  # env steps are bounded by env_timeout (_env_call) already
        for spec in specs:
            manager.register(_tool_fn(env_tool, spec), name=spec.name, schema=spec.schema)
        self._tools_by_traj[trajectory.uuid] = (env_tool, manager, adapter)
        return env

    async def on_turn_end(self, infer_request: Trajectory, response_choice: Completion, current_turn: int) -> dict[str, Any] | None:
        entry = self._tools_by_traj.get(infer_request.uuid)
        if entry is None:
            infer_request.fail("no environment for this trajectory (reset did not run)")
            return {"done": True}
        env_tool, manager, adapter = entry
        text = response_choice.message.content
        if not manager.parse(text):
            return {"done": True, "infos": {"env_steps": current_turn}}  # answered without a tool: episode over
        before = len(env_tool.rewards)
        replies = await manager.run(text)
        if adapter.fatal:
            infer_request.fail(adapter.fatal)
            return {"done": True}
        infos = infer_request.infos
        infos["tool_calls"] = int(infos.get("tool_calls", 0)) + len(replies)
        infos["tool_errors"] = int(infos.get("tool_errors", 0)) + sum(str(r["content"]).startswith("Error:") for r in replies)
        self._pending_tools[infer_request.uuid] = replies
        return {"done": env_tool.done, "reward": float(sum(env_tool.rewards[before:])), "infos": {"env_steps": current_turn}}

    def reply_reader(self, trajectory: Trajectory) -> Any:
        """A reply with calls as the tool-call message (see ``RolloutScheduler.reply_reader``)."""
        def read(text: str) -> dict[str, Any] | None:
            entry = self._tools_by_traj.get(trajectory.uuid)
            return tool_call_message(entry[1].parse(text)) if entry is not None else None

        return read

    def step(self, infer_request: Trajectory, response_choice: Completion, current_turn: int) -> dict[str, Any]:
        infer_request.messages.extend(self._pending_tools.pop(infer_request.uuid, []))
        return {"infer_request": infer_request}

    async def on_trajectory_end(self, trajectory: Trajectory) -> None:
        self._tools_by_traj.pop(trajectory.uuid, None)
        self._pending_tools.pop(trajectory.uuid, None)
        await super().on_trajectory_end(trajectory)


def _tool_fn(env_tool: EnvTool, spec: ToolSpec) -> Any:
    async def call(**arguments: Any) -> str:
        return await env_tool.act(spec.action(arguments))  # type: ignore[arg-type] - EnvTool passes it through

    call.__name__ = spec.name
    return call
