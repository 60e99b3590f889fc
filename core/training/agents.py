"""TRL 1.16's agent arguments of ``GRPOTrainer`` mapped onto rlcore's tool scheduler.

* ``tools=[fn, …]`` → :class:`rlcore.rollout.tools.ToolScheduler` with those functions; TRL's
  ``max_tool_calling_iterations`` bounds the tool rounds (``max_turns`` = rounds + 1; TRL's
  unbounded default becomes rlcore's hard turn cap).
* ``environment_factory=Env`` → one ``Env()`` per trajectory: ``reset(**row)`` may return text that
  is appended to the last prompt message (TRL's rule), the instance's public methods are its tools,
  a ``get_reward()`` method becomes a reward named after the class, and TRL-style rewards get the
  instances as ``environments``.
* ``rollout_func=fn`` → :class:`RolloutFuncScheduler`: ``fn(prompts, trainer)`` is called once per
  generation batch with the raw prompts (one per trajectory, ``num_generations`` consecutive copies
  of each, as TRL passes them) and returns ``prompt_ids``, ``completion_ids`` and ``logprobs``
  (optionally ``logprob_token_ids`` and ``env_mask``; every other key is a column the rewards get).
  Those token ids *are* what trains: the trainer scores exactly them. The conversation the rewards
  see is decoded from them, so the rendering checks of the invariants do not apply; the token-level
  ones do, and a completion whose logprobs or mask do not line up with its tokens fails with a reason.
"""

from __future__ import annotations

import copy
import inspect
import math
from typing import Any, Callable

import attrs

from ..errors import ConfigError
from ..rollout.scheduler import MAX_TURNS_HARD_CAP, RolloutScheduler
from ..rollout.tools import ToolManager, ToolScheduler
from ..rollout.tokens import encode_prompt
from ..types import Trajectory, Turn


def env_methods(instance: Any) -> list[Callable[..., Any]]:
    """The tools of an environment instance: public methods other than reset/get_reward (TRL's rule)."""
    return [getattr(instance, n) for n, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
            if n not in ("reset", "get_reward") and not n.startswith("_")]


@attrs.define
class AgentOptions:
    tools: list[Callable[..., Any]] = attrs.field(factory=list)
    environment_factory: Callable[[], Any] | None = None
    rollout_func: Callable[[list[Any], Any], dict[str, Any]] | None = None

    @property
    def active(self) -> bool:
        return bool(self.tools) or self.environment_factory is not None or self.rollout_func is not None

    def scheduler(self, args: Any, sampler: Any, tokenizer: Any, trainer: Any = None) -> Any:
        from .components import sampling_params

        if self.rollout_func is not None:
            return RolloutFuncScheduler(sampler, rollout_func=self.rollout_func, trainer=trainer, tokenizer=tokenizer,
                                        sampling_params=sampling_params(args))
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
        if not callable(rollout_func):
            raise ConfigError(f"rollout_func must be a function (prompts, trainer) -> dict, got {type(rollout_func).__name__}")
        if tools or environment_factory is not None or scheduler is not None or args.scheduler != "default":
            raise ConfigError("rollout_func produces the completions itself; do not also pass tools, "
                              "environment_factory or a scheduler")
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
    return AgentOptions(list(tools or []), environment_factory, rollout_func)


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


#: what TRL requires of a rollout_func's output
ROLLOUT_FUNC_KEYS = ("prompt_ids", "completion_ids", "logprobs")


class RolloutFuncScheduler(RolloutScheduler):
    """TRL's ``rollout_func`` as a scheduler (see the module docstring).

    The function runs once per batch in ``on_trajectory_start``; ``run`` then turns each
    trajectory's slice of the output into turns: runs of ``env_mask`` 1 are sampled (trained, with
    their logprobs), runs of 0 are the environment's tokens (context only). A completion ends by
    ``stop`` when its last token is eos or pad (TRL's truncation rule), else by ``length``."""

    name = "trl_rollout_func"

    def __init__(self, sampler: Any = None, *, rollout_func: Callable[[list[Any], Any], dict[str, Any]],
                 trainer: Any = None, **kwargs: Any) -> None:
        super().__init__(sampler, **kwargs)
        self.rollout_func = rollout_func
        self.trainer = trainer
        self._outputs: dict[str, dict[str, Any]] = {}

    def on_trajectory_start(self, trajectories: list[Trajectory]) -> None:
        self._outputs = {}
        prompts = [copy.deepcopy(t.data["prompt"]) if "prompt" in t.data else [dict(m) for m in t.messages]
                   for t in trajectories]
        out = self.rollout_func(prompts, self.trainer)
        who = f"rollout_func {getattr(self.rollout_func, '__name__', '')}".rstrip()
        if not isinstance(out, dict):
            raise ConfigError(f"{who} returned {type(out).__name__}; return a dict with {', '.join(ROLLOUT_FUNC_KEYS)}")
        missing = [k for k in ROLLOUT_FUNC_KEYS if k not in out]
        if missing:
            raise ConfigError(f"{who} must return keys {missing} in its output dict (TRL's contract)")
        n = len(trajectories)
        for key in (*ROLLOUT_FUNC_KEYS, "env_mask", "logprob_token_ids"):
            value = out.get(key)
            if value is not None and (not isinstance(value, (list, tuple)) or len(value) != n):
                got = len(value) if isinstance(value, (list, tuple)) else type(value).__name__
                raise ConfigError(f"{who} returned {got} {key} for {n} prompts; return one per prompt it was given "
                                  "(the prompts already hold num_generations copies of each)")
        for i, t in enumerate(trajectories):
            self._outputs[t.uuid] = {k: (v[i] if isinstance(v, (list, tuple)) and len(v) == n else v)
                                     for k, v in out.items()}
            for key, value in out.items():  # TRL: every other key reaches the rewards as a column
                if key not in (*ROLLOUT_FUNC_KEYS, "env_mask", "logprob_token_ids"):
                    t.data[key] = value[i] if isinstance(value, list) and i < len(value) else value

    async def run(self, infer_request: Trajectory, request_config: Any = None, **kwargs: Any) -> Trajectory:
        traj = infer_request
        out = self._outputs.pop(traj.uuid, None)
        if out is None:
            traj.fail("rollout_func returned nothing for this trajectory")
            return traj
        tok = self._require_tokenizer()
        ids = [int(x) for x in out["completion_ids"]]
        lps = _sampled_logprobs(out["logprobs"], out.get("logprob_token_ids"), ids)
        mask = [int(m) for m in (out.get("env_mask") or [1] * len(ids))]
        if isinstance(lps, str):
            traj.fail(lps)
            return traj
        if len(lps) != len(ids) or len(mask) != len(ids) or any(m not in (0, 1) for m in mask):
            traj.fail(f"rollout_func returned {len(ids)} completion ids, {len(lps)} logprobs and {len(mask)} env_mask "
                      "values (0/1) for this trajectory; they must be the same length")
            return traj
        traj.prompt_ids = [int(x) for x in out["prompt_ids"]]
        traj.infos["prompt_messages"] = len(traj.messages)
        traj.infos["messages_from_tokens"] = True
        traj.policy_version = int(getattr(self.sampler, "policy_version", 0) or 0)
        stops = {tok.eos_token_id, tok.pad_token_id} - {None}
        finish = "stop" if ids and ids[-1] in stops else "length"
        start = 0
        for end in range(1, len(ids) + 1):
            if end == len(ids) or mask[end] != mask[start]:
                piece = ids[start:end]
                sampled = mask[start] == 1
                traj.turns.append(Turn(
                    token_ids=piece, loss_mask=[mask[start]] * len(piece),
                    logprobs=[(float(lp) if lp is not None else None) if sampled else None for lp in lps[start:end]],
                    role="assistant" if sampled else "observation",
                    text=tok.decode(piece, skip_special_tokens=True),
                    finish_reason=finish if end == len(ids) else None,
                ))
                start = end
        traj.messages.append({"role": "assistant", "content": tok.decode(ids, skip_special_tokens=True)})
        traj.num_turns = sum(1 for turn in traj.turns if turn.role == "assistant")
        traj.status, traj.reason = ("ok", None) if finish == "stop" else ("truncated", "no eos: cut by length")
        return traj


def _sampled_logprobs(logprobs: Any, token_ids: Any, ids: list[int]) -> Any:
    """Per-token logprobs of the sampled tokens. A token's entry may be a float or a top-k list whose
    first entry is the sampled token (TRL's vLLM shape); ``logprob_token_ids``, when given, must name
    the sampled token first — else the logprobs belong to other tokens and the string says so."""
    out: list[float | None] = []
    for j, lp in enumerate(logprobs or []):
        if isinstance(lp, (list, tuple)):
            lp = lp[0] if lp else None
        out.append(None if lp is None or (isinstance(lp, float) and math.isnan(lp)) else float(lp))
    if token_ids is not None:
        for j, (tid, want) in enumerate(zip(token_ids, ids)):
            first = tid[0] if isinstance(tid, (list, tuple)) and tid else tid
            if first is not None and int(first) != want:
                return (f"rollout_func's logprob_token_ids name token {first} at completion position {j}, "
                        f"where completion_ids has {want}: the logprobs belong to other tokens")
    return out
