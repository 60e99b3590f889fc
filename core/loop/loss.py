"""The training-side steps of one GRPO update, shared by :class:`~rlcore.loop.Policy` and
``GRPOTrainer`` (one implementation of each): pack trajectories into a :class:`Batch`, logprobs of a
batch under a model, and the loss plugin on a batch.

Why free functions over a model rather than methods of the trainer: a hand-written loop and the
Trainer subclass then run literally the same code, so their losses and gradients agree to the bit
(``tests/test_loop_equivalence.py`` holds them to it).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..algorithms.entropy import EntropyBonus, entropy_bonus_term
from ..algorithms.logprobs import PaddingFree, completion_logprobs
from ..algorithms.losses import opd_term
from ..types import Batch, Trajectory


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """1 where a token's entropy is at least the ``quantile`` of the active tokens' entropies
    (TRL 1.16 ``get_high_entropy_mask``, per process)."""
    active = entropy[mask.bool()].float()
    if active.numel() == 0:
        return torch.zeros_like(mask)
    threshold = torch.quantile(active, quantile)
    return ((entropy >= threshold) & mask.bool()).to(mask.dtype)


def advantage_list(advantages: Any) -> list[Any]:
    """Advantages as Python values: one float per trajectory or one list per trajectory (step level)."""
    if isinstance(advantages, torch.Tensor):
        return advantages.detach().float().cpu().tolist()
    return [list(a) if isinstance(a, (list, tuple)) else float(a) for a in advantages]


def pack(trajectories: Sequence[Trajectory], advantages: Any, pad_token_id: int, *,
         mask_truncated: bool = False, device: Any = None) -> Batch:
    """Trajectories + advantages -> a :class:`Batch`. Failed trajectories (and truncated ones when
    ``mask_truncated``) stay in the batch with an all-zero completion mask: they do not train."""
    trajs = list(trajectories)
    adv = advantage_list(advantages)
    if len(adv) != len(trajs):
        from ..errors import ConfigError

        raise ConfigError(f"{len(adv)} advantages for {len(trajs)} trajectories; give one per trajectory")
    trajs, adv = expand_turn_samples(trajs, adv)
    batch = Batch.from_trajectories(trajs, adv, pad_token_id)
    for i, t in enumerate(trajs):
        if t.status == "failed" or (mask_truncated and t.status == "truncated"):
            batch.completion_mask[i] = 0
    return batch.to(device) if device is not None else batch


def expand_turn_samples(trajectories: Sequence[Trajectory], advantages: list[Any]) -> tuple[list[Trajectory], list[Any]]:
    """One row per per-turn sample (:meth:`Trajectory.turn_samples`); a trajectory without them is
    one row, as before. Every sample of an episode carries the episode's advantage; a per-token
    advantage list (step-level estimators) is cut along the sample's turns (a sample's prompt
    tokens, the ``"prompt"`` turn, carry none). Failed and truncated episodes mask every sample
    of theirs (the last sample keeps the episode's status; earlier ones a failed episode's)."""
    if not any(t.has_turn_samples for t in trajectories):
        return list(trajectories), list(advantages)
    rows: list[Trajectory] = []
    values: list[Any] = []
    for traj, a in zip(trajectories, advantages):
        samples = traj.turn_samples()
        if isinstance(a, (list, tuple)):
            pos, spans = 0, {}
            for turn in traj.turns:
                spans[id(turn)] = (pos, pos + len(turn.token_ids))
                pos += len(turn.token_ids)
            for s in samples:
                values.append([v for turn in s.turns for v in a[spans[id(turn)][0]:spans[id(turn)][1]]])
        else:
            values.extend([a] * len(samples))
        if traj.status == "truncated":  # the episode was cut: none of its samples counts as complete
            for s in samples:
                s.status = "truncated"
        rows.extend(samples)
    return rows, values


def pad_to_multiple(batch: Batch, multiple: int | None, pad_token_id: int) -> Batch:
    """``batch`` with its sequence length padded on the right to a multiple of ``multiple`` (TRL's
    ``pad_to_multiple_of``: fixed shapes for compilers such as Neuron's). The new positions are
    padding in every tensor (attention and completion masks 0), and the model is causal, so no
    logprob, advantage or loss of a real token changes."""
    T = int(batch.input_ids.shape[1])
    if not multiple or multiple <= 1 or T % multiple == 0:
        return batch
    extra = multiple - T % multiple

    def grow(x: Any, value: float) -> Any:
        if x is None or x.dim() < 2:
            return x
        return torch.nn.functional.pad(x, (0, extra), value=value)

    out = grow(batch.input_ids, pad_token_id)
    import attrs

    return attrs.evolve(batch, input_ids=out, attention_mask=grow(batch.attention_mask, 0),
                        completion_mask=grow(batch.completion_mask, 0.0), advantages=grow(batch.advantages, 0.0),
                        sampler_logps=grow(batch.sampler_logps, 0.0), old_logps=grow(batch.old_logps, 0.0),
                        ref_logps=grow(batch.ref_logps, 0.0), teacher_logps=grow(batch.teacher_logps, 0.0))


@torch.no_grad()
def batch_logprobs(model: Any, batch: Batch, *, temperature: float = 1.0, chunk_size: int = 1024,
                   rows_per_pass: int | None = None, padding_free: PaddingFree | None = None) -> torch.Tensor:
    """Logprobs ``[B, T]`` of ``batch``'s tokens under ``model`` (no gradient), ``rows_per_pass``
    rows at a time (all at once when ``None``); each pass padding-free with ``padding_free``
    (:class:`~rlcore.algorithms.logprobs.PaddingFree`)."""
    size = max(1, int(rows_per_pass or batch.size or 1))
    parts = []
    for s in range(0, batch.size, size):
        part = batch.select(slice(s, s + size))
        lp, _ = completion_logprobs(model, part.input_ids, part.attention_mask, part.completion_mask,
                                    temperature=temperature, chunk_size=chunk_size, padding_free=padding_free)
        parts.append(lp)
    return torch.cat(parts, 0) if parts else torch.zeros_like(batch.completion_mask)


def batch_loss(model: Any, batch: Batch, loss_fn: Any, config: Any, *, temperature: float = 1.0,
               chunk_size: int = 1024, top_entropy_quantile: float = 1.0,
               use_sampler_logps: bool = False, entropy_bonus: EntropyBonus | None = None,
               router_aux: Any = None, padding_free: PaddingFree | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss plugin on ``batch`` under ``model`` (with gradient) and its metrics.

    ``config`` is a :class:`~rlcore.algorithms.losses.LossConfig`. A batch with no trainable token
    gives a zero that still touches every trainable parameter (so data-parallel gradient hooks fire)
    and no metrics. ``top_entropy_quantile`` < 1 trains only on the highest-entropy tokens (TRL);
    ``use_sampler_logps`` hands the sampler's logprobs to the loss for IS correction.

    ``entropy_bonus`` (TRL's ``entropy_coef`` / ``use_adaptive_entropy``, see
    :mod:`rlcore.algorithms.entropy`) subtracts ``applied_coef × H``, ``H`` the mean entropy of the
    trained tokens, with the entropy's gradient (kept only then); in train mode it also adds the
    micro-batch to the adaptive controller's window — the caller steps the controller at the
    optimizer-step boundary. ``policy_loss`` stays the loss plugin's value.
    ``router_aux`` (:class:`~rlcore.training.model_options.RouterAux`) adds an MoE model's
    load-balancing loss of this forward times its coefficient (TRL's ``router_aux_loss_coef``).
    ``padding_free`` (:class:`~rlcore.algorithms.logprobs.PaddingFree`) runs the forward on the
    batch's sequences packed end to end; the loss then reads the same ``[B, T]`` logprobs, masks
    and normalisers as unpacked, so its value and gradient are the padded path's.
    """
    if batch.size == 0 or float(batch.completion_mask.sum()) == 0:
        device = batch.input_ids.device if batch.size else next(model.parameters()).device
        zero = sum((p.sum() * 0.0 for p in model.parameters() if p.requires_grad), torch.zeros((), device=device))
        if entropy_bonus is not None and model.training:  # TRL counts the empty micro-batch in the window
            entropy_bonus.observe(torch.zeros((), device=device), torch.zeros((), device=device))
        return zero, {}
    coef = entropy_bonus.applied_coef if entropy_bonus is not None else 0.0
    router_logits: list[Any] | None = [] if router_aux is not None else None
    logps, entropy = completion_logprobs(
        model, batch.input_ids, batch.attention_mask, batch.completion_mask,
        temperature=temperature, chunk_size=chunk_size, entropy=True, router_logits=router_logits,
        entropy_grad=coef != 0.0 and torch.is_grad_enabled(), padding_free=padding_free,
    )
    loss_mask = batch.completion_mask
    if top_entropy_quantile < 1.0:
        loss_mask = loss_mask * high_entropy_mask(entropy.detach(), loss_mask, 1.0 - top_entropy_quantile)
    teacher = {"teacher_logps": batch.teacher_logps} if getattr(loss_fn, "uses_teacher", False) else {}
    loss, metrics = loss_fn(
        logps, batch.old_logps, batch.advantages, loss_mask,
        ref_logps=batch.ref_logps,
        sampler_logps=batch.sampler_logps if use_sampler_logps or getattr(config, "off_policy_mask_threshold", None) is not None else None,
        is_valid=batch.is_valid, config=config, **teacher,
    )
    opd_coef = float(getattr(config, "opd_coef", 0.0) or 0.0)
    if opd_coef > 0.0 and not teacher:  # on-policy distillation beside an RL loss: loss + opd_coef × opd term
        if batch.teacher_logps is None:
            from ..errors import ConfigError

            raise ConfigError("opd_coef > 0 needs a teacher: set teacher_model (a path, hub id or .gguf file; rlcore.loop.Policy: teacher=)")
        term, rkl = opd_term(logps, batch.teacher_logps, loss_mask, batch.old_logps)
        loss = loss + opd_coef * term
        metrics = {**metrics, "opd/reverse_kl": rkl}
    if entropy_bonus is not None:
        h_mean, h_sum, h_count = entropy_bonus_term(entropy, loss_mask)
        if coef != 0.0:
            loss = loss - coef * h_mean
        if model.training:
            entropy_bonus.observe(h_sum, h_count)
    mask = batch.completion_mask
    metrics = dict(metrics)
    metrics["entropy"] = float((entropy.detach() * mask).sum() / mask.sum().clamp(min=1.0))
    if router_aux is not None and router_logits:
        # padding-free: the router logits are of the packed rows, whose real-token mask comes second
        aux = router_aux.loss(router_logits[0], router_logits[1] if len(router_logits) > 1 else batch.attention_mask)
        loss = loss + router_aux.coef * aux
        metrics["aux_loss"] = float(aux.detach())
    return loss, metrics
