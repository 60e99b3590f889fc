"""TRL 1.16's agent arguments of ``GRPOTrainer`` mapped onto rlcore's tool scheduler.

* ``tools=[fn, …]`` → :class:`rlcore.rollout.tools.ToolScheduler` with those functions; TRL's
  ``max_tool_calling_iterations`` bounds the tool rounds (``max_turns`` = rounds + 1; TRL's
  unbounded default becomes rlcore's hard turn cap).
* ``environment_factory=Env`` → one ``Env()`` per trajectory: ``reset(**row)`` may return text that
  is appended to the last prompt message (TRL's rule), the instance's public methods are its tools,
  a ``get_reward()`` method becomes a reward named after the class, and TRL-style rewards get the
  instances as ``environments``.
* ``rollout_func`` is refused with what to write instead: it hands back token ids from an engine
  rlcore does not drive, so the trainer could not hold its token-exactness rule for them.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import attrs

from ..errors import ConfigError
from ..rollout.scheduler import MAX_TURNS_HARD_CAP
from ..rollout.tools import ToolManager, ToolScheduler
from ..chat_template import encode_prompt
from ..types import Trajectory


def env_methods(instance: Any) -> list[Callable[..., Any]]:
    """The tools of an environment instance: public methods other than reset/get_reward (TRL's rule)."""
    return [getattr(instance, n) for n, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
            if n not in ("reset", "get_reward") and not n.startswith("_")]


@attrs.define
class AgentOptions:
    tools: list[Callable[..., Any]] = attrs.field(factory=list)
    environment_factory: Callable[[], Any] | None = None

    @property
    def active(self) -> bool:
        return bool(self.tools) or self.environment_factory is not None

    def scheduler(self, args: Any, sampler: Any, tokenizer: Any) -> Any:
        from .components import sampling_params

        rounds = args.max_tool_calling_iterations
        max_turns = MAX_TURNS_HARD_CAP if rounds is None else int(rounds) + 1
        cls = EnvironmentToolScheduler if self.environment_factory is not None else TRLToolScheduler
        kwargs: dict[str, Any] = {}
        if self.environment_factory is not None:
            kwargs["environment_factory"] = self.environment_factory
        return cls(sampler, tools=list(self.tools), tokenizer=tokenizer, max_turns=max_turns,
                   sampling_params=sampling_params(args), **kwargs)


def trl_agent_options(args: Any, tools: Any, environment_factory: Any, rollout_func: Any, scheduler: Any) -> AgentOptions:
    """Check TRL's agent arguments before the model loads."""
    if rollout_func is not None:
        raise ConfigError("rollout_func is not supported: write a scheduler (subclass rlcore.rollout.RolloutScheduler "
                          "and override run; see docs/porting-ms-swift.md) and pass it as scheduler=")
    if isinstance(environment_factory, dict):
        raise ConfigError("a dict of environment_factory (several environments) is not supported; pass one factory, "
                          "or an rlcore env scheduler")
    if (tools or environment_factory is not None) and (scheduler is not None or args.scheduler != "default"):
        raise ConfigError("tools/environment_factory choose rlcore's tool scheduler; do not also set scheduler")
    if tools is not None and not isinstance(tools, (list, tuple)):
        raise ConfigError(f"tools must be a list of functions, got {type(tools).__name__}")
    for t in tools or []:
        if not callable(t):
            raise ConfigError(f"tool {t!r} is not callable; tools are Python functions")
    if environment_factory is not None and not callable(environment_factory):
        raise ConfigError("environment_factory must be a callable returning an environment (a class works)")
    return AgentOptions(list(tools or []), environment_factory)


class TRLToolScheduler(ToolScheduler):
    """rlcore's tool loop with the tool counters set from the start, so TRL's ``tools/*``
    metrics are logged also when no tool was called."""

    name = "trl_tools"

    def on_trajectory_start(self, trajectories: list[Trajectory]) -> None:
        for t in trajectories:
            t.infos.setdefault("tool_calls", 0)
            t.infos.setdefault("tool_errors", 0)
        super().on_trajectory_start(trajectories)


class EnvironmentToolScheduler(TRLToolScheduler):
    """TRL's ``environment_factory`` semantics on rlcore's tool loop (see the module docstring)."""

    name = "trl_environment"

    def __init__(self, sampler: Any = None, *, environment_factory: Callable[[], Any], tools: Any = None, **kwargs: Any) -> None:
        probe = environment_factory()
        if not callable(getattr(probe, "reset", None)):
            raise ConfigError("the environment from environment_factory must define reset()")
        self.environment_factory = environment_factory
        self.environment_type = type(probe)
        self._pool: list[Any] = [probe]
        self.environments: dict[str, Any] = {}
        self._standalone = list(tools or [])
        super().__init__(sampler, tools=ToolManager(self._standalone + env_methods(probe)), **kwargs)

    def environment_for(self, trajectory: Trajectory) -> Any:
        return self.environments.get(trajectory.uuid)

    def on_trajectory_start(self, trajectories: list[Trajectory]) -> None:
        for t in trajectories:
            t.infos.setdefault("tool_calls", 0)
            t.infos.setdefault("tool_errors", 0)
        self.environments = {}
        tok = self._require_tokenizer()
        for i, t in enumerate(trajectories):
            while len(self._pool) <= i:
                self._pool.append(self.environment_factory())
            env = self._pool[i]
            self.environments[t.uuid] = env
            observation = env.reset(**dict(t.data))
            if observation is not None and t.messages:
                last = t.messages[-1]
                t.messages[-1] = {**last, "content": str(last.get("content") or "") + str(observation)}
            if t.status == "running" and t.messages:
                t.prompt_ids = encode_prompt(tok, t.messages, tools=self.tools)

    async def step(self, infer_request: Trajectory, response_choice: Any, current_turn: int) -> dict[str, Any]:
        env = self.environment_for(infer_request)
        manager = ToolManager(self._standalone + env_methods(env)) if env is not None else self.tool_manager
        replies = await manager.run(response_choice.message.content)
        infer_request.messages.extend(replies)
        infos = infer_request.infos
        infos["tool_calls"] = int(infos.get("tool_calls", 0)) + len(replies)
        infos["tool_errors"] = int(infos.get("tool_errors", 0)) + sum(1 for r in replies if str(r["content"]).startswith("Error:"))
        return {"infer_request": infer_request}
