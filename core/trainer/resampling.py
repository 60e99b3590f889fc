"""Dynamic sampling (DAPO) in the trainer: rounds of prompts until the generation batch has
``prompts_per_generation`` groups with reward spread (:func:`dynamic_sampling_rounds`), and the
streak of steps it had to skip (:class:`SkipStreak`, saved in checkpoints), which stops the run
after ``failure_patience`` of them. The group filter itself is :mod:`rlcore.training.dynamic_sampling`."""

from __future__ import annotations

import logging
import time
from typing import Any

from ..algorithms.advantages import AdvantageStats
from ..errors import RunFailedError
from ..training.data_parallel import WholeBatch, gather_objects, whole_batch, world
from ..training.dynamic_sampling import DynamicSampling, stop_line
from ..types import Trajectory
from .scored import Rollout, ScoredBatch

logger = logging.getLogger(__name__)


def dynamic_sampling_rounds(trainer: Any) -> tuple[ScoredBatch, float]:
    """Draw, roll out and score rounds of prompts until the batch has ``prompts_per_generation``
    groups with reward spread (or ``max_resample_rounds`` extra rounds are spent). Every rank
    decides from every rank's groups, so all keep the same groups, and each trains its
    ``world_size``-th share of them (the batch shape one process would have, cut alike).

    Returns the scored batch (``whole``: the kept groups, every rank's; ``generated``: every
    round's trajectories, for the metrics; ``sampling``: the step's bookkeeping) and the seconds
    spent rolling out. The trainer's ``rollout`` draws the first round, ``_rollout_refill`` the
    others; ``_rounds_done`` is called when the rounds are over (the Ray trainer then prefetches)."""
    a = trainer.args
    rank, size = world()
    ds = DynamicSampling(a.prompts_per_generation, a.max_resample_rounds, a.min_groups, a.dynamic_sampling_metric)
    generated: list[Trajectory] = []
    names: list[str] = []
    errors: dict[str, float] = {}
    t_rollout = 0.0
    violations, check_s = 0, 0.0  # every round's invariant violations and check time
    while (n := ds.next_draw()):
        t1 = time.perf_counter()
        prompts = trainer._next_prompts(n)
        rollout = Rollout.of(trainer.rollout(prompts) if ds.rounds == 0 else trainer._rollout_refill(prompts))
        t_rollout += time.perf_counter() - t1
        violations += rollout.invariant_violations
        check_s += rollout.invariant_check_s
        columns, round_errors = trainer._reward_columns(rollout)
        for k, v in round_errors.items():
            errors[k] = errors.get(k, 0.0) + v
        trainer._observe_prompts(rollout)  # a filtered group still tells the prompt sampler how its prompt scored
        whole = whole_batch(rollout, columns)
        names.extend(c for c in whole.columns if c not in names)
        # draw order: rank r rolled out prompts r, r + size, r + 2·size … of the round
        parts = gather_objects([t.group_id or t.uuid for t in rollout])
        where: dict[str, tuple[int, int]] = {}
        for r, gids in enumerate(parts):
            for j, g in enumerate(dict.fromkeys(gids)):
                where.setdefault(g, (j * size + r, r))
        ordered = sorted(whole.trajectories, key=lambda t: where.get(t.group_id or t.uuid, (1 << 30, 0)))
        ds.add(ordered, drawn=n)
        generated.extend(whole.trajectories)
    trainer._rounds_done()
    groups = ds.take()
    shares = [groups[r::size] for r in range(size)]
    kept: list[Trajectory] = []
    start = stop = 0
    for r, share in enumerate(shares):
        if r == rank:
            start = len(kept)
        kept.extend(t for g in share for t in g)
        if r == rank:
            stop = len(kept)

    def cols(trajs: list[Trajectory]) -> dict[str, list[float | None]]:
        return {c: [t.rewards.get(c) for t in trajs] for c in names}

    kept_batch = WholeBatch(kept, cols(kept), start, stop)
    advantages, stats = trainer._advantages(kept_batch) if kept else ([], AdvantageStats(groups=0))
    mine = [t for g in shares[rank] for t in g]
    scored = ScoredBatch(mine, kept_batch.local(advantages), cols(mine), kept_batch, advantages, stats, errors,
                         violations, check_s, generated=WholeBatch(generated, cols(generated), 0, 0), sampling=ds)
    return scored, t_rollout


def _fresh() -> dict[str, Any]:
    return {"steps": 0, "rounds": 0, "groups": 0, "spread": 0, "values": [], "flat": None}


class SkipStreak:
    """Steps dynamic sampling skipped in a row, and what their groups scored (the checkpoint's
    ``dynamic_sampling`` entry)."""

    def __init__(self) -> None:
        self.state = _fresh()

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = {**_fresh(), **state}

    def verdict(self, ds: DynamicSampling, metrics: dict[str, float], args: Any, step: int, reward_names: list[str]) -> None:
        """Count a skipped step (``dynamic_sampling/skipped_in_a_row`` in ``metrics``), reset on a
        trained one; ``failure_patience`` skipped steps in a row stop the run with one line naming
        the reward that gave every group one score. ``step`` is the optimizer steps done."""
        if not ds.short:
            self.state = _fresh()
            return
        k = self.state
        k["steps"] += 1
        k["rounds"] += ds.rounds
        k["groups"] += ds.generated_groups
        k["spread"] += len(ds.kept)
        k["values"] = sorted(set(k["values"]) | ds.flat_values)[:16]
        flat = ds.flat_columns or []
        k["flat"] = flat if k["flat"] is None else [c for c in k["flat"] if c in flat]
        metrics["dynamic_sampling/skipped_in_a_row"] = float(k["steps"])
        if k["steps"] >= args.failure_patience:
            raise RunFailedError(stop_line(k["flat"], args.dynamic_sampling_metric, k["values"], k["rounds"],
                                           k["steps"], k["groups"], args.max_resample_rounds, spread=k["spread"],
                                           min_groups=args.min_groups, gens=args.num_generations,
                                           reward_names=reward_names))
        logger.warning("dynamic sampling: %d of %d groups had reward spread after %d rounds, fewer than min_groups=%d; "
                       "step %d is skipped (no update; %d skipped in a row, the run stops at failure_patience=%d)",
                       len(ds.kept), ds.generated_groups, ds.rounds, args.min_groups, step + 1,
                       k["steps"], args.failure_patience)
