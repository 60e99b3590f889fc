"""Rewards: plain functions (sync or async) that name what they need, plus the batch scorer.

Two calling conventions, told apart by the function's signature, so TRL reward functions run
unchanged and rlcore's own keep working:

* **TRL's** (the function takes ``**kwargs``, as every TRL reward must): it gets exactly what TRL
  1.16's ``GRPOTrainer`` passes (``trl/trainer/grpo_trainer.py`` ``_calculate_rewards``) in TRL's
  shapes: ``prompts`` and ``completions`` as strings for a standard (plain-text ``prompt``) dataset
  and as message lists for a conversational one (``[{"role": "assistant", "content": …}]``),
  ``completion_ids``, every dataset column except ``prompt``, ``trainer_state``, ``log_extra`` and
  ``log_metric``. rlcore's extras (below) come too when the function names them.
* **rlcore's** (no ``**kwargs``): the function gets only the arguments its signature names:
  ``completions`` (text of the final assistant message of each trajectory), ``completion_messages``
  (every message after the prompt), ``completion_texts`` (all sampled text concatenated),
  ``completion_ids``, ``prompts`` (prompt messages), ``prompt_ids``, ``trajectories``, ``infos``,
  ``step_rewards``, ``total_reward`` (cumulative environment reward), ``num_turns``,
  ``trainer_state``, ``step``, ``progress``, ``log_metric``, ``log_extra`` and every dataset
  column by its name.

Rewards that see training progress (curricula, schedules): ``trainer_state`` is the trainer's
``transformers.TrainerState`` (``self.state``, exactly what TRL 1.16 passes, so
``trainer_state.global_step`` is the number of optimizer steps done before this generation);
``step`` is that ``global_step`` as an int and ``progress`` is ``step / max_steps``, clamped to
[0, 1] (0 when the run has no step bound). Outside a trainer (``rlcore rollout``, the loop API
without ``step=``) ``trainer_state`` is ``None`` and ``step``/``progress`` are 0. A dataset column
named ``step`` or ``progress`` wins over these (a reward that read its column keeps reading it).

A reward that raises on a batch is retried one sample at a time; a sample that still raises gets
``None`` (ignored by advantages) and is counted in ``reward_errors/<name>``; so does a sample the
reward scored ±inf (one inf would make every advantage of its group NaN). The trainer stops the
run when a reward raised (or gave inf) on *every* sample of a batch (:class:`RewardFunctionError`, chained to the
first exception so its traceback shows once): training on nothing must not look like training.
A reward that returns other than one value per trajectory is a bug in the reward, not in a sample:
it stops the run at once (:class:`RewardCountError`) instead of being retried per sample.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from typing import Any, Callable, Iterator, Mapping, Sequence

import attrs

from ..asyncutil import to_thread_if_sync
from ..errors import DatasetError, RewardFunctionError  # noqa: F401 - RewardFunctionError: re-exported for reward authors
from ..hookspecs import hookimpl
from ..types import Trajectory

logger = logging.getLogger(__name__)

#: What TRL 1.16 passes every reward function besides the dataset columns.
TRL_REWARD_ARGS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")


@attrs.define
class RewardContext:
    """Run-level values the trainer hands to rewards: ``trainer_state`` and TRL's logging callbacks
    (``log_metric(name, value)`` adds a scalar to the step's metrics, ``log_extra(column, values)``
    a column to the logged completions)."""

    trainer_state: Any = None
    log_metric: Callable[[str, float], None] | None = None
    log_extra: Callable[[str, list[Any]], None] | None = None
    #: TRL's ``environments`` (environment_factory runs): trajectory -> its environment instance
    environment_of: Callable[[Trajectory], Any] | None = None
    #: the global step and the run's step bound when no ``trainer_state`` carries them (the loop API)
    step: int | None = None
    max_steps: int | None = None

    def progress_values(self) -> tuple[int, float]:
        """``(step, progress)`` for rewards: from ``step``/``max_steps`` when given, else from the
        trainer state's ``global_step``/``max_steps``; 0 and 0.0 when neither says."""
        state = self.trainer_state
        step = self.step if self.step is not None else getattr(state, "global_step", 0)
        bound = self.max_steps if self.max_steps is not None else getattr(state, "max_steps", 0)
        step = int(step or 0)
        progress = min(1.0, max(0.0, step / float(bound))) if bound and bound > 0 else 0.0
        return step, progress


def _no_log(*_: Any, **__: Any) -> None:
    """Stand-in logging callback outside a trainer (the rollout CLI, direct calls)."""


def _last_assistant(messages: list[dict[str, Any]]) -> str:
    for m in reversed(messages):
        if m.get("role") == "assistant":
            return str(m.get("content") or "")
    return ""


def _is_conversational_prompt(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(m, dict) and "role" in m for m in value)


class RewardInputs(Mapping[str, Any]):
    """Every argument an rlcore-style reward may ask for, as lists aligned with the trajectories —
    built on first access and kept, so a reward that names two arguments pays for two columns,
    not for all of them (scoring 10k completions is then the reward's own cost, not rlcore's)."""

    _BUILT = ("completions", "completion_messages", "completion_texts", "completion_ids", "prompts", "prompt_ids",
              "trajectories", "infos", "step_rewards", "total_reward", "num_turns", "trainer_state", "step",
              "progress", "log_metric", "log_extra")

    def __init__(self, trajectories: Sequence[Trajectory], trainer_state: Any = None,
                 context: RewardContext | None = None) -> None:
        self.trajectories = list(trajectories)
        self.context = context or RewardContext(trainer_state=trainer_state)
        self.trainer_state = self.context.trainer_state if self.context.trainer_state is not None else trainer_state
        self._cache: dict[str, Any] = {}
        self._data_keys: list[str] | None = None
        self._n_prompt: list[int] | None = None

    def data_keys(self) -> list[str]:
        """The dataset columns, in first-seen order over the trajectories."""
        if self._data_keys is None:
            seen: dict[str, None] = {}
            for t in self.trajectories:
                for k in t.data:
                    seen.setdefault(k, None)
            self._data_keys = list(seen)
        return self._data_keys

    def _names(self) -> list[str]:
        extra = ["environments"] if self.context.environment_of is not None else []
        return [*self._BUILT, *extra, *(k for k in self.data_keys() if k not in self._BUILT and k not in extra)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __contains__(self, key: object) -> bool:
        return key in self._BUILT or (key == "environments" and self.context.environment_of is not None) \
            or key in self.data_keys()

    def __getitem__(self, key: str) -> Any:
        if key in self._cache:
            return self._cache[key]
        if key not in self:
            raise KeyError(key)
        value = self._build(key)
        self._cache[key] = value
        return value

    def _prompt_lens(self) -> list[int]:
        if self._n_prompt is None:
            self._n_prompt = [int(t.infos.get("prompt_messages", 0) or 0) or _prompt_len(t) for t in self.trajectories]
        return self._n_prompt

    def _build(self, key: str) -> Any:
        trajs = self.trajectories
        if key == "prompts":
            return [t.messages[:n] for t, n in zip(trajs, self._prompt_lens())]
        if key == "completion_messages":
            return [[_plain(m) for m in t.messages[n:]] for t, n in zip(trajs, self._prompt_lens())]
        if key == "completions":
            return [_last_assistant(t.messages) or "".join(tr.text for tr in t.turns if tr.loss_mask and any(tr.loss_mask))
                    for t in trajs]
        if key == "completion_texts":
            return ["".join(tr.text for tr in t.turns) for t in trajs]
        if key == "completion_ids":
            return [t.completion_ids for t in trajs]
        if key == "prompt_ids":
            return [list(t.prompt_ids) for t in trajs]
        if key == "trajectories":
            return list(trajs)
        if key == "infos":
            return [t.infos for t in trajs]
        if key == "step_rewards":
            return [list(t.step_rewards) for t in trajs]
        if key == "total_reward":
            return [t.total_reward for t in trajs]
        if key == "num_turns":
            return [t.num_turns for t in trajs]
        if key == "trainer_state":
            return self.trainer_state
        if key in ("step", "progress"):
            if key in self.data_keys():  # the dataset's own column of that name
                return [t.data.get(key) for t in trajs]
            step, progress = attrs.evolve(self.context, trainer_state=self.trainer_state).progress_values()
            return step if key == "step" else progress
        if key in ("log_metric", "log_extra"):
            return getattr(self.context, key) or _no_log
        if key == "environments":
            return [self.context.environment_of(t) for t in trajs]  # type: ignore[misc]
        return [t.data.get(key) for t in trajs]


def reward_inputs(trajectories: Sequence[Trajectory], trainer_state: Any = None,
                  context: RewardContext | None = None) -> RewardInputs:
    """Every argument an rlcore-style reward may ask for (see :class:`RewardInputs`)."""
    return RewardInputs(trajectories, trainer_state, context)


def trl_reward_inputs(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """TRL's reward arguments from rlcore's: the dataset's own ``prompt`` values (text or messages),
    completions in the matching shape, the other columns, and the run-level values.

    A trajectory whose dataset row had no ``prompt`` column (rlcore's ``question``/``messages``
    columns, environment-only rows) counts as conversational when it came from messages."""
    trajs: list[Trajectory] = inputs["trajectories"]
    prompts: list[Any] = []
    completions: list[Any] = []
    for i, t in enumerate(trajs):
        raw = t.data.get("prompt") if "prompt" in t.data else inputs["prompts"][i]
        prompts.append(raw)
        if _is_conversational_prompt(raw):
            completions.append(inputs["completion_messages"][i])
        else:
            completions.append(inputs["completion_texts"][i])
    keys = inputs.data_keys() if isinstance(inputs, RewardInputs) else list(dict.fromkeys(k for t in trajs for k in t.data))
    out = {k: inputs[k] for k in keys if k != "prompt"}
    out.update(
        prompts=prompts, completions=completions, completion_ids=inputs["completion_ids"],
        trainer_state=inputs["trainer_state"], log_extra=inputs["log_extra"], log_metric=inputs["log_metric"],
    )
    if "environments" in inputs:
        out["environments"] = inputs["environments"]
    return out


def _plain(message: dict[str, Any]) -> dict[str, Any]:
    """A message as TRL hands it to rewards: role and content (tool calls kept when present)."""
    out = {"role": message.get("role"), "content": message.get("content")}
    for key in ("tool_calls", "name", "tool_call_id"):
        if message.get(key) is not None:
            out[key] = message[key]
    return out


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
        return await _score_into(self, self.score, trajectories)


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
        return await _score_into(self, self.fn, trajectories)


def reward_function(reward: Any) -> Callable[..., Any] | None:
    """The function whose signature says what ``reward`` is given: a :class:`FunctionReward`'s
    function, a :class:`Reward`'s ``score`` (bound, or the class's own before it is built), a
    plain function as registered; None for a reward with its own ``compute_reward``."""
    if isinstance(reward, FunctionReward):
        return reward.fn
    if isinstance(reward, Reward) and type(reward).compute_reward is Reward.compute_reward:
        return reward.score
    if inspect.isclass(reward) and issubclass(reward, Reward) and reward.compute_reward is Reward.compute_reward:
        return functools.partial(reward.score, None)  # the class's score without ``self``
    if inspect.isfunction(reward):
        return reward
    return None


def check_reward_columns(rewards: Sequence[Any], rows: Sequence[Mapping[str, Any]], source: str = "dataset") -> None:
    """Before training: every argument a reward *requires* (no default) must be a reward input or a
    column of the dataset. Otherwise it would get ``None`` for every row and the run would train on
    nothing while looking fine (TRL fails the call). A column only some rows have is fine: the others
    get ``None``. A lazy dataset (rows generated when read) is judged by its first row."""
    checked = rows if isinstance(rows, (list, tuple)) else rows[:1]
    columns: dict[str, None] = {}
    for row in checked:
        if isinstance(row, Mapping):
            columns.update(dict.fromkeys(row))
    known = set(RewardInputs._BUILT) | set(TRL_REWARD_ARGS) | {"environments"} | set(columns)
    for reward in rewards:  # reward objects, or (name, registered factory) before anything is built
        name, reward = reward if isinstance(reward, tuple) else (reward.name, reward)
        fn = reward_function(reward)
        if fn is None:
            continue
        try:
            params = (inspect.signature(fn) if isinstance(fn, functools.partial) else _signature(fn)).parameters.values()
        except (TypeError, ValueError):  # a builtin or C callable: nothing to read
            continue
        missing = [p.name for p in params if p.default is inspect.Parameter.empty and p.name not in known
                   and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
        if missing:
            have = ", ".join(columns) or "none"
            raise DatasetError(
                f"reward {name!r} needs the column {', '.join(repr(m) for m in missing)}, which {source} does not have "
                f"(columns: {have}); use a dataset with it, or, in a reward of your own, give the parameter a default "
                f"({missing[0]}=None) to score rows without it")


async def _score_into(reward: Any, fn: Callable[..., Any], trajectories: list[Trajectory]) -> dict[str, list[float | None]]:
    """Score with ``fn`` and keep the reward object's counters: samples that raised (``errors``),
    the first exception of this batch (``last_failures``) — the trainer reads both."""
    failures: list[BaseException] = []
    context = getattr(reward, "context", None)
    values, errors = await score_reward(reward.name, fn, trajectories, getattr(reward, "trainer_state", None),
                                        context=context, failures=failures)
    reward.errors = getattr(reward, "errors", 0) + errors
    reward.last_failures = failures
    return {reward.name: values}


def takes_kwargs(fn: Callable[..., Any]) -> bool:
    """True for TRL-style reward functions (``**kwargs``): they get TRL's arguments and shapes."""
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in _signature(fn).parameters.values())


def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    target = fn
    if not (inspect.isfunction(fn) or inspect.ismethod(fn)) and callable(fn):
        target = fn.__call__  # type: ignore[attr-defined]
    return inspect.signature(target)


def _wanted(fn: Callable[..., Any], inputs: dict[str, Any]) -> dict[str, Any]:
    sig = _signature(fn)
    if takes_kwargs(fn):  # TRL's convention: TRL's arguments, plus rlcore extras the function names
        out = trl_reward_inputs(inputs)
        for pname, p in sig.parameters.items():
            if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD) or pname in out:
                continue
            if pname in inputs:
                out[pname] = inputs[pname]
            elif p.default is inspect.Parameter.empty:
                out[pname] = [None] * len(inputs["trajectories"])
        return out
    out = {}
    for pname, p in sig.parameters.items():
        if p.kind in (inspect.Parameter.VAR_POSITIONAL,):
            continue
        if pname in inputs:
            out[pname] = inputs[pname]
        elif p.default is inspect.Parameter.empty:
            out[pname] = [None] * len(inputs["trajectories"])  # a column this dataset lacks
    return out


class RewardCountError(RewardFunctionError, ValueError):
    """A reward returned a number of values other than one per trajectory: a bug in the reward,
    reported as such (never retried per sample, where a function that always returns one value
    would look right)."""


def _check(name: str, values: Any, n: int) -> list[float | None]:
    if not isinstance(values, (list, tuple)) and hasattr(values, "tolist"):
        values = values.tolist()
    if isinstance(values, (int, float)) and n == 1:
        values = [values]
    if not isinstance(values, (list, tuple)) or len(values) != n:
        got = f"{len(values)} value{'s' * (len(values) != 1)}" if isinstance(values, (list, tuple)) else f"a {type(values).__name__}"
        raise RewardCountError(f"reward {name!r} returned {got} for {n} trajectories; a reward returns a list "
                               "with one score (or None) per completion, in order")
    out: list[float | None] = []
    for v in values:
        if v is None:
            out.append(None)
        else:
            f = float(v)
            out.append(None if math.isnan(f) else f)
    return out


class NonFiniteRewardError(ValueError):
    """A reward gave ±inf for a sample: counted like a sample that raised (the sample gets ``None``),
    since one inf makes the batch's mean inf and every advantage of its group NaN — the step would
    train on nothing. (NaN stays what it means in TRL: this reward does not apply to the sample.)"""

    def __init__(self, name: str, value: float) -> None:
        super().__init__(f"reward {name!r} returned {value!r}")
        self.value = value


def _drop_non_finite(name: str, values: list[float | None], failures: list[BaseException] | None
                     ) -> tuple[list[float | None], int]:
    """``values`` with ±inf replaced by ``None``, and how many were; each is a failure of its sample."""
    bad = 0
    out: list[float | None] = []
    for v in values:
        if v is not None and math.isinf(v):
            bad += 1
            if failures is not None:
                failures.append(NonFiniteRewardError(name, v))
            v = None
        out.append(v)
    return out, bad


async def score_reward(
    name: str, fn: Callable[..., Any], trajectories: Sequence[Trajectory], trainer_state: Any = None,
    *, context: RewardContext | None = None, failures: list[BaseException] | None = None,
) -> tuple[list[float | None], int]:
    """Run one reward over a batch, isolating samples that raise or score ±inf (both ``None``).
    Returns (values, error count); the exceptions of failing samples (a
    :class:`NonFiniteRewardError` for an inf) are appended to ``failures`` when given."""
    n = len(trajectories)
    if n == 0:
        return [], 0
    try:
        inputs = reward_inputs(trajectories, trainer_state, context)
        values = _check(name, await to_thread_if_sync(fn, **_wanted(fn, inputs)), n)
    except RewardCountError:
        raise  # a contract bug, not a sample's: one sample at a time would hide it (1 value for 1 sample)
    except Exception as exc:  # noqa: BLE001 - retry per sample to find the culprit(s)
        if n == 1:
            if failures is not None:
                failures.append(exc)
            return [None], 1
    else:
        return _drop_non_finite(name, values, failures)
    values = []
    errors = 0
    for t in trajectories:
        v, e = await score_reward(name, fn, [t], trainer_state, context=context, failures=failures)
        values.extend(v)
        errors += e
    return values, errors


def as_reward(name: str, obj: Any) -> Reward:
    """Wrap a registered reward factory/object/function into something with a ``compute_reward`` hook."""
    if isinstance(obj, Reward):  # an instance (built with options) keeps a name of its own, else takes ``name``
        if not getattr(obj, "name", None) or obj.name == "reward":
            obj.name = name
        return obj
    if inspect.isclass(obj) and issubclass(obj, Reward):
        inst = obj()
        if not getattr(inst, "name", None) or inst.name == "reward":
            inst.name = name
        return inst
    if callable(obj):
        return FunctionReward(name, obj)
    raise TypeError(f"reward {name!r} is neither a function nor a Reward")


_warned_non_finite: set[str] = set()


def _finite_column(name: str, vals: list[float | None]) -> list[float | None]:
    """A column with ±inf as ``None``. Rewards scored through :func:`score_reward` come here clean
    (their infs counted in ``reward_errors/<name>``); a plugin's own ``compute_reward`` hook may
    not: its infs are dropped too, said once per process."""
    bad = sum(1 for v in vals if v is not None and math.isinf(v))
    if not bad:
        return vals
    if name not in _warned_non_finite:
        _warned_non_finite.add(name)
        logger.warning("reward %r returned inf for %d of %d samples; they get no reward — a reward returns a finite "
                       "number (or None) per completion", name, bad, len(vals))
    return [None if v is not None and math.isinf(v) else v for v in vals]


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
            columns[name] = _finite_column(name, _check(name, vals, len(trajectories)))
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


AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


def normalize_then_sum(
    columns: Mapping[str, Sequence[float | None]],
    weights: Mapping[str, float],
    groups: Sequence[str],
    scorable: Sequence[bool] | None = None,
) -> list[float]:
    """GDPO's aggregate (TRL 1.16 ``multi_objective_aggregation="normalize_then_sum"``,
    ``_generate_and_score_completions``): every reward column is normalised within each group —
    ``(r - nanmean) / (nanstd + 1e-4)``, Bessel-corrected, unscored samples left out — and the
    normalised columns are summed with their weights, an unscored sample adding 0. A trajectory no
    reward scored (or one ``scorable`` marks False: a failed rollout) gets NaN, so the advantage
    estimator leaves it out and gives it 0. Why per reward: a reward with a wide range (a length
    bonus) no longer drowns a 0/1 one (accuracy) before the group baseline sees them.

    Only the columns named in ``weights`` count (observer columns are logged, never trained on).
    A group of one has std 0 (TRL's ``num_generations == 1`` case): its normalised rewards are 0.
    """
    import torch

    from ..algorithms.advantages import EPS, group_indices

    names = [n for n in weights if n in columns]
    n = len(groups)
    if not names:
        return [math.nan] * n
    raw = torch.tensor([[math.nan if columns[k][i] is None else float(columns[k][i]) for k in names] for i in range(n)],
                       dtype=torch.float64).view(n, len(names))
    if scorable is not None:
        raw[~torch.tensor(list(scorable), dtype=torch.bool)] = math.nan
    normed = torch.full_like(raw, math.nan)
    for idx in group_indices(groups):
        g = raw[idx]
        mean = torch.nanmean(g, dim=0, keepdim=True)
        if len(idx) > 1:
            valid = (~torch.isnan(g)).sum(0, keepdim=True)
            var = torch.nansum((g - mean) ** 2, dim=0, keepdim=True) / (valid - 1)  # NaN/inf with < 2 valid, as TRL
            std = var.sqrt()
        else:
            std = torch.zeros_like(mean)
        normed[idx] = (g - mean) / (std + EPS)
    w = torch.tensor([float(weights[k]) for k in names], dtype=torch.float64)
    total = torch.nansum(normed * w, dim=1)
    total[torch.isnan(raw).all(dim=1)] = math.nan
    return [float(v) for v in total]


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

