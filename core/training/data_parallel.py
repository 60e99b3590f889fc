"""What a data-parallel run must compute over the whole generation batch, not one rank's share.

Each rank of a data-parallel run (``torchrun``, ``accelerate launch``, Ray trainer workers) rolls
out and scores its own prompts, whole groups each. Group-relative advantages only need the group,
but several numbers are batch-wide in TRL's GRPO and must be the same on every rank, and the same as
one process running the whole batch would get:

* advantages whose estimator uses batch statistics (``scale_rewards="batch"``, REINFORCE++'s
  normaliser, a third party's): the estimator sees every rank's trajectories, and each rank keeps
  its own slice (TRL gathers the rewards the same way);
* the token-level losses' normaliser (dapo, cispo, vespo): the active tokens of the whole batch,
  divided by the number of ranks because gradient averaging divides again;
* the logged metrics (reward, lengths, clip ratios …) and the run-health verdict: from the whole
  batch, so rank 0's log speaks for the run and every rank stops (or not) together.

Outside ``torch.distributed`` (or with one rank) every function here is the identity, at no cost.
Other ranks' trajectories travel in their JSON form (:meth:`Trajectory.to_dict`), so whatever a
scheduler put in ``infos`` needs no pickling.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import attrs

from ..types import Trajectory


def world() -> tuple[int, int]:
    """(rank, number of ranks) of the default process group; (0, 1) when there is none."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch without distributed support
        return 0, 1
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return int(dist.get_rank()), int(dist.get_world_size())


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (``[obj]`` outside a process group of several ranks)."""
    rank, size = world()
    if size == 1:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * size
    dist.all_gather_object(out, obj)
    return out


def sum_over_ranks(t: Any) -> Any:
    """Tensor ``t`` summed over the ranks (an all-reduce on its own device: CUDA under NCCL);
    ``t`` itself in one process."""
    rank, size = world()
    if size == 1:
        return t
    import torch.distributed as dist

    t = t.clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_sum(value: float) -> float:
    """``value`` summed over the ranks."""
    return float(sum(gather_objects(float(value))))


def mean_over_ranks(metrics: dict[str, float]) -> dict[str, float]:
    """Each key averaged over the ranks that report it (a rank with nothing to train on in a step
    reports no loss metrics; NaN counts as not reported)."""
    parts = gather_objects(dict(metrics))
    if len(parts) == 1:
        return dict(metrics)
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, (int, float)) and not math.isnan(float(value)):
                sums[key] = sums.get(key, 0.0) + float(value)
                counts[key] = counts.get(key, 0) + 1
    return {key: sums[key] / counts[key] for key in sums}


def weighted_mean_over_ranks(metrics: dict[str, float], weights: dict[str, float]) -> dict[str, float]:
    """Each key averaged over the ranks, rank r weighted by ``weights[key]`` (its tokens or its
    sequences: what the metric is a mean over), so the result is the whole batch's mean. A rank
    with nothing (weight 0, or the key missing) counts for nothing."""
    parts = gather_objects((dict(metrics), dict(weights)))
    sums: dict[str, float] = {}
    totals: dict[str, float] = {}
    for values, w in parts:
        for key, value in values.items():
            weight = float(w.get(key, 0.0))
            if weight > 0 and isinstance(value, (int, float)) and not math.isnan(float(value)):
                sums[key] = sums.get(key, 0.0) + float(value) * weight
                totals[key] = totals.get(key, 0.0) + weight
    return {key: sums[key] / totals[key] for key in sums}


@attrs.define
class WholeBatch:
    """The generation batch of every rank, in rank order, and where this rank's share sits in it."""

    trajectories: list[Trajectory]
    columns: dict[str, list[float | None]]
    start: int
    stop: int

    def local(self, values: Sequence[Any]) -> list[Any]:
        """This rank's share of a per-trajectory list computed over the whole batch."""
        return list(values[self.start:self.stop])


def whole_batch(trajectories: Sequence[Trajectory], columns: dict[str, list[float | None]]) -> WholeBatch:
    """Every rank's trajectories (this rank's are its own objects) and reward columns."""
    mine = list(trajectories)
    rank, size = world()
    if size == 1:
        return WholeBatch(mine, {k: list(v) for k, v in columns.items()}, 0, len(mine))
    parts = gather_objects(([t.to_dict() for t in mine], {k: list(v) for k, v in columns.items()}))
    everyone: list[Trajectory] = []
    names = list(dict.fromkeys(name for _, cols in parts for name in cols))
    merged: dict[str, list[float | None]] = {name: [] for name in names}
    start = 0
    for r, (dicts, cols) in enumerate(parts):
        if r == rank:
            start = len(everyone)
            everyone.extend(mine)
        else:
            everyone.extend(Trajectory.from_dict(d) for d in dicts)
        for name in names:
            merged[name].extend(cols.get(name) or [None] * len(dicts))
    return WholeBatch(everyone, merged, start, start + len(mine))


def _in_flat_buffers(tensors: list[Any], op: Callable[[Any], None]) -> None:
    """Apply the in-place collective ``op`` to ``tensors`` through one flat buffer per dtype and
    device (one call each instead of one per tensor), then copy the results back into them."""
    import torch

    buckets: dict[tuple[Any, Any], list[Any]] = {}
    for t in tensors:
        buckets.setdefault((t.dtype, t.device), []).append(t)
    for group in buckets.values():
        flat = torch.cat([t.detach().reshape(-1) for t in group])
        op(flat)
        offset = 0
        for t in group:
            n = t.numel()
            t.copy_(flat[offset:offset + n].view_as(t))
            offset += n


def allreduce_gradients(model: Any) -> None:
    """Average every trainable parameter's gradient over the default process group, one flat buffer
    per dtype and device (gloo has no AVG: SUM, then divide). A parameter without a gradient on
    this rank contributes zeros, so every rank reduces the same tensors. One call per optimizer
    step, however many backward passes accumulated into it (what DDP's ``no_sync`` buys)."""
    rank, size = world()
    if size == 1:
        return
    import torch
    import torch.distributed as dist

    grads = []
    for p in model.parameters():
        if p.requires_grad:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)

    def average(flat: Any) -> None:
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat.div_(size)

    _in_flat_buffers(grads, average)


def broadcast_module(model: Any, src: int = 0) -> None:
    """Every parameter and buffer of ``model`` made rank ``src``'s (one flat buffer per dtype and
    device): ranks that built the same model with different random parts (LoRA's initialisation)
    start, or restart after a checkpoint only ``src`` read, from one set of weights."""
    rank, size = world()
    if size == 1:
        return
    import torch
    import torch.distributed as dist

    with torch.no_grad():
        _in_flat_buffers([*model.parameters(), *model.buffers()], lambda flat: dist.broadcast(flat, src=src))


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (``obj`` itself in one process)."""
    rank, size = world()
    if size == 1:
        return obj
    import torch.distributed as dist

    box = [obj if rank == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0]


#: how a loss normalises its batch, for data-parallel ranks that each hold part of it: ``num_items``
#: (dapo, cispo, vespo, opd: the whole batch's active tokens, passed in), ``tokens`` (bnpo: the
#: tokens of the call) or ``rows`` (grpo, dr_grpo, gspo, sapo, luspo: a mean over sequences)
LOSS_NORMALISATION = {"dapo": "num_items", "cispo": "num_items", "vespo": "num_items", "opd": "num_items",
                      "bnpo": "tokens"}


def loss_normalisation(loss_fn: Any, name: str | None = None) -> str:
    """``num_items``, ``tokens`` or ``rows`` for a loss function: its ``normalisation`` attribute
    when it declares one (a third party's loss), else by its registered name (see
    :data:`LOSS_NORMALISATION`); a mean over sequences otherwise."""
    declared = getattr(loss_fn, "normalisation", None)
    if declared in ("num_items", "tokens", "rows"):
        return str(declared)
    key = (name or getattr(loss_fn, "__name__", "") or "").removesuffix("_loss")
    return LOSS_NORMALISATION.get(key, "rows")


def reduce_step_metrics(metrics: dict[str, float], *, rows: float, tokens: float, weight: float) -> dict[str, float]:
    """One rank's ``forward_backward`` metrics combined into the whole batch's: ``loss`` and
    ``policy_loss`` add up each rank's share (its value times ``weight``, the fraction of the whole
    batch's normaliser it holds, over the ranks); ``num_tokens`` sums; ``*_min``/``*_max`` take the
    extreme; ``*_seq_mean`` average over sequences (``rows``); the rest over the ranks' tokens."""
    rank, size = world()
    if size == 1:
        return dict(metrics)
    parts = gather_objects((dict(metrics), float(rows), float(tokens), float(weight)))
    keys = list(dict.fromkeys(k for values, *_ in parts for k in values))
    out: dict[str, float] = {}
    for key in keys:
        have = [(float(v[key]), r, t, w) for v, r, t, w in parts
                if key in v and isinstance(v[key], (int, float)) and not math.isnan(float(v[key]))]
        if not have:
            continue
        if key in ("loss", "policy_loss"):
            out[key] = sum(x * w for x, _, _, w in have) / size
        elif key == "num_tokens":
            out[key] = sum(x for x, *_ in have)
        elif key.endswith("_min"):
            out[key] = min(x for x, *_ in have)
        elif key.endswith("_max"):
            out[key] = max(x for x, *_ in have)
        else:
            weights = [(r if key.endswith("_seq_mean") else t) for _, r, t, _ in have]
            total = sum(weights)
            out[key] = sum(x * wt for (x, *_), wt in zip(have, weights)) / total if total > 0 else \
                sum(x for x, *_ in have) / len(have)
    return out
