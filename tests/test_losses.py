"""Every built-in loss against a plainly written per-token reference (python loops, math module)."""

from __future__ import annotations

import math

import pytest
import torch

import rlcore
from rlcore.algorithms.losses import LossConfig

B, T = 5, 7


def _inputs(seed: int, per_token_adv: bool = False):
    g = torch.Generator().manual_seed(seed)
    logps = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    old = logps + (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5) * 0.8
    ref = logps + (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5) * 0.6
    samp = old + (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5) * 1.5
    adv = torch.randn(B, T, generator=g, dtype=torch.float64) if per_token_adv else torch.randn(B, generator=g, dtype=torch.float64)
    lengths = [T, 3, 0, 5, 1]  # row 2 has no completion tokens at all
    mask = torch.zeros(B, T, dtype=torch.float64)
    for i, n in enumerate(lengths):
        mask[i, T - n :] = 1.0 if n else 0.0
    valid = torch.tensor([True, False, True, True, True])
    return logps, old, ref, samp, adv, mask, valid


def _is_weight(kind: str, old, samp, mask, i: int, t: int, thr: float, valid) -> float:
    if kind is None or not bool(valid[i]):
        return 1.0
    if kind.startswith("token"):
        r = math.exp(float(old[i, t] - samp[i, t]))
    else:
        r = math.exp(sum(float(old[i, s] - samp[i, s]) for s in range(T) if mask[i, s]))
    if kind.endswith("truncate"):
        return min(r, thr)
    return 0.0 if r > thr else r


def reference(kind, logps, old, ref, samp, adv, mask, valid, cfg: LossConfig) -> float:
    eps_lo, eps_hi = cfg.epsilon, cfg.eps_high
    per = [[0.0] * T for _ in range(B)]
    for i in range(B):
        n_i = sum(int(mask[i, t]) for t in range(T))
        seq_lr = sum(float(logps[i, t] - old[i, t]) for t in range(T) if mask[i, t]) / max(n_i, 1)
        for t in range(T):
            a = float(adv[i, t]) if adv.dim() == 2 else float(adv[i])
            seq_level = kind == "gspo" or cfg.importance_sampling_level == "sequence"
            lr = seq_lr if seq_level else float(logps[i, t] - old[i, t])
            r = math.exp(lr)
            if kind == "vespo":  # TRL 1.16 get_gamma_weights: w = exp(sum of token log-ratios)
                log_w = max(min(sum(float(logps[i, s] - old[i, s]) for s in range(T) if mask[i, s]), 20.0), math.log(1e-8))
                a0 = float(adv[i, 0]) if adv.dim() == 2 else float(adv[i])
                k, lam = (cfg.vespo_k_pos, cfg.vespo_lambda_pos) if a0 >= 0 else (cfg.vespo_k_neg, cfg.vespo_lambda_neg)
                v = -math.exp(lam + k * log_w - lam * math.exp(log_w)) * a * float(logps[i, t])
            elif kind == "cispo":
                v = -min(r, eps_hi) * a * float(logps[i, t])
            elif kind == "sapo":
                tau = cfg.sapo_temperature_pos if a > 0 else cfg.sapo_temperature_neg
                v = -(1 / (1 + math.exp(-tau * (r - 1)))) * 4 / tau * a
            else:
                c = min(max(r, 1 - eps_lo), 1 + eps_hi)
                u = r if cfg.delta is None else min(r, cfg.delta)
                v = -min(u * a, c * a)
            v *= _is_weight(cfg.is_correction, old, samp, mask, i, t, cfg.is_threshold, valid)
            if cfg.beta:
                d = float(ref[i, t] - logps[i, t])
                v += cfg.beta * (math.exp(d) - d - 1) * (r if cfg.use_bias_correction_kl else 1.0)
            per[i][t] = v
    if kind in ("grpo", "gspo", "sapo"):
        tot = 0.0
        for i in range(B):
            n_i = sum(int(mask[i, t]) for t in range(T))
            tot += sum(per[i][t] for t in range(T) if mask[i, t]) / max(n_i, 1)
        return tot / B
    if kind == "luspo":
        return sum(sum(per[i][t] for t in range(T) if mask[i, t]) for i in range(B)) / B
    s = sum(per[i][t] for i in range(B) for t in range(T) if mask[i, t])
    n = sum(int(mask[i, t]) for i in range(B) for t in range(T))
    if kind == "bnpo":
        return s / max(n, 1)
    if kind == "dr_grpo":
        return s / (B * cfg.max_completion_length)
    return s / max(cfg.num_items if cfg.num_items is not None else n, 1)


CONFIGS = [
    LossConfig(),
    LossConfig(epsilon=0.1, epsilon_high=0.28, beta=0.04, max_completion_length=11),
    LossConfig(epsilon=0.2, delta=1.3, is_correction="token_truncate", is_threshold=1.5),
    LossConfig(is_correction="token_mask", is_threshold=1.4, num_items=13),
    LossConfig(is_correction="sequence_truncate", is_threshold=1.2, beta=0.1),
    LossConfig(is_correction="sequence_mask", is_threshold=1.6, epsilon_high=5.0),
    LossConfig(importance_sampling_level="sequence", beta=0.05, num_items=9),
    LossConfig(beta=0.05, use_bias_correction_kl=False, vespo_k_pos=1.5, vespo_lambda_neg=1.0),
]


@pytest.mark.parametrize("kind", ["grpo", "bnpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo", "luspo", "vespo"])
@pytest.mark.parametrize("ci", range(len(CONFIGS)))
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_loss_matches_reference(kind: str, ci: int, per_token_adv: bool) -> None:
    cfg = CONFIGS[ci]
    logps, old, ref, samp, adv, mask, valid = _inputs(seed=ci * 7 + len(kind), per_token_adv=per_token_adv)
    fn = rlcore.get("loss", kind)
    loss, metrics = fn(logps, old, adv, mask, ref_logps=ref, sampler_logps=samp, is_valid=valid, config=cfg)
    expected = reference(kind, logps, old, ref, samp, adv, mask, valid, cfg)
    assert abs(float(loss) - expected) < 1e-6, (kind, float(loss), expected)
    assert math.isfinite(metrics["policy_loss"])
    if cfg.beta:
        assert metrics["kl"] >= 0


@pytest.mark.parametrize("kind", ["grpo", "bnpo", "dr_grpo", "dapo", "gspo", "sapo"])
def test_on_policy_gradient_is_policy_gradient(kind: str) -> None:
    """With old_logps=None the ratio is 1, and d loss / d logp equals -A / normaliser on each token."""
    logps, _, _, _, adv, mask, _ = _inputs(3)
    logps = logps.clone().requires_grad_(True)
    loss, _ = rlcore.get("loss", kind)(logps, None, adv, mask, config=LossConfig(max_completion_length=T))
    loss.backward()
    grad = logps.grad
    assert torch.all(grad[mask == 0] == 0)
    # grpo-style: -A_i / (n_i * B); token-level: -A_i / N
    n = mask.sum(-1)
    for i in range(B):
        for t in range(T):
            if not mask[i, t]:
                continue
            a = float(adv[i])
            if kind in ("grpo", "gspo"):
                want = -a / (float(n[i]) * B)
            elif kind == "sapo":
                want = -a / (float(n[i]) * B)  # sigmoid'(0)*4 = 1
            elif kind == "dr_grpo":
                want = -a / (B * T)
            else:
                want = -a / float(mask.sum())
            assert abs(float(grad[i, t]) - want) < 1e-9


def test_clip_metrics_count_clipped_tokens() -> None:
    logps = torch.zeros(1, 4, dtype=torch.float64)
    old = torch.log(torch.tensor([[1 / 1.5, 1 / 0.5, 1.0, 1 / 1.5]], dtype=torch.float64))  # ratios 1.5, .5, 1, 1.5
    adv = torch.tensor([1.0], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.float64)
    _, m = rlcore.get("loss", "grpo")(logps, old, adv, mask, config=LossConfig(epsilon=0.2))
    assert m["clip_ratio/high"] == pytest.approx(0.5)
    assert m["clip_ratio/low"] == 0.0
    _, m = rlcore.get("loss", "grpo")(logps, old, -adv, mask, config=LossConfig(epsilon=0.2))
    assert m["clip_ratio/low"] == pytest.approx(0.25)


def test_beta_without_reference_is_an_error() -> None:
    logps, old, _, _, adv, mask, _ = _inputs(1)
    with pytest.raises(ValueError, match="ref_logps"):
        rlcore.get("loss", "grpo")(logps, old, adv, mask, config=LossConfig(beta=0.1))


def test_all_masked_batch_gives_zero_loss() -> None:
    logps, old, _, _, adv, mask, _ = _inputs(2)
    for kind in ("grpo", "bnpo", "dapo", "dr_grpo", "gspo", "cispo", "sapo"):
        loss, _ = rlcore.get("loss", kind)(logps, old, adv, torch.zeros_like(mask), config=LossConfig())
        assert float(loss) == 0.0
