"""Advantage estimators: turn per-trajectory rewards into the signal the loss multiplies.

Each estimator is a small class whose ``compute_advantage`` method is the lifecycle hook of the same
name, so a third-party estimator is registered and called exactly like these. Groups are the
``num_generations`` samples of one prompt (trajectories sharing a ``group_id``); a scheduler that
returns several trajectories per request keeps the request's group id, so groups may be uneven.

Conventions shared by all estimators (and matched to TRL's where TRL has the estimator):

* ``NaN`` rewards (no reward function could score the trajectory) are left out of group statistics
  and get advantage 0: an unscorable sample must neither move the baseline nor the policy.
* A group whose valid rewards are all equal (or that has fewer than two) carries no signal: its
  advantage is exactly 0 and it is counted in :attr:`AdvantageStats.zero_std_groups`.
* Standard deviations are Bessel-corrected and ``1e-4`` is added before dividing, as TRL does.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Sequence

import attrs
import torch

from ..errors import ConfigError
from ..hookspecs import hookimpl

EPS = 1e-4


@attrs.frozen
class AdvantageConfig:
    """What the built-in estimators read from a run's config (as :class:`~rlcore.algorithms.losses.LossConfig`
    is what a loss reads), with the defaults they use when a config does not say.

    ``scale_rewards``: ``group``, ``batch`` or ``none`` (TRL's ``True``/``False`` mean ``group``/``none``
    for GRPO). ``multi_objective_aggregation``: ``normalize_then_sum`` (GDPO) makes GRPO whiten the
    aggregate batch-wide. ``gigpo_gamma`` / ``gigpo_step_weight``: rlcore 0.1's GiGPO fields, read only
    when the ``gamma`` / ``step_weight`` options are not given.

    Built from a :class:`~rlcore.training.config.GRPOConfig` (or anything with those attributes) with
    :meth:`from_config`; :meth:`of` takes either. Third-party estimators are not given this: the hook's
    ``config`` (and the factory's ``config=``) stay the run's GRPOConfig, whose every field a plugin may read.
    """

    scale_rewards: Any = "group"
    multi_objective_aggregation: str | None = None
    gigpo_gamma: float | None = None
    gigpo_step_weight: float | None = None

    @classmethod
    def from_config(cls, config: Any) -> "AdvantageConfig":
        """The fields ``config`` has (a missing one keeps its default), values as given."""
        return cls(**{f.name: getattr(config, f.name) for f in attrs.fields(cls) if hasattr(config, f.name)})

    @classmethod
    def of(cls, config: Any) -> "AdvantageConfig":
        """``config`` if it is an AdvantageConfig already, the defaults for ``None``, else :meth:`from_config`."""
        if isinstance(config, cls):
            return config
        return cls() if config is None else cls.from_config(config)


@attrs.define
class AdvantageStats:
    """What the last call saw; the trainer logs ``zero_std_frac``."""

    groups: int = 0
    zero_std_groups: int = 0

    @property
    def zero_std_frac(self) -> float:
        return self.zero_std_groups / self.groups if self.groups else 0.0


def group_indices(groups: Sequence[str]) -> list[list[int]]:
    """Row indices of each group, in order of first appearance."""
    order: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        order.setdefault(str(g), []).append(i)
    return list(order.values())


def _nanstd(x: torch.Tensor) -> float:
    """Bessel-corrected std over the non-NaN entries; NaN when fewer than two."""
    v = x[~torch.isnan(x)]
    if v.numel() < 2:
        return math.nan
    return float(v.std(unbiased=True))


def _is_flat(x: torch.Tensor) -> bool:
    """True when a group's valid rewards carry no ranking signal (all equal, or < 2 valid)."""
    v = x[~torch.isnan(x)]
    return v.numel() < 2 or bool(torch.allclose(v, v[0].expand_as(v), rtol=0.0, atol=1e-8))


def _groups(r: torch.Tensor, groups: Sequence[str], stats: AdvantageStats) -> Iterator[tuple[list[int], torch.Tensor, bool]]:
    """Each group's row indices, its rewards, and whether it is flat (no ranking signal), counted
    into ``stats`` (``groups``, ``zero_std_groups``) the same way for every group-relative estimator."""
    for idx in group_indices(groups):
        g = r[idx]
        stats.groups += 1
        flat = _is_flat(g)
        if flat:
            stats.zero_std_groups += 1
        yield idx, g, flat


def _as_tensor(rewards: Any) -> torch.Tensor:
    if isinstance(rewards, torch.Tensor):
        return rewards.detach().to(torch.float64).flatten()
    return torch.tensor([math.nan if r is None else float(r) for r in rewards], dtype=torch.float64)


def grpo_advantages(rewards: Any, groups: Sequence[str], scale_rewards: str = "group") -> tuple[torch.Tensor, AdvantageStats]:
    """GRPO: reward minus its group mean, divided by the group std (``group``), the batch std
    (``batch``, as in Dr. GRPO-style "don't favour easy prompts" setups) or nothing (``none``)."""
    if scale_rewards not in ("group", "batch", "none"):
        raise ConfigError(f"scale_rewards={scale_rewards!r} is not one of group, batch, none")
    r = _as_tensor(rewards)
    adv = torch.zeros_like(r)
    stats = AdvantageStats()
    batch_std = _nanstd(r)
    for idx, g, flat in _groups(r, groups, stats):
        if flat:
            continue
        centred = g - torch.nanmean(g)
        if scale_rewards == "group":
            centred = centred / (_nanstd(g) + EPS)
        elif scale_rewards == "batch":
            centred = centred / (batch_std + EPS)
        adv[idx] = centred
    return torch.nan_to_num(adv, nan=0.0).to(torch.float32), stats


def batch_whitened_advantages(rewards: Any) -> tuple[torch.Tensor, AdvantageStats]:
    """GRPO's advantage under GDPO (``multi_objective_aggregation="normalize_then_sum"``): the
    aggregate, already normalised per reward within each group, minus its batch mean, divided by its
    batch std + 1e-4 (TRL 1.16 ``_generate_and_score_completions``). ``zero_std_frac`` is TRL's
    ``frac_reward_zero_std`` there: 1 when the batch std is 0, else 0."""
    r = _as_tensor(rewards)
    std = _nanstd(r)
    adv = torch.zeros_like(r) if math.isnan(std) else (r - torch.nanmean(r)) / (std + EPS)  # < 2 scored: no signal
    flat = not math.isnan(std) and abs(std) <= 1e-8
    return torch.nan_to_num(adv, nan=0.0).to(torch.float32), AdvantageStats(groups=1, zero_std_groups=int(flat))


def rloo_advantages(rewards: Any, groups: Sequence[str]) -> tuple[torch.Tensor, AdvantageStats]:
    """RLOO: each sample's reward minus the mean of the *other* valid samples of its group."""
    r = _as_tensor(rewards)
    adv = torch.zeros_like(r)
    stats = AdvantageStats()
    for idx, g, flat in _groups(r, groups, stats):
        if flat:
            continue
        valid = ~torch.isnan(g)
        n = int(valid.sum())
        total = torch.nansum(g)
        loo = (total - g) / (n - 1)
        adv[idx] = torch.where(valid, g - loo, torch.zeros_like(g))
    return adv.to(torch.float32), stats


def reinforce_pp_advantages(rewards: Any, groups: Sequence[str]) -> tuple[torch.Tensor, AdvantageStats]:
    """REINFORCE++ (baseline variant): subtract the group mean, then whiten by the std of those
    centred rewards over the whole batch. Global whitening is what keeps its updates stable when
    group stds vary wildly; the group baseline keeps flat groups at exactly zero."""
    r = _as_tensor(rewards)
    centred = torch.full_like(r, math.nan)
    stats = AdvantageStats()
    for idx, g, flat in _groups(r, groups, stats):
        if flat:
            centred[idx] = torch.where(torch.isnan(g), g, torch.zeros_like(g))
            continue
        centred[idx] = g - torch.nanmean(g)
    std = _nanstd(centred)
    adv = centred / (std + EPS) if not math.isnan(std) else torch.zeros_like(centred)
    return torch.nan_to_num(adv, nan=0.0).to(torch.float32), stats


# --- step level (multi-turn) ------------------------------------------------------------------------
def _assistant_turns(traj: Any) -> list[int]:
    """Indices into ``traj.turns`` of the sampled (trained) turns."""
    return [i for i, t in enumerate(traj.turns) if any(t.loss_mask)]


def _anchor(traj: Any, turn_index: int) -> tuple[int, ...]:
    """The state an assistant turn acted on: the tokens of the observation just before it (the
    prompt for the first turn). Identical observations across a group are GiGPO's anchor states."""
    for j in range(turn_index - 1, -1, -1):
        if not any(traj.turns[j].loss_mask):
            return tuple(traj.turns[j].token_ids)
    return tuple(traj.prompt_ids)


def gigpo_advantages(
    rewards: Any,
    groups: Sequence[str],
    trajectories: Sequence[Any],
    *,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    scale_rewards: str = "group",
) -> tuple[list[list[float]], AdvantageStats]:
    """GiGPO: episode advantage (GRPO over the group's final rewards) plus ``step_weight`` times a
    step advantage: within a group, turns taken from the same observation (an anchor state) are
    compared by their discounted return of per-turn ``step_rewards``. Returns one list per
    trajectory with a value for every completion token (observation tokens repeat the value of the
    turn they follow; they are masked out of the loss anyway)."""
    episode, stats = grpo_advantages(rewards, groups, scale_rewards)
    # discounted return of every assistant turn
    returns: list[list[float]] = []
    for traj in trajectories:
        turns = _assistant_turns(traj)
        sr = list(traj.step_rewards) + [0.0] * max(0, len(turns) - len(traj.step_rewards))
        sr = sr[: len(turns)]
        ret, acc = [0.0] * len(turns), 0.0
        for k in range(len(turns) - 1, -1, -1):
            acc = float(sr[k]) + gamma * acc
            ret[k] = acc
        returns.append(ret)
    step_adv: list[list[float]] = [[0.0] * len(r) for r in returns]
    for idx in group_indices(groups):
        buckets: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        for i in idx:
            for k, ti in enumerate(_assistant_turns(trajectories[i])):
                buckets.setdefault(_anchor(trajectories[i], ti), []).append((i, k))
        for members in buckets.values():
            vals = torch.tensor([returns[i][k] for i, k in members], dtype=torch.float64)
            if _is_flat(vals):
                continue
            centred = vals - vals.mean()
            if scale_rewards != "none":
                centred = centred / (float(vals.std(unbiased=True)) + EPS)
            for (i, k), a in zip(members, centred.tolist()):
                step_adv[i][k] = a
    out: list[list[float]] = []
    for i, traj in enumerate(trajectories):
        ep = float(episode[i])
        per_token: list[float] = []
        k = -1
        for t in traj.turns:
            if any(t.loss_mask):
                k += 1
            value = ep + step_weight * (step_adv[i][k] if k >= 0 else 0.0)
            per_token.extend([value] * len(t.token_ids))
        out.append(per_token)
    return out, stats


# --- hook implementations --------------------------------------------------------------------------
class _Estimator:
    """Holds the run's config; ``compute_advantage`` is the hook. ``stats`` is the last call's.

    An estimator's options are its constructor's keyword parameters (``advantage_options`` /
    ``--flag``), as for every component; ``config`` is the run's GRPOConfig or an
    :class:`AdvantageConfig` (wiring, not an option), kept as an AdvantageConfig (``None`` stays ``None``)."""

    def __init__(self, config: Any = None, **options: Any) -> None:
        self.config = None if config is None else AdvantageConfig.of(config)
        self.options = options
        self.stats = AdvantageStats()

    def __call__(self, rewards: Any, groups: Sequence[str] | None = None, *, num_generations: int | None = None,
                 trajectories: Sequence[Any] | None = None, **options: Any) -> Any:
        """Advantages straight from a loop: ``GRPOAdvantage()(rewards, num_generations=8, scale="group")``.

        ``rewards`` is one value per sample (``None``/NaN: unscored) or a list of trajectories (their
        ``reward``, failed ones unscored, grouped by ``group_id``). Groups are ``groups`` (one id per
        sample) or consecutive runs of ``num_generations`` samples. ``options`` override the
        estimator's for this call (``scale`` is ``scale_rewards``). Calls the same
        ``compute_advantage`` the trainer calls, so a loop and a trainer agree to the bit."""
        if isinstance(rewards, (list, tuple)) and rewards and all(hasattr(r, "group_id") and hasattr(r, "reward") for r in rewards):
            trajectories = list(rewards)
            rewards = [None if (t.reward is None or t.status == "failed") else float(t.reward) for t in trajectories]
            groups = groups if groups is not None else [t.group_id for t in trajectories]
        n = len(rewards)
        if groups is None:
            if num_generations is None:
                raise ConfigError(f"{type(self).__name__}: pass num_generations= (samples per prompt) or groups= (one id per sample)")
            if int(num_generations) < 1 or n % int(num_generations):
                raise ConfigError(f"{type(self).__name__}: {n} rewards do not split into groups of num_generations={num_generations}")
            groups = [str(i // int(num_generations)) for i in range(n)]
        elif len(groups) != n:
            raise ConfigError(f"{type(self).__name__}: {len(groups)} group ids for {n} rewards; give one per sample")
        if "scale" in options:
            options["scale_rewards"] = options.pop("scale")
        saved = self.options
        self.options = {**saved, **options}
        try:
            return self.compute_advantage(rewards=rewards, groups=list(groups), trajectories=list(trajectories or []),
                                          config=self.config)
        finally:
            self.options = saved

    def _config(self, config: Any) -> AdvantageConfig:
        """The estimator's own config, else the one the hook was called with (either kind), narrowed."""
        return AdvantageConfig.of(self.config if self.config is not None else config)

    def _scale(self, config: AdvantageConfig) -> Any:
        """``scale_rewards``: this call's or the estimator's option, else the config's."""
        return self.options.get("scale_rewards", config.scale_rewards)


class GRPOAdvantage(_Estimator):
    @hookimpl
    def compute_advantage(self, rewards: Any, groups: list[str], trajectories: list[Any], config: Any) -> Any:
        cfg = self._config(config)
        scale = self._scale(cfg)
        if scale is True:
            scale = "group"
        elif scale is False:
            scale = "none"
        if cfg.multi_objective_aggregation == "normalize_then_sum":
            # the rewards are GDPO aggregates (rlcore.rewards.normalize_then_sum): TRL whitens them batch-wide
            adv, self.stats = batch_whitened_advantages(rewards)
            return adv
        adv, self.stats = grpo_advantages(rewards, groups, str(scale))
        return adv


class RLOOAdvantage(_Estimator):
    @hookimpl
    def compute_advantage(self, rewards: Any, groups: list[str], trajectories: list[Any], config: Any) -> Any:
        adv, self.stats = rloo_advantages(rewards, groups)
        return adv


class ReinforcePPAdvantage(_Estimator):
    @hookimpl
    def compute_advantage(self, rewards: Any, groups: list[str], trajectories: list[Any], config: Any) -> Any:
        adv, self.stats = reinforce_pp_advantages(rewards, groups)
        return adv


class GiGPOAdvantage(_Estimator):
    """GiGPO. Options: ``gamma`` (discount of per-turn rewards, 0.95) and ``step_weight`` (weight of
    the step-level advantage, 1.0); unset, they fall back to a config's rlcore 0.1 ``gigpo_gamma`` /
    ``gigpo_step_weight`` attributes, then to those defaults."""

    def __init__(self, config: Any = None, *, gamma: float | None = None, step_weight: float | None = None,
                 **options: Any) -> None:
        super().__init__(config, **options)
        cfg = AdvantageConfig.of(self.config)
        self.gamma = float(_given(gamma, cfg.gigpo_gamma, 0.95))
        self.step_weight = float(_given(step_weight, cfg.gigpo_step_weight, 1.0))

    @hookimpl
    def compute_advantage(self, rewards: Any, groups: list[str], trajectories: list[Any], config: Any) -> Any:
        adv, self.stats = gigpo_advantages(
            rewards,
            groups,
            trajectories,
            gamma=self.gamma,
            step_weight=self.step_weight,
            scale_rewards=str(self._scale(AdvantageConfig.of(self.config))),
        )
        return adv


def _given(*values: Any) -> Any:
    """The first value that is not ``None``."""
    return next(v for v in values if v is not None)
