"""A generation batch from rollout to advantages, as values: :class:`Rollout` (the trajectories and
their invariant counts), :class:`ScoredBatch` (what scoring returns: the batch to train, its
advantages, every rank's batch and what the step's metrics report) and the steps between them —
every reward on the batch (:func:`score_rewards`), a reward that failed on every sample stopping
the run (:func:`check_reward_failures`), and the chosen estimator over every rank's batch
(:func:`estimate_advantages`, called as the loop API calls it).

Why values: the trainer's step reads what scoring found from the object scoring returned, so a
subclass, a test or the Ray trainer sees one batch's numbers travel together instead of attributes
of the trainer that a later call overwrites.
"""

from __future__ import annotations

import inspect
import logging
import math
import traceback
from typing import Any, Iterable, Sequence

import attrs
import torch

from ..algorithms.advantages import AdvantageStats, group_indices
from ..asyncutil import await_me_maybe, run_sync
from ..errors import ConfigError, RewardFunctionError
from ..loop.loss import advantage_list
from ..plugins import RunHooks
from ..rewards import NonFiniteRewardError, RewardContext, compute_rewards, normalize_then_sum
from ..training.data_parallel import WholeBatch
from ..training.dynamic_sampling import DynamicSampling
from ..training.metrics import rollout_metrics
from ..types import Trajectory

logger = logging.getLogger(__name__)


class Rollout(list):
    """One rollout's trajectories (a list, as :meth:`GRPOTrainer.rollout` always returned) with what
    the batch-wide invariant check counted on them: violations (each failed its trajectory) and the
    seconds the check took."""

    def __init__(self, trajectories: Iterable[Trajectory] = (), invariant_violations: int = 0,
                 invariant_check_s: float = 0.0) -> None:
        super().__init__(trajectories)
        self.invariant_violations = int(invariant_violations)
        self.invariant_check_s = float(invariant_check_s)

    @classmethod
    def of(cls, trajectories: Iterable[Trajectory]) -> "Rollout":
        """``trajectories`` if it is a Rollout, else a Rollout of them with nothing counted."""
        return trajectories if isinstance(trajectories, cls) else cls(trajectories)


@attrs.define
class ScoredBatch:
    """A rollout scored. ``trajectories`` and ``advantages`` are this rank's (what it trains),
    ``columns`` its reward columns; ``whole`` is every rank's batch (what the estimator saw, what
    completion logging writes) with ``whole_advantages``. ``generated`` is every trajectory the
    step rolled out when that is more than ``whole`` (dynamic sampling: every round's), and
    ``sampling`` that step's :class:`DynamicSampling` bookkeeping."""

    trajectories: list[Trajectory]
    advantages: list[Any]
    columns: dict[str, list[float | None]]
    whole: WholeBatch
    whole_advantages: list[Any]
    stats: AdvantageStats
    reward_errors: dict[str, float] = attrs.field(factory=dict)
    invariant_violations: int = 0
    invariant_check_s: float = 0.0
    generated: WholeBatch | None = None
    sampling: DynamicSampling | None = None

    @property
    def skips_step(self) -> bool:
        """Dynamic sampling found too few groups with reward spread: the step trains on nothing."""
        return self.sampling is not None and self.sampling.short

    def metrics(self) -> dict[str, float]:
        """The rollout metrics of every trajectory generated (every rank's) and the reward errors."""
        g = self.generated if self.generated is not None else self.whole
        return {**rollout_metrics(g.trajectories, g.columns, self.stats.zero_std_frac), **self.reward_errors}

    def step_metrics(self, prompt_sampler_metrics: dict[str, float]) -> dict[str, float]:
        """A training step's: :meth:`metrics`, dynamic sampling's counts, the prompt sampler's
        (``prompt_sampler/skipped`` …) and the rollout invariants' (every round's)."""
        out = self.metrics()
        ds = self.sampling
        if ds is not None:
            out.update(ds.metrics())
            if not ds.short:  # what one group with a learning signal cost in sampled tokens (every round's)
                out["dynamic_sampling/tokens_per_kept_group"] = \
                    out["sampled_tokens"] / max(1.0, out["dynamic_sampling/kept_groups"])
        out.update(prompt_sampler_metrics)
        out["invariant_violations"] = float(self.invariant_violations)
        out["invariant_check_time"] = float(self.invariant_check_s)
        return out


@attrs.define
class RewardLog:
    """What reward functions log through their context (TRL's ``log_metric`` and ``log_extra``)
    until the step (or evaluation batch) that scored them takes it."""

    metrics: dict[str, list[float]] = attrs.field(factory=dict)
    extras: dict[str, list[Any]] = attrs.field(factory=dict)

    def log_metric(self, name: str, value: float) -> None:
        """TRL's ``log_metric`` for rewards: averaged into the step's metrics under ``name``."""
        self.metrics.setdefault(str(name), []).append(float(value))

    def log_extra(self, column: str, values: list[Any]) -> None:
        """TRL's ``log_extra`` for rewards: a column beside the logged completions."""
        self.extras.setdefault(str(column), []).extend(list(values))

    def pop_metrics(self) -> dict[str, float]:
        """Each logged metric's mean since the last call."""
        out = {name: sum(v) / len(v) if v else float("nan") for name, v in self.metrics.items()}
        self.metrics = {}
        return out

    def pop_extras(self) -> dict[str, list[Any]]:
        """The logged columns since the last call."""
        out, self.extras = self.extras, {}
        return out


def score_rewards(trajs: Sequence[Trajectory], rewards: Sequence[Any], weights: dict[str, float], *,
                  context: RewardContext, observers: Sequence[str], reported: set[str]
                  ) -> tuple[dict[str, list[float | None]], dict[str, float]]:
    """Score ``trajs`` with every reward (columns on the trajectories, the weighted sum in
    ``.reward``): the columns, and how many samples each reward failed (``reward_errors/<name>``)
    or stopped at its deadline (``reward_timeouts/<name>``). A reward failing on every sample stops
    the run (:func:`check_reward_failures`)."""
    for r in rewards:
        if hasattr(r, "trainer_state"):
            r.trainer_state = context.trainer_state
        r.context = context
    hooks = RunHooks(*rewards, observers=tuple(observers))
    errors_before = {r.name: getattr(r, "errors", 0) for r in rewards}
    timeouts_before = {r.name: getattr(r, "timeouts", 0) for r in rewards}
    columns = run_sync(compute_rewards(hooks, list(trajs), weights))
    errors = {f"reward_errors/{r.name}": float(getattr(r, "errors", 0) - errors_before[r.name]) for r in rewards}
    errors.update({  # samples a bounded reward stopped at its deadline (scored 0)
        f"reward_timeouts/{r.name}": float(r.timeouts - timeouts_before[r.name]) for r in rewards if hasattr(r, "timeouts")
    })
    check_reward_failures(rewards, len(trajs), reported)
    return columns, errors


def check_reward_failures(rewards: Sequence[Any], n: int, reported: set[str]) -> None:
    """A reward that raised (or scored ±inf) on every sample stops the run (chained to its first
    exception, so that traceback shows once); one that failed on some samples is reported once
    per run (once for raising, once for ±inf; ``reported`` holds what was)."""
    for r in rewards:
        failures = getattr(r, "last_failures", None) or []
        if not failures:
            continue
        raised = [f for f in failures if not isinstance(f, NonFiniteRewardError)]
        inf = sorted({repr(f.value) for f in failures if isinstance(f, NonFiniteRewardError)}, reverse=True)
        if not inf:
            what = f"raised on {len(failures)}"
        else:
            what = (f"raised on {len(raised)} and " if raised else "") + \
                f"returned {' or '.join(inf)} on {len(failures) - len(raised)}"
        finite = "a reward returns a finite number (or None) per completion"
        first = raised[0] if raised else None
        if len(failures) >= n > 0:
            if not inf:
                raise RewardFunctionError(
                    f"reward {r.name!r} raised on all {n} samples ({type(first).__name__}: {first}); "
                    "fix the reward function (its traceback is above)"
                ) from first
            if first is None:
                raise RewardFunctionError(f"reward {r.name!r} returned {' or '.join(inf)} on all {n} samples; "
                                          f"{finite} — fix the reward function") from None
            raise RewardFunctionError(
                f"reward {r.name!r} {what} of {n} samples ({type(first).__name__}: {first}); {finite} — "
                "fix the reward function (its traceback is above)") from first
        key = r.name if first is not None else f"{r.name} (non-finite)"
        if key not in reported:
            reported.add(key)
            if first is None:
                logger.warning("reward %r %s of %d samples; they get no reward (counted in reward_errors/%s) — %s",
                               r.name, what, n, r.name, finite)
            else:
                logger.warning(
                    "reward %r %s of %d samples; they get no reward (counted in reward_errors/%s). First error:\n%s",
                    r.name, what, n, r.name, "".join(traceback.format_exception(first)).rstrip(),
                )


def estimate_advantages(estimator: Any, whole: WholeBatch, config: Any,
                        reward_weights: dict[str, float]) -> tuple[list[Any], AdvantageStats]:
    """The run's estimator over ``whole`` (every rank's trajectories): one advantage per trajectory
    (a list per trajectory for step-level estimators) and the estimator's stats. Its
    ``compute_advantage`` is called directly, as the loop API calls it (an async one is awaited);
    ``config`` is the run's config, as the hook's ``config`` always was."""
    groups = [t.group_id for t in whole.trajectories]
    if config.multi_objective_aggregation == "normalize_then_sum":
        # GDPO: each reward normalised per group first
        rewards = torch.tensor(normalize_then_sum(whole.columns, reward_weights, groups,
                                                  scorable=[t.status != "failed" for t in whole.trajectories]),
                               dtype=torch.float32)
    else:
        rewards = torch.tensor([
            math.nan if (t.reward is None or t.status == "failed") else float(t.reward) for t in whole.trajectories
        ], dtype=torch.float32)
    adv = estimator.compute_advantage(rewards=rewards, groups=groups, trajectories=whole.trajectories, config=config)
    if inspect.isawaitable(adv):
        adv = run_sync(await_me_maybe(adv))
    if adv is None:
        raise ConfigError(f"advantage estimator {config.advantage!r} returned nothing")
    stats = getattr(estimator, "stats", None)
    if not isinstance(stats, AdvantageStats):
        stats = AdvantageStats(groups=len(group_indices(groups)))
    return advantage_list(adv), stats
