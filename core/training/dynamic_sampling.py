"""DAPO's dynamic sampling: train only on groups whose rewards differ, drawing more prompts to refill.

Why: a group whose completions all scored the same (every one solved the prompt, or none did) has
advantage 0 everywhere under any group-relative estimator; it costs a generation and a forward and
backward pass and moves nothing (except the KL or entropy terms). DAPO (Yu et al. 2025) drops such
groups and samples more prompts until the batch is full of groups with a signal.

:class:`DynamicSampling` is the bookkeeping of one step, shared by ``GRPOTrainer`` and a loop
(``rlcore.loop.DynamicSampling``): ask :meth:`~DynamicSampling.next_draw` how many prompts to roll
out, :meth:`~DynamicSampling.add` the scored round, repeat until it says 0, then
:meth:`~DynamicSampling.take` the batch. Its rules:

* *enough* is ``groups`` groups with spread (the trainer's ``prompts_per_generation``): the batch
  then has exactly that many, in draw order; groups with spread found beyond it are dropped
  (``surplus``; verl drops them too — kept for a later step they would be sampled by an older policy);
* the first round draws ``groups`` prompts; each further round draws what the rate of spread seen so
  far says is missing (never more than ``groups``; the whole batch when nothing had spread yet), at
  most ``max_resample_rounds`` further rounds. The sizes depend on the groups alone, not on how many
  data-parallel ranks share them, so a data-parallel run draws what one process draws;
* after the bound, ``min_groups`` is the fewest groups with spread that may be trained on (the
  batch is then smaller); fewer is :attr:`~DynamicSampling.short` (the trainer skips that step);
* spread: the group's highest and lowest score differ, among completions that could be scored
  (failed ones and ``None`` left out; fewer than two scored is flat). ``metric`` ``"reward"`` is the
  weighted total (``trajectory.reward``); any other value names one reward column
  (``trajectory.rewards[metric]``), like verl's ``filter_groups.metric``.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..errors import ConfigError
from ..types import Trajectory

__all__ = ["DynamicSampling", "filter_groups", "group_has_spread", "groups_of"]

TOTAL = "reward"


def _score(t: Trajectory, metric: str) -> float | None:
    if t.status == "failed":
        return None
    v = t.reward if metric == TOTAL else t.rewards.get(metric)
    if v is None:
        return None
    v = float(v)
    return None if math.isnan(v) else v


def group_has_spread(group: Sequence[Trajectory], metric: str = TOTAL) -> bool:
    """True when at least two of the group's scored completions differ in ``metric``."""
    scores = [s for s in (_score(t, metric) for t in group) if s is not None]
    return len(scores) >= 2 and max(scores) > min(scores)


def groups_of(trajectories: Sequence[Trajectory]) -> list[list[Trajectory]]:
    """Whole groups (by ``group_id``; a trajectory without one is its own group), in first-seen order."""
    out: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        out.setdefault(t.group_id or t.uuid, []).append(t)
    return list(out.values())


def filter_groups(trajectories: Sequence[Trajectory], metric: str = TOTAL) -> tuple[list[Trajectory], list[Trajectory]]:
    """Split scored trajectories into (kept, filtered), whole groups each: kept have reward spread."""
    kept: list[Trajectory] = []
    flat: list[Trajectory] = []
    for g in groups_of(trajectories):
        (kept if group_has_spread(g, metric) else flat).extend(g)
    return kept, flat


class DynamicSampling:
    """One step's dynamic sampling: rounds of prompts until ``groups`` groups have spread (see the module)."""

    def __init__(self, groups: int, max_resample_rounds: int = 9, min_groups: int = 1, metric: str = TOTAL) -> None:
        for name, value, low in (("groups", groups, 1), ("max_resample_rounds", max_resample_rounds, 0),
                                 ("min_groups", min_groups, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"dynamic sampling: {name}={value!r} must be an int >= {low}")
        if min_groups > groups:
            raise ConfigError(f"dynamic sampling: min_groups={min_groups} is more than the {groups} groups a batch holds")
        self.groups, self.max_resample_rounds, self.min_groups = groups, max_resample_rounds, min_groups
        self.metric = str(metric)
        self.rounds = 0
        self.drawn = 0  # prompts asked for
        self.kept: list[list[Trajectory]] = []  # groups with spread, in draw order
        self.filtered = 0  # flat groups dropped
        self.generated_groups = 0
        self.flat_values: set[float] = set()  # the scores flat groups had (for the stop line)
        #: reward columns (and the total) flat within every group so far: which reward gives no signal
        self.flat_columns: list[str] | None = None

    @property
    def done(self) -> bool:
        return len(self.kept) >= self.groups or self.rounds > self.max_resample_rounds

    @property
    def short(self) -> bool:
        """Past the bound with fewer than ``min_groups`` groups with spread: nothing to train on."""
        return self.done and len(self.kept) < self.min_groups

    def next_draw(self) -> int:
        """Prompts to roll out in the next round (0: done)."""
        if self.done:
            return 0
        if self.rounds == 0 or not self.kept:
            n = self.groups
        else:
            missing = self.groups - len(self.kept)
            rate = len(self.kept) / max(1, self.generated_groups)
            n = min(self.groups, math.ceil(missing / rate))
        return max(1, n)

    def add(self, trajectories: Sequence[Trajectory], drawn: int | None = None) -> None:
        """One round's scored trajectories (every rank's, in draw order)."""
        self.rounds += 1
        groups = groups_of(trajectories)
        self.drawn += len(groups) if drawn is None else int(drawn)
        self.generated_groups += len(groups)
        for g in groups:
            if group_has_spread(g, self.metric):
                self.kept.append(g)
            else:
                self.filtered += 1
                self.flat_values.update(s for s in (_score(t, self.metric) for t in g) if s is not None)
            names = [TOTAL, *dict.fromkeys(k for t in g for k in t.rewards if not k.startswith("observer/"))]
            flat_here = [n for n in names if not group_has_spread(g, n)]
            self.flat_columns = flat_here if self.flat_columns is None else \
                [n for n in self.flat_columns if n in flat_here]

    @property
    def surplus(self) -> int:
        return max(0, len(self.kept) - self.groups)

    def take(self) -> list[list[Trajectory]]:
        """The batch's groups: the first ``groups`` with spread (fewer past the bound; none when short)."""
        return [] if self.short else self.kept[: self.groups]

    def metrics(self) -> dict[str, float]:
        kept = 0 if self.short else min(len(self.kept), self.groups)
        return {
            "dynamic_sampling/rounds": float(self.rounds),
            "dynamic_sampling/filtered_groups": float(self.filtered),
            "dynamic_sampling/kept_groups": float(kept),
            "dynamic_sampling/surplus_groups": float(self.surplus),
            "dynamic_sampling/generated_groups": float(self.generated_groups),
            "dynamic_sampling/skipped": 1.0 if self.short else 0.0,
        }


def check_metric(metric: str, reward_names: Sequence[str]) -> None:
    """``dynamic_sampling_metric`` is ``reward`` (the weighted total) or one of the run's rewards."""
    if metric != TOTAL and metric not in reward_names:
        raise ConfigError(f"dynamic_sampling_metric={metric!r} is not a reward of this run; use 'reward' (the weighted "
                          f"total) or one of: {', '.join(reward_names) or 'no named reward'}")


def stop_line(flat_columns: Sequence[str] | None, metric: str, values: Sequence[float], rounds: int, steps: int,
              groups: int, max_resample_rounds: int, *, spread: int = 0, min_groups: int = 1,
              gens: int | None = None, reward_names: Sequence[str] = ()) -> str:
    """The line a run stops with when ``steps`` steps in a row found fewer than ``min_groups`` groups
    with spread (``spread`` of the ``groups`` generated in those steps had some)."""
    named = [c for c in (flat_columns or []) if c != TOTAL]
    if metric != TOTAL:
        who = f"reward {metric!r}"
    elif len(named) == 1:
        who = f"reward {named[0]!r}"
    elif named:
        who = "rewards " + ", ".join(repr(n) for n in named)
    elif len(reward_names) == 1:
        who = f"reward {reward_names[0]!r}"
    else:
        who = "the weighted total of rewards " + ", ".join(repr(n) for n in reward_names) if reward_names else \
            "the weighted total of the rewards"
    shown = ", ".join(f"{v:g}" for v in sorted(values)[:4]) + (" …" if len(values) > 4 else "")
    scores = f"; the flat groups scored {shown}" if values else ""
    where = (f"for {rounds} rounds ({steps} steps in a row, {groups} groups, max_resample_rounds={max_resample_rounds}"
             f"{scores})")
    if spread:
        what = (f"dynamic sampling found too little learning signal: only {spread} of {groups} groups had any spread in "
                f"{who} {where}, fewer than min_groups={min_groups} per step")
    else:
        what = (f"dynamic sampling found no learning signal: {who} gave every completion of every group the same score "
                f"{where}, so no group has a nonzero advantage")
    return (f"{what} — try easier prompts, a denser reward, more --num-generations{f' (now {gens})' if gens else ''} "
            "or a higher --temperature, or a larger --max_resample_rounds")
