"""Policy losses of the GRPO family, one signature for all (and for third-party ones):

    loss(logps, old_logps, advantages, mask, *, ref_logps=None, sampler_logps=None, is_valid=None, config)
        -> (scalar loss, metrics dict of floats)

``logps``/``old_logps``/``ref_logps``/``sampler_logps``/``mask`` are ``[B, T]`` over the completion
positions; ``advantages`` is ``[B]`` (sequence-level) or ``[B, T]`` (step-level estimators);
``old_logps`` is ``None`` when the rollout policy is the current one (one pass, μ=1), in which case
the ratio is 1 but its gradient is the policy gradient. ``config`` is a :class:`LossConfig` (or any
object with the same attributes).

The normalisations follow TRL's ``loss_type`` so numbers are comparable:

=========  ==================================================================================
grpo       mean over each sequence's tokens, then mean over sequences
bnpo       sum over all tokens / number of active tokens in the mini-batch
dr_grpo    sum over all tokens / (sequences × max_completion_length)
dapo       sum over all tokens / active tokens of the whole generation batch (``num_items``)
gspo       one importance ratio per sequence (geometric mean of token ratios), grpo normalisation
cispo      REINFORCE weighted by the clipped, detached ratio (ε_max = ``epsilon_high``); dapo norm.
sapo       soft sigmoid gate instead of a hard clip (temperatures by advantage sign); grpo norm.
luspo      clipped surrogate summed over each sequence's tokens, mean over sequences (TRL 1.16)
vespo      REINFORCE scaled by a detached gamma weight φ(w) of the sequence ratio w (TRL 1.16
           ``get_gamma_weights``: φ(w) = e^λ w^k e^(-λw), k/λ by advantage sign); dapo norm.
=========  ==================================================================================

A loss declares its own knobs as ``loss.options = {name: default}`` (``sapo`` declares
``sapo_temperature_pos``/``_neg``, ``vespo`` its four ``vespo_*`` — TRL's names); the run sets them with
``loss_options`` (or ``--NAME VALUE`` on the command line, or a GRPOConfig field of the same name,
which is how TRL's ``sapo_temperature_*``/``vespo_*`` fields reach them) and the loss reads them as
``config.NAME``. The knobs every loss here shares are :class:`LossConfig`'s attributes.

``importance_sampling_level="sequence"`` (TRL's GSPO switch) makes every loss use one ratio per
sequence — the mean of its token log-ratios — as in TRL, where it applies to all loss types;
``gspo`` is ``grpo`` at sequence level. With ``beta`` > 0 the k3 KL term is multiplied by the
ratio (TRL's ``use_bias_correction_kl``, default on).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import attrs
import torch

from ..protocols import OPTIONS_ATTR, declared_options
from .is_correction import importance_weights

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo", "luspo", "vespo")
_CLIPPED = ("grpo", "bnpo", "dr_grpo", "dapo", "gspo", "luspo")


#: the options the built-in losses declare (``loss.options``), under TRL's GRPOConfig names
SAPO_OPTIONS: dict[str, Any] = {"sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05}
VESPO_OPTIONS: dict[str, Any] = {"vespo_k_pos": 2.0, "vespo_lambda_pos": 3.0, "vespo_k_neg": 3.0, "vespo_lambda_neg": 2.0}


@attrs.define(init=False)
class LossConfig:
    """What a loss reads: the knobs every GRPO-family loss shares (clip range, KL, importance
    correction, normalisation) as attributes, plus ``options`` — the chosen loss's own knobs
    (declared by the loss as ``loss.options``), also readable as attributes (``cfg.sapo_temperature_pos``).

    Built from a :class:`~rlcore.training.config.GRPOConfig` with :meth:`from_args`; ``num_items``
    is set by the trainer per generation batch (for dapo/cispo/vespo). ``LossConfig(epsilon=0.1,
    my_knob=3)`` puts unknown keywords into ``options``.
    """

    epsilon: float = 0.2
    epsilon_high: float | None = None
    delta: float | None = None
    beta: float = 0.0
    max_completion_length: int = 256
    is_correction: str | None = None
    is_threshold: float = 3.0
    is_min_threshold: float | None = None
    num_items: float | None = None
    importance_sampling_level: str = "token"
    use_bias_correction_kl: bool = True
    off_policy_mask_threshold: float | None = None
    opd_coef: float = 0.0
    options: dict[str, Any] = attrs.field(factory=dict)

    def __init__(self, options: Mapping[str, Any] | None = None, **values: Any) -> None:
        shared = _shared_fields()
        opts = dict(options or {})
        opts.update({k: v for k, v in values.items() if k not in shared})
        self.__attrs_init__(**{k: v for k, v in values.items() if k in shared}, options=opts)

    def __getattr__(self, name: str) -> Any:
        """A loss's own knob: ``options``, else a built-in loss's declared default (so code written
        when LossConfig listed every built-in's knobs keeps reading them)."""
        if name.startswith("__") or name == "options":
            raise AttributeError(name)
        opts = object.__getattribute__(self, "options")
        if name in opts:
            return opts[name]
        if name in _BUILTIN_DEFAULTS:
            return _BUILTIN_DEFAULTS[name]
        raise AttributeError(f"LossConfig has no knob {name!r} (options: {', '.join(sorted(opts)) or 'none'})")

    @property
    def epsilon_low(self) -> float:
        return self.epsilon

    @property
    def eps_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @classmethod
    def from_args(cls, args: Any, **overrides: Any) -> "LossConfig":
        """The shared knobs from ``args`` (a GRPOConfig or anything with those attributes), and the
        chosen loss's options: its declared defaults < a GRPOConfig field of the same name (TRL's
        ``sapo_temperature_*``, ``vespo_*``) < ``args.loss_options`` < ``overrides``."""
        values = {name: getattr(args, name) for name in _shared_fields() if hasattr(args, name)}
        values["options"] = loss_options(args)
        values.update(overrides)
        return cls(**values)


def _shared_fields() -> set[str]:
    return {f.name for f in attrs.fields(LossConfig)} - {"options"}


def loss_options(args: Any, loss: Any = None) -> dict[str, Any]:
    """The options the run's loss gets: what it declares (defaults), overridden by ``args``
    attributes of the same name, then by ``args.loss_options``. ``loss`` defaults to the one
    ``args.loss_type`` names; a config without ``loss_type`` gets the built-ins' knobs."""
    if loss is None:
        name = getattr(args, "loss_type", None)
        if name is not None:
            from ..plugins import get

            loss = get("loss", str(name))
    declared = declared_options(loss) if loss is not None else dict(_BUILTIN_DEFAULTS)
    out = {k: getattr(args, k, v) for k, v in declared.items()}
    out.update(getattr(args, "loss_options", None) or {})
    return out


#: losses whose batch value is a mean over active tokens (bnpo's own, or TRL's generation-batch
#: normaliser); the others average over sequences — what decides how ranks' values combine
TOKEN_NORMALISED = ("bnpo", "dapo", "cispo", "vespo", "opd")


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    if x.shape[-1] == 1 and mask.shape[-1] != 1:
        rows = mask.sum(-1) > 0
        return float(x.squeeze(-1)[rows].float().mean()) if rows.any() else 0.0
    denom = mask.sum()
    return float((x * mask).sum() / denom) if denom > 0 else 0.0


def _policy_loss(
    kind: str,
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logps: torch.Tensor | None,
    sampler_logps: torch.Tensor | None,
    is_valid: torch.Tensor | None,
    config: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    cfg = config if isinstance(config, LossConfig) else LossConfig.from_args(config)
    mask = mask.to(logps.dtype)
    old = logps.detach() if old_logps is None else old_logps
    adv = advantages.to(logps.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(1)
    log_ratio = logps - old
    token_log_ratio = log_ratio
    if kind == "gspo" or cfg.importance_sampling_level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    ratio = torch.exp(log_ratio)
    metrics: dict[str, float] = {}
    eps_low, eps_high = cfg.epsilon_low, cfg.eps_high

    if kind == "cispo":
        weight = torch.clamp(ratio, max=eps_high).detach()
        per_token = -weight * adv * logps
        metrics["clip_ratio/high"] = _masked_mean(((ratio > eps_high) & (adv > 0)).to(logps.dtype).expand_as(mask), mask)
        metrics["clip_ratio/low"] = 0.0
        metrics["cispo_clip_ratio"] = metrics["clip_ratio/high"]
    elif kind == "sapo":
        temp = torch.where(adv > 0, torch.full_like(adv, cfg.sapo_temperature_pos), torch.full_like(adv, cfg.sapo_temperature_neg))
        gate = torch.sigmoid(temp * (ratio - 1.0)) * 4.0 / temp
        per_token = -gate * adv
        metrics["clip_ratio/low"] = 0.0
        metrics["clip_ratio/high"] = 0.0
    elif kind == "vespo":
        phi = _gamma_weights(adv, token_log_ratio, mask, cfg)
        per_token = -phi * adv * logps
        metrics["clip_ratio/low"] = 0.0
        metrics["clip_ratio/high"] = 0.0
        metrics["vespo/phi_seq_mean"] = float(phi.mean())
    else:  # grpo, bnpo, dr_grpo, dapo, gspo, luspo: PPO-style clipped surrogate
        clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
        unclipped = ratio if cfg.delta is None else torch.clamp(ratio, max=cfg.delta)
        per_token = -torch.min(unclipped * adv, clipped * adv)
        low = ((ratio < 1.0 - eps_low) & (adv < 0)).to(logps.dtype)
        high = ((ratio > 1.0 + eps_high) & (adv > 0)).to(logps.dtype)
        metrics["clip_ratio/low"] = _masked_mean(low.expand_as(mask) if low.shape[-1] == 1 else low, mask)
        metrics["clip_ratio/high"] = _masked_mean(high.expand_as(mask) if high.shape[-1] == 1 else high, mask)
        # TRL's names (and its per-sequence extremes) beside rlcore's
        metrics["clip_ratio/low_mean"] = metrics["clip_ratio/low"]
        metrics["clip_ratio/high_mean"] = metrics["clip_ratio/high"]
        metrics["clip_ratio/region_mean"] = metrics["clip_ratio/low"] + metrics["clip_ratio/high"]
        metrics["clip_ratio/low_min"] = _seq_extreme(low, mask, min)
        metrics["clip_ratio/high_max"] = _seq_extreme(high, mask, max)
    per_token = per_token.expand_as(mask) if per_token.shape != mask.shape else per_token

    if cfg.off_policy_mask_threshold is not None:
        keep = off_policy_mask(adv, logps, sampler_logps, old, mask, cfg.off_policy_mask_threshold, is_valid)
        per_token = per_token * keep
        metrics["off_policy_mask/dropped_frac"] = _masked_mean((1.0 - keep).expand_as(mask), mask)  # share of trained tokens

    if cfg.is_correction and sampler_logps is not None:
        weights, is_stats = importance_weights(
            old, sampler_logps, mask, mode=cfg.is_correction, threshold=cfg.is_threshold,
            min_threshold=cfg.is_min_threshold, is_valid=is_valid,
        )
        per_token = per_token * weights
        metrics.update(is_stats)

    if cfg.beta != 0.0:
        if ref_logps is None:
            raise ValueError("beta != 0 needs ref_logps (the reference model's logprobs)")
        d = ref_logps - logps
        kl = torch.exp(d) - d - 1.0  # k3: unbiased, always >= 0
        if cfg.use_bias_correction_kl:  # TRL: the KL of samples from the old policy, reweighted
            kl = kl * ratio
        per_token = per_token + cfg.beta * kl
        metrics["kl"] = _masked_mean(kl.detach(), mask)

    masked = per_token * mask
    if kind in ("grpo", "gspo", "sapo"):
        loss = (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif kind == "luspo":
        loss = masked.sum(-1).mean()
    elif kind == "bnpo":
        loss = masked.sum() / mask.sum().clamp(min=1.0)
    elif kind == "dr_grpo":
        loss = masked.sum() / (mask.shape[0] * cfg.max_completion_length)
    else:  # dapo, cispo, vespo
        denom = cfg.num_items if cfg.num_items is not None else mask.sum()
        loss = masked.sum() / max(float(denom), 1.0)
    metrics["clip_ratio/region"] = metrics["clip_ratio/low"] + metrics["clip_ratio/high"]
    metrics["policy_loss"] = float(loss.detach())
    return loss, metrics


@torch.no_grad()
def off_policy_mask(adv: torch.Tensor, logps: torch.Tensor, sampler_logps: torch.Tensor | None, old_logps: torch.Tensor,
                    mask: torch.Tensor, threshold: float, is_valid: torch.Tensor | None = None) -> torch.Tensor:
    """Off-policy sequence mask ``[B, 1]`` (``[B, T]`` for step-level advantages) (DeepSeek-V3.2 eq. 9; TRL 1.16 ``GRPOTrainer.get_off_policy_mask``):
    keep a trajectory when its advantage is >= 0 or when the mean over its trained tokens of
    ``log pi_sampler - log pi_current`` is <= ``threshold``; drop it (0) otherwise.

    Why the sampler's logprobs: they measure both drifts — the policy moving since the rollout and
    the sampler computing another distribution than the trainer (vLLM, a quantised copy). TRL uses
    them when its generator reports them and the old policy's otherwise; rlcore's samplers always
    report them, so a row falls back to ``old_logps`` (the rollout-time policy, or the current one on
    policy) only where its sampler logprobs are incomplete (``is_valid`` False). Gradients never flow
    through the mask. Unlike ``is_correction='sequence_mask'`` (which drops a trajectory whose
    sampler/trainer *ratio at rollout time* leaves a band, whatever its advantage), this compares with
    the *current* policy and drops only negative-advantage trajectories.
    """
    mask = mask.to(logps.dtype)
    ref = old_logps if sampler_logps is None else sampler_logps.to(logps.dtype)
    if sampler_logps is not None and is_valid is not None:
        ref = torch.where(is_valid.to(torch.bool).view(-1, 1), ref, old_logps)
    kl = torch.nan_to_num(ref - logps.detach(), nan=0.0)
    seq_kl = (kl * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
    return ((adv >= 0) | (seq_kl <= threshold)).to(logps.dtype)  # step-level [B, T] advantages: per token, as TRL


def _seq_extreme(x: torch.Tensor, mask: torch.Tensor, pick: Any) -> float:
    """Smallest/largest per-sequence mean of ``x`` (TRL's ``clip_ratio/low_min`` and ``/high_max``)."""
    rows = mask.sum(-1) > 0
    if not rows.any():
        return 0.0
    per_seq = x.squeeze(-1) if x.shape[-1] == 1 else (x * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return float(pick(per_seq[rows].tolist()))


@torch.no_grad()
def _gamma_weights(adv: torch.Tensor, token_log_ratio: torch.Tensor, mask: torch.Tensor, cfg: Any) -> torch.Tensor:
    """VESPO's detached per-sequence weight φ(w) = exp(λ + k·log w − λ·w), w the *summed* sequence
    ratio, k and λ by advantage sign (the formula of TRL 1.16 ``GRPOTrainer.get_gamma_weights``)."""
    floor = math.log(1e-8)
    seq = (torch.clamp(token_log_ratio, -20.0, 20.0) * mask).sum(-1, keepdim=True)
    log_w = torch.clamp(seq, floor, 20.0)
    w = torch.exp(log_w)
    a = adv if adv.shape[-1] == 1 else adv[:, :1]
    nonneg = a >= 0
    k = torch.where(nonneg, torch.full_like(a, cfg.vespo_k_pos), torch.full_like(a, cfg.vespo_k_neg))
    lam = torch.where(nonneg, torch.full_like(a, cfg.vespo_lambda_pos), torch.full_like(a, cfg.vespo_lambda_neg)).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * w).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def _make(kind: str, options: Mapping[str, Any] | None = None) -> Callable[..., tuple[torch.Tensor, dict[str, float]]]:
    def loss(
        logps: torch.Tensor,
        old_logps: torch.Tensor | None,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        ref_logps: torch.Tensor | None = None,
        sampler_logps: torch.Tensor | None = None,
        is_valid: torch.Tensor | None = None,
        config: Any,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        return _policy_loss(kind, logps, old_logps, advantages, mask, ref_logps, sampler_logps, is_valid, config)

    loss.__name__ = f"{kind}_loss"
    loss.__qualname__ = loss.__name__
    loss.__doc__ = f"The ``{kind}`` policy loss (see :mod:`rlcore.algorithms.losses`)."
    setattr(loss, OPTIONS_ATTR, dict(options or {}))  # its own knobs: name -> default
    return loss


grpo_loss = _make("grpo")
bnpo_loss = _make("bnpo")
dr_grpo_loss = _make("dr_grpo")
dapo_loss = _make("dapo")
gspo_loss = _make("gspo")
cispo_loss = _make("cispo")
sapo_loss = _make("sapo", SAPO_OPTIONS)
luspo_loss = _make("luspo")
vespo_loss = _make("vespo", VESPO_OPTIONS)

def opd_term(logps: torch.Tensor, teacher_logps: torch.Tensor, mask: torch.Tensor,
             rollout_logps: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
    """On-policy distillation on the sampled tokens (TRL 1.16 ``trl/experimental/iw_opd/iw_opd_trainer.py``
    ``_compute_iw_opd_loss`` with ``iw_opd_gamma`` 0, the plain estimator): a detached per-token
    advantage ``A = log p_teacher(t) - log p_rollout(t)`` (minus the reverse KL's estimate; the rollout
    policy's logprobs are ``rollout_logps``, else the student's own), loss ``-log p_student(t) × A``
    summed over the active tokens / their number. Its gradient is the score-function gradient of
    ``KL(student || teacher)`` on the student's own samples. Returns the loss and the mean per-token
    reverse KL ``log p_student - log p_teacher`` (``opd/reverse_kl``)."""
    m = mask.to(logps.dtype)
    rollout = logps if rollout_logps is None else rollout_logps
    adv = ((teacher_logps - rollout) * m).detach()
    n = m.sum().clamp(min=1.0)
    loss = (-logps * adv * m).sum() / n
    reverse_kl = float(((logps.detach() - teacher_logps) * m).sum() / n)
    return loss, reverse_kl


def opd_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logps: torch.Tensor | None = None,
    sampler_logps: torch.Tensor | None = None,
    is_valid: torch.Tensor | None = None,
    config: Any,
    teacher_logps: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The ``opd`` loss: on-policy distillation alone (:func:`opd_term`; the advantages are not used).
    It needs the teacher's logprobs of the batch (``teacher_model``)."""
    if teacher_logps is None:
        from ..errors import ConfigError

        raise ConfigError("loss_type='opd' needs a teacher: set teacher_model (a path, hub id or .gguf file; rlcore.loop.Policy: teacher=)")
    loss, rkl = opd_term(logps, teacher_logps, mask, old_logps)
    return loss, {"opd/reverse_kl": rkl}


opd_loss.uses_teacher = True  # type: ignore[attr-defined]  # batch_loss hands it teacher_logps
setattr(opd_loss, OPTIONS_ATTR, {})

#: every built-in loss's declared default (what a bare ``LossConfig()`` answers for them)
_BUILTIN_DEFAULTS: dict[str, Any] = {**SAPO_OPTIONS, **VESPO_OPTIONS}
