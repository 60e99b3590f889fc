"""TRL 1.16's agent arguments of ``GRPOTrainer`` mapped onto rlcore's tool scheduler.

* ``tools=[fn, …]`` → :class:`rlcore.rollout.tools.ToolScheduler` with those functions; TRL's
  ``max_tool_calling_iterations`` bounds the tool rounds (``max_turns`` = rounds + 1; TRL's
  unbounded default becomes rlcore's hard turn cap).
* ``environment_factory=Env`` → one ``Env()`` per trajectory: ``reset(**row)`` may return text that
  is appended to the last prompt message (TRL's rule), the instance's public methods are its tools,
  a ``get_reward()`` method (sync or async) becomes a reward named after the class, and TRL-style
  rewards get the instances as ``environments``. A dict ``{name: factory}`` routes each row by its
  ``environment`` column, each prompt rendering its own environment's tools. With no
  ``train_dataset``, ``reset()`` writes the prompt and ``max_steps`` sets the length.
* ``rollout_func=fn`` → :class:`RolloutFuncScheduler`: ``fn(prompts, trainer)`` is called once per
  generation batch with the raw prompts (one per trajectory, ``num_generations`` consecutive copies
  of each, as TRL passes them) and returns ``prompt_ids``, ``completion_ids`` and ``logprobs``
  (optionally ``logprob_token_ids`` and ``env_mask``; every other key is a column the rewards get).
  Those token ids *are* what trains: the trainer scores exactly them. The conversation the rewards
  see is decoded from them, so the rendering checks of the invariants do not apply; the token-level
  ones do, and a completion whose logprobs or mask do not line up with its tokens fails with a reason.

The three schedulers are registered by name (``trl_tools``, ``trl_environment``, ``trl_rollout_func``
in :mod:`rlcore.builtin_components`); ``GRPOTrainer`` checks TRL's arguments and builds the chosen
one through the registry (:class:`rlcore.trainer.construction.TRLAgent`).
"""

from __future__ import annotations

import copy
import inspect
import math
from typing import Any, Callable

from ...errors import ConfigError
from ...rollout.scheduler import RolloutScheduler
from ...rollout.tools import ToolManager, ToolScheduler
from ...chat_template import encode_prompt
from ...types import Trajectory, Turn


def env_methods(instance: Any) -> list[Callable[..., Any]]:
    """The tools of an environment instance: public methods other than reset/get_reward (TRL's rule)."""
    return [getattr(instance, n) for n, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
            if n not in ("reset", "get_reward") and not n.startswith("_")]


class TRLToolScheduler(ToolScheduler):
    """rlcore's tool loop with the tool counters set from the start, so TRL's ``tools/*``
    metrics are logged also when no tool was called."""

    name = "trl_tools"

    @staticmethod
    def count_from_zero(trajectories: list[Trajectory]) -> None:
        for t in trajectories:
            t.infos.setdefault("tool_calls", 0)
            t.infos.setdefault("tool_errors", 0)

    def on_trajectory_start(self, trajectories: list[Trajectory]) -> None:
        self.count_from_zero(trajectories)
        super().on_trajectory_start(trajectories)


class EnvironmentToolScheduler(TRLToolScheduler):
    """TRL's ``environment_factory`` semantics on rlcore's tool loop (see the module docstring).

    A dict ``{name: factory}`` is TRL's multi-environment form: each row's ``environment`` column
    names its factory, the row's other columns go to ``reset``, and each trajectory's prompt
    renders the tools of its own environment (``infos["template_tools"]``)."""

    name = "trl_environment"

    def __init__(self, sampler: Any = None, *, environment_factory: Any, tools: Any = None, **kwargs: Any) -> None:
        self.multi = isinstance(environment_factory, dict)
        self.factories: dict[Any, Callable[[], Any]] = dict(environment_factory) if self.multi else {None: environment_factory}
        self._standalone = list(tools or [])
        self._pools: dict[Any, list[Any]] = {}
        self._schemas: dict[Any, list[dict[str, Any]]] = {}
        union: dict[str, Callable[..., Any]] = {getattr(t, "__name__", repr(t)): t for t in self._standalone}
        self.environment_types: list[type] = []
        for name, factory in self.factories.items():
            if not callable(factory):
                raise ConfigError(f"environment_factory[{name!r}] is not callable; give a class or a function returning an environment")
            probe = factory()
            if not callable(getattr(probe, "reset", None)):
                label = "the environment from environment_factory" + (f"[{name!r}]" if self.multi else "")
                raise ConfigError(f"{label} must define reset()")
            self._pools[name] = [probe]
            methods = env_methods(probe)
            self._schemas[name] = ToolManager(self._standalone + methods).schemas
            for m in methods:
                union.setdefault(m.__name__, m)
            if type(probe) not in self.environment_types:
                self.environment_types.append(type(probe))
        self.environment_factory = environment_factory
        self.environments: dict[str, Any] = {}
        super().__init__(sampler, tools=ToolManager(list(union.values())), **kwargs)

    def environment_for(self, trajectory: Trajectory) -> Any:
        return self.environments.get(trajectory.uuid)

    def on_trajectory_start(self, trajectories: list[Trajectory]) -> None:
        self.count_from_zero(trajectories)
        self.environments = {}
        tok = self._require_tokenizer()
        handed: dict[Any, int] = {}
        for t in trajectories:
            name = t.data.get("environment") if self.multi else None
            if name not in self.factories:
                t.fail(f"row's environment {name!r} is not among environment_factory's ({', '.join(map(repr, self.factories))}); "
                       "fix the dataset's environment column")
                continue
            pool, i = self._pools[name], handed.get(name, 0)
            handed[name] = i + 1
            if i == len(pool):
                pool.append(self.factories[name]())
            env = pool[i]
            self.environments[t.uuid] = env
            row = {k: v for k, v in t.data.items() if k != "environment"} if self.multi else dict(t.data)
            observation = env.reset(**row)
            if observation is not None and t.messages:
                last = t.messages[-1]
                t.messages[-1] = {**last, "content": str(last.get("content") or "") + str(observation)}
            if self.multi:
                t.infos["template_tools"] = self._schemas[name]
            if t.status == "running" and t.messages:
                t.prompt_ids = encode_prompt(tok, t.messages, tools=self.tools_for(t))

    def manager_for(self, trajectory: Trajectory) -> ToolManager:
        """The trajectory's own environment's methods (and the standalone tools)."""
        env = self.environment_for(trajectory)
        return ToolManager(self._standalone + env_methods(env)) if env is not None else self.tool_manager

    # what GRPOTrainer asks before the model loads (it reaches this class by its registered name)
    @staticmethod
    def reward_types(environment_factory: Any) -> list[type]:
        """The environment classes that own a reward: :func:`environment_reward_types`."""
        return environment_reward_types(environment_factory)

    @staticmethod
    def placeholder_rows(args: Any, environment_factory: Any) -> list[dict[str, Any]]:
        """The rows that stand in for a missing ``train_dataset``: :func:`placeholder_rows`."""
        return placeholder_rows(args, environment_factory)

    def environment_rewards(self) -> list[Any]:
        """This scheduler's environments' rewards: :func:`environment_rewards`."""
        return environment_rewards(self)


def placeholder_rows(args: Any, environment_factory: Any) -> list[dict[str, Any]]:
    """TRL: with no ``train_dataset`` the environment's ``reset()`` writes the prompt; one generation
    batch of empty user prompts drives the loop and ``max_steps`` sets its length."""
    if isinstance(environment_factory, dict):
        raise ConfigError("a dict environment_factory needs a train_dataset with an environment column naming each "
                          "row's environment; pass train_dataset=")
    if not args.max_steps or args.max_steps <= 0:
        raise ConfigError("without a train_dataset (the environment writes the prompt in reset()), set max_steps "
                          "to say how long to train")
    n = max(1, int(args.prompts_per_generation))
    return [{"prompt": [{"role": "user", "content": ""}]} for _ in range(n)]


def environment_reward_types(environment_factory: Any) -> list[type]:
    """The environment classes (of one factory or a dict of them) that own a reward (``get_reward``),
    known before the model loads: a class is read, a factory function is called once."""
    if environment_factory is None:
        return []
    factories = environment_factory.values() if isinstance(environment_factory, dict) else [environment_factory]
    out: list[type] = []
    for factory in factories:
        kind = factory if inspect.isclass(factory) else (type(factory()) if callable(factory) else None)
        if kind is not None and _owns_reward(kind) and kind not in out:
            out.append(kind)
    return out


def _owns_reward(env_type: type) -> bool:
    return callable(getattr(env_type, "get_reward", None))


def environment_rewards(scheduler: Any) -> list[Any]:
    """TRL: each environment class with a ``get_reward()`` is one more reward, named after the class
    (weight 1), scoring only the trajectories whose environment is exactly that class."""
    from ...rewards import as_reward

    out = []
    for env_type in filter(_owns_reward, getattr(scheduler, "environment_types", None) or []):
        if inspect.iscoroutinefunction(env_type.get_reward):
            async def env_reward(environments: list[Any], _t: type = env_type, **_: Any) -> list[Any]:
                return [await _t.get_reward(e) if type(e) is _t else None for e in environments]
        else:
            def env_reward(environments: list[Any], _t: type = env_type, **_: Any) -> list[Any]:  # type: ignore[misc]
                return [_t.get_reward(e) if type(e) is _t else None for e in environments]
        out.append(as_reward(env_type.__name__, env_reward))
    return out


#: what TRL requires of a rollout_func's output
ROLLOUT_FUNC_KEYS = ("prompt_ids", "completion_ids", "logprobs")
#: the keys with one token-aligned entry per completion; every other key is a reward column
_PER_COMPLETION_KEYS = (*ROLLOUT_FUNC_KEYS, "env_mask", "logprob_token_ids")


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
        for key in _PER_COMPLETION_KEYS:
            value = out.get(key)
            if value is not None and (not isinstance(value, (list, tuple)) or len(value) != n):
                got = len(value) if isinstance(value, (list, tuple)) else type(value).__name__
                raise ConfigError(f"{who} returned {got} {key} for {n} prompts; return one per prompt it was given "
                                  "(the prompts already hold num_generations copies of each)")
        for i, t in enumerate(trajectories):
            self._outputs[t.uuid] = {k: (v[i] if isinstance(v, (list, tuple)) and len(v) == n else v)
                                     for k, v in out.items()}
            for key, value in out.items():  # TRL: every other key reaches the rewards as a column
                if key not in _PER_COMPLETION_KEYS:
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
    for lp in logprobs or []:
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
