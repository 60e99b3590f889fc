"""Rewards: plain functions (sync or async) that name what they need, plus the batch scorer.

A reward gets only the arguments its signature names (``**kwargs`` gets everything, which is how
TRL reward functions work unchanged). Available names:

``completions`` (text of the final assistant message of each trajectory), ``completion_messages``
(every message after the prompt), ``completion_texts`` (all sampled text concatenated),
``completion_ids``, ``prompts`` (prompt messages), ``prompt_ids``, ``trajectories``, ``infos``,
``step_rewards``, ``total_reward`` (cumulative environment reward), ``num_turns``,
``trainer_state``, and every dataset column by its name (``answer``, ``solution`` …) as a list.

A reward that raises on a batch is retried one sample at a time; a sample that still raises gets
``None`` (ignored by advantages) and is counted in ``reward_errors/<name>``.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Sequence

from .asyncutil import to_thread_if_sync
from .hookspecs import hookimpl
from .types import Trajectory


def _last_assistant(messages: list[dict[str, Any]]) -> str:
    for m in reversed(messages):
        if m.get("role") == "assistant":
            return str(m.get("content") or "")
    return ""


def reward_inputs(trajectories: Sequence[Trajectory], trainer_state: Any = None) -> dict[str, Any]:
    """Every argument a reward may ask for, as lists aligned with ``trajectories``."""
    prompts = []
    completion_messages = []
    for t in trajectories:
        n_prompt = int(t.infos.get("prompt_messages", 0) or 0) or _prompt_len(t)
        prompts.append(t.messages[:n_prompt])
        completion_messages.append(t.messages[n_prompt:])
    columns: dict[str, list[Any]] = {}
    keys: list[str] = []
    for t in trajectories:
        for k in t.data:
            if k not in columns:
                columns[k] = []
                keys.append(k)
    for k in keys:
        columns[k] = [t.data.get(k) for t in trajectories]
    inputs: dict[str, Any] = dict(columns)
    inputs.update(
        completions=[_last_assistant(t.messages) or "".join(tr.text for tr in t.turns if tr.loss_mask and any(tr.loss_mask)) for t in trajectories],
        completion_messages=completion_messages,
        completion_texts=["".join(tr.text for tr in t.turns) for t in trajectories],
        completion_ids=[t.completion_ids for t in trajectories],
        prompts=prompts,
        prompt_ids=[list(t.prompt_ids) for t in trajectories],
        trajectories=list(trajectories),
        infos=[t.infos for t in trajectories],
        step_rewards=[list(t.step_rewards) for t in trajectories],
        total_reward=[t.total_reward for t in trajectories],
        num_turns=[t.num_turns for t in trajectories],
        trainer_state=trainer_state,
    )
    return inputs


def _prompt_len(t: Trajectory) -> int:
    """Number of leading messages that formed the prompt (everything before the first assistant turn)."""
    for i, m in enumerate(t.messages):
        if m.get("role") == "assistant":
            return i
    return len(t.messages)


class Reward:
    """Base class for rewards with state or options. Subclasses implement :meth:`score` with the
    arguments they need (see the module docstring) and return one value per trajectory."""

    name: str = "reward"

    def score(self, **kwargs: Any) -> list[float | None]:
        raise NotImplementedError

    def __call__(self, **kwargs: Any) -> Any:
        return self.score(**kwargs)

    @hookimpl
    async def compute_reward(self, trajectories: list[Trajectory]) -> dict[str, list[float | None]]:
        values, errors = await score_reward(self.name, self.score, trajectories, getattr(self, "trainer_state", None))
        self.errors = getattr(self, "errors", 0) + errors  # samples that raised, like FunctionReward
        return {self.name: values}


class FunctionReward(Reward):
    """Adapts a plain reward function (the common case) to the ``compute_reward`` hook."""

    def __init__(self, name: str, fn: Callable[..., Any]) -> None:
        self.name = name
        self.fn = fn
        self.errors = 0
        self.trainer_state: Any = None

    def score(self, **kwargs: Any) -> Any:  # pragma: no cover - score_reward calls self.fn directly
        return self.fn(**kwargs)

    @hookimpl
    async def compute_reward(self, trajectories: list[Trajectory]) -> dict[str, list[float | None]]:
        values, errors = await score_reward(self.name, self.fn, trajectories, self.trainer_state)
        self.errors += errors
        return {self.name: values}


def _wanted(fn: Callable[..., Any], inputs: dict[str, Any]) -> dict[str, Any]:
    target = fn
    if not (inspect.isfunction(fn) or inspect.ismethod(fn)) and callable(fn):
        target = fn.__call__  # type: ignore[attr-defined]
    sig = inspect.signature(target)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return dict(inputs)
    out = {}
    for pname, p in sig.parameters.items():
        if p.kind in (inspect.Parameter.VAR_POSITIONAL,):
            continue
        if pname in inputs:
            out[pname] = inputs[pname]
        elif p.default is inspect.Parameter.empty:
            out[pname] = [None] * len(inputs["trajectories"])  # a column this dataset lacks
    return out


def _check(name: str, values: Any, n: int) -> list[float | None]:
    if not isinstance(values, (list, tuple)) and hasattr(values, "tolist"):
        values = values.tolist()
    if isinstance(values, (int, float)) and n == 1:
        values = [values]
    if not isinstance(values, (list, tuple)) or len(values) != n:
        got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
        raise ValueError(f"reward {name!r} returned {got} values for {n} trajectories")
    out: list[float | None] = []
    for v in values:
        if v is None:
            out.append(None)
        else:
            f = float(v)
            out.append(None if math.isnan(f) else f)
    return out


async def score_reward(
    name: str, fn: Callable[..., Any], trajectories: Sequence[Trajectory], trainer_state: Any = None
) -> tuple[list[float | None], int]:
    """Run one reward over a batch, isolating samples that raise. Returns (values, error count)."""
    n = len(trajectories)
    if n == 0:
        return [], 0
    try:
        inputs = reward_inputs(trajectories, trainer_state)
        return _check(name, await to_thread_if_sync(fn, **_wanted(fn, inputs)), n), 0
    except Exception:  # noqa: BLE001 - retry per sample to find the culprit(s)
        if n == 1:
            return [None], 1
    values: list[float | None] = []
    errors = 0
    for t in trajectories:
        v, e = await score_reward(name, fn, [t], trainer_state)
        values.extend(v)
        errors += e
    return values, errors


def as_reward(name: str, obj: Any) -> Reward:
    """Wrap a registered reward factory/object/function into something with a ``compute_reward`` hook."""
    if isinstance(obj, Reward):
        obj.name = getattr(obj, "name", None) or name
        return obj
    if inspect.isclass(obj) and issubclass(obj, Reward):
        inst = obj()
        if not getattr(inst, "name", None) or inst.name == "reward":
            inst.name = name
        return inst
    if callable(obj):
        return FunctionReward(name, obj)
    raise TypeError(f"reward {name!r} is neither a function nor a Reward")


async def compute_rewards(
    hooks: Any,
    trajectories: list[Trajectory],
    weights: dict[str, float] | None = None,
) -> dict[str, list[float | None]]:
    """Call every ``compute_reward`` implementation, store named columns on each trajectory and the
    weighted sum in ``trajectory.reward`` (NaN-skipping; ``None`` when no reward scored it)."""
    results = await hooks.call_all("compute_reward", trajectories=trajectories)
    columns: dict[str, list[float | None]] = {}
    for res in results:
        for name, vals in res.items():
            columns[name] = _check(name, vals, len(trajectories))
    weights = weights or {}
    for i, t in enumerate(trajectories):
        total = 0.0
        scored = False
        for name, vals in columns.items():
            v = vals[i]
            t.rewards[name] = v
            if v is not None:
                total += weights.get(name, 1.0) * v
                scored = True
        t.reward = total if scored else None
    call_observers = getattr(hooks, "call_observers", None)
    if call_observers is not None:  # named observers' columns: logged as extra columns, weight 0
        for res in (await call_observers("compute_reward", trajectories=trajectories)).values():
            if isinstance(res, dict):
                for name, vals in res.items():
                    vals = _check(f"observer/{name}", vals, len(trajectories))
                    columns[f"observer/{name}"] = vals
                    for i, t in enumerate(trajectories):
                        t.rewards[f"observer/{name}"] = vals[i]
    return columns


# --- built-in rewards -------------------------------------------------------------------------------
def env_reward(total_reward: list[float]) -> list[float]:
    """The environment's cumulative reward (sum of step rewards) of each trajectory."""
    return [float(r) for r in total_reward]


def length_penalty(completion_ids: list[list[int]]) -> list[float]:
    """Minus the completion length in thousands of tokens: a gentle push toward brevity."""
    return [-len(ids) / 1000.0 for ids in completion_ids]


@hookimpl
def register_rewards(register: Callable[..., None]) -> None:
    register("env_reward", env_reward)
    register("length_penalty", length_penalty)

