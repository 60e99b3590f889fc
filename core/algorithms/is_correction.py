"""Rollout importance-sampling correction: the sampler (vLLM, a server, a quantised copy) and the
trainer do not compute exactly the same distribution, so tokens sampled by one are reweighted by
``pi_trainer / pi_sampler`` before they train the other.

Four modes, named as TRL names them: ``token_truncate`` / ``token_mask`` use one ratio per token,
``sequence_truncate`` / ``sequence_mask`` one per trajectory (the product of its token ratios).
``*_truncate`` caps the ratio at ``threshold``; ``*_mask`` zeroes tokens (or whole trajectories)
whose ratio is above ``threshold`` or below ``min_threshold`` (when given).

A trajectory whose sampler logprobs are incomplete (``is_valid`` False) gets weight 1: a missing
logprob must switch correction off for that row, never be read as a zero.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import ConfigError

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def importance_weights(
    trainer_logps: torch.Tensor,
    sampler_logps: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str = "token_truncate",
    threshold: float = 3.0,
    min_threshold: float | None = None,
    is_valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Detached weights ``[B, T]`` (token modes) or ``[B, 1]`` (sequence modes) and their stats.

    ``trainer_logps`` are the trainer's logprobs of the sampled tokens at rollout time (the old
    policy); gradients never flow through the weights.
    """
    if mode not in MODES:
        raise ConfigError(f"importance-sampling mode {mode!r} is not one of {', '.join(MODES)}")
    mask = mask.to(trainer_logps.dtype)
    diff = torch.nan_to_num((trainer_logps.detach() - sampler_logps.detach()) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        weight = torch.clamp(ratio, max=threshold) if min_threshold is None else torch.clamp(ratio, min=min_threshold, max=threshold)
        dropped = torch.zeros_like(ratio, dtype=torch.bool)
    else:
        low = -float("inf") if min_threshold is None else min_threshold
        dropped = (ratio > threshold) | (ratio < low)
        weight = ratio.masked_fill(dropped, 0.0)
    if is_valid is not None:
        valid = is_valid.to(torch.bool).view(-1, 1)
        weight = torch.where(valid, weight, torch.ones_like(weight))
        dropped = dropped & valid
    return weight.detach(), _stats(ratio, dropped, mask, is_valid)


def _stats(ratio: torch.Tensor, dropped: torch.Tensor, mask: torch.Tensor, is_valid: Any) -> dict[str, float]:
    """Mean/min/max of the raw ratio over corrected tokens (or rows) and the fraction dropped."""
    if ratio.shape[-1] == 1:
        sel = torch.ones(ratio.shape[0], dtype=torch.bool, device=ratio.device)
        sel = sel & (mask.sum(-1) > 0)
        values = ratio.squeeze(-1)
        drop = dropped.squeeze(-1)
    else:
        sel = mask > 0
        values = ratio
        drop = dropped
    if is_valid is not None:
        rows = is_valid.to(torch.bool)
        sel = sel & (rows if values.dim() == 1 else rows.view(-1, 1))
    v = values[sel]
    if v.numel() == 0:
        return {"is_ratio/mean": 1.0, "is_ratio/min": 1.0, "is_ratio/max": 1.0, "is_ratio/dropped_frac": 0.0}
    return {
        "is_ratio/mean": float(v.mean()),
        "is_ratio/min": float(v.min()),
        "is_ratio/max": float(v.max()),
        "is_ratio/dropped_frac": float(drop[sel].float().mean()),
    }
