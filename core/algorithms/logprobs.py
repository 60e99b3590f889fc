"""Logprobs of chosen tokens straight from hidden states, without ever building ``[B, T, V]``.

At a vocabulary of 150k, the float32 logits of 8 × 1,024 tokens are 5 GB, and autograd keeps
them (and their gradient) alive through backward. We instead (1) keep only the positions whose
logprob is needed (completion tokens), (2) project them through the ``lm_head`` a chunk at a time,
and (3) in backward recompute each chunk's logits rather than storing them. Peak extra memory is
one ``[chunk, V]`` float32 block. Temperature divides the logits exactly as at sampling time, so
these logprobs are comparable with the sampler's.

The per-position entropy of the same (temperature-scaled) distribution comes out of the same pass.
By default it carries no gradient (it feeds metrics and the high-entropy token mask). An entropy
*bonus* in the loss needs its gradient: with ``entropy_grad`` the entropy is differentiable and
backward adds ``dH/dz = -p (log p + H)`` to each recomputed chunk (the formula TRL 1.16's
``ChunkedLogProbFunction`` uses), with ``p`` formed 128 rows at a time — a ``[128, V]`` block more
in backward, nothing when off.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ..sampling.base import FP32_HEAD  # noqa: F401 - the head marker, read below and by model_options

DEFAULT_CHUNK = 1024


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """Half-precision logits are upcast to float32 for the softmax; float64 stays float64."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float) -> torch.Tensor:
    logits = _upcast(torch.nn.functional.linear(h, weight, bias))
    if temperature != 1.0:
        logits.div_(temperature)  # in place: one [chunk, V] block, not two
    return logits


class _ChunkedSelectiveLogSoftmax(torch.autograd.Function):
    """logp[n] = log_softmax(hidden[n] @ W.T / t)[target[n]], forward and backward chunk by chunk."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                targets: torch.Tensor, temperature: float, chunk: int, want_entropy: bool,
                entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        n = hidden.shape[0]
        dt = _upcast(torch.empty(0, dtype=hidden.dtype)).dtype
        logps = torch.empty(n, dtype=dt, device=hidden.device)
        lse_all = torch.empty(n, dtype=dt, device=hidden.device)
        entropy = torch.zeros(n if want_entropy else 0, dtype=dt, device=hidden.device)
        for s in range(0, n, chunk):
            logits = _chunk_logits(hidden[s : s + chunk], weight, bias, temperature)
            lse = torch.logsumexp(logits, dim=-1)
            logps[s : s + chunk] = logits.gather(-1, targets[s : s + chunk, None]).squeeze(-1) - lse
            lse_all[s : s + chunk] = lse
            if want_entropy:
                p = torch.exp(logits - lse[:, None])
                entropy[s : s + chunk] = lse - (p * logits).sum(-1)
            del logits
        ctx.entropy_grad = bool(entropy_grad and want_entropy)
        if ctx.entropy_grad:  # the entropy itself is needed for its gradient: one float per position
            ctx.save_for_backward(hidden, weight, bias, targets, lse_all, entropy)
        else:
            ctx.save_for_backward(hidden, weight, bias, targets, lse_all)
            ctx.mark_non_differentiable(entropy)
        ctx.temperature, ctx.chunk = temperature, chunk
        return logps, entropy

    @staticmethod
    def backward(ctx: Any, grad_logps: torch.Tensor, grad_entropy: torch.Tensor) -> tuple[Any, ...]:
        if ctx.entropy_grad:
            hidden, weight, bias, targets, lse_all, entropy = ctx.saved_tensors
        else:
            hidden, weight, bias, targets, lse_all = ctx.saved_tensors
            entropy = None
        t, chunk = ctx.temperature, ctx.chunk
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[2]
        grad_h = torch.empty_like(hidden) if need_h else None
        acc = lse_all.dtype
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s : s + chunk]
            logits = _chunk_logits(h, weight, bias, t)
            if entropy is None:
                # d logp / d logits = onehot - softmax; times the incoming grad, divided by temperature
                g = logits.sub_(lse_all[s : s + chunk, None]).exp_()  # softmax, reusing the logits block
                g.neg_()
                g.scatter_add_(-1, targets[s : s + chunk, None], torch.ones_like(g[:, :1]))
                g.mul_((grad_logps[s : s + chunk] / t)[:, None])
            else:
                g = _logp_and_entropy_grad(logits, lse_all[s : s + chunk], entropy[s : s + chunk],
                                           targets[s : s + chunk], grad_logps[s : s + chunk],
                                           grad_entropy[s : s + chunk], t)
            # matmuls run in the weights' dtype (bf16 stays fast); grad_w accumulates in float32
            g_w = g.to(weight.dtype)
            if need_h:
                grad_h[s : s + chunk] = (g_w @ weight).to(hidden.dtype)
            if need_w:
                grad_w += (g_w.t() @ h.to(weight.dtype)).to(acc)
            if need_b:
                grad_b += g.sum(0)
        return (
            grad_h,
            grad_w.to(weight.dtype) if grad_w is not None else None,
            grad_b.to(bias.dtype) if grad_b is not None else None,
            None, None, None, None, None,
        )


#: rows of a chunk turned into logit gradients at a time when the entropy has a gradient: the one
#: extra block that ``p`` needs is ``[ENTROPY_ROWS, V]``, not another ``[chunk, V]``
ENTROPY_ROWS = 128


def _logp_and_entropy_grad(logits: torch.Tensor, lse: torch.Tensor, entropy: torch.Tensor, targets: torch.Tensor,
                           grad_logps: torch.Tensor, grad_entropy: torch.Tensor, t: float) -> torch.Tensor:
    """d(loss)/d(raw logits) of one chunk when both the logprob and the entropy carry gradient:
    ``gl·(onehot − p) − ge·p·(log p + H)``, divided by the temperature. Written into ``logits``
    (the temperature-scaled chunk); ``p`` is formed :data:`ENTROPY_ROWS` rows at a time."""
    g = logits.sub_(lse[:, None])  # log p, in place
    for r in range(0, g.shape[0], ENTROPY_ROWS):
        logp = g[r : r + ENTROPY_ROWS]
        p = logp.exp()
        logp.add_(entropy[r : r + ENTROPY_ROWS, None]).mul_(p).mul_(-grad_entropy[r : r + ENTROPY_ROWS, None])
        logp.sub_(p.mul_(grad_logps[r : r + ENTROPY_ROWS, None]))  # − ge·p·(log p + H) − gl·p
        del p
    g.scatter_add_(-1, targets[:, None], grad_logps[:, None].to(g.dtype))  # + gl·onehot
    return g.div_(t)


def selective_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK,
    entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs ``[N]`` of ``targets [N]`` given ``hidden [N, H]`` and the lm_head ``weight [V, H]``
    (plus the per-position entropy ``[N]`` when ``entropy``: without gradient unless
    ``entropy_grad``, which an entropy bonus in the loss needs)."""
    logps, ent = _ChunkedSelectiveLogSoftmax.apply(
        hidden, weight, bias, targets, float(temperature), max(1, int(chunk_size)), bool(entropy or entropy_grad),
        bool(entropy_grad),
    )
    entropy = entropy or entropy_grad
    return logps, (ent if entropy else None)


def completion_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK,
    entropy: bool = False,
    router_logits: list[Any] | None = None,
    entropy_grad: bool = False,
    pack: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token logprobs ``[B, T]`` of ``input_ids`` under ``model`` where ``completion_mask`` is 1
    (0 elsewhere), aligned so position ``t`` scores token ``input_ids[:, t]`` — the layout of
    :class:`rlcore.Batch`. Runs the decoder body once, then only the selected positions go through
    the ``lm_head``, in chunks. ``entropy``: also the per-token entropy ``[B, T]`` (with gradient
    when ``entropy_grad``, for an entropy bonus; detached otherwise). ``router_logits``, a list,
    receives an MoE model's router logits of this forward (for its load-balancing loss).

    ``pack``: right-padded rows of a model family known to take packed sequences are packed into
    fewer rows first when that saves rows (see :func:`packing_plan`): the decoder body then runs on
    fewer padding positions; each token's logprob is the same up to float rounding."""
    body, head = _split_model(model)
    extra = {"output_router_logits": True} if router_logits is not None else {}
    plan = packing_plan(model, attention_mask, completion_mask) if pack and router_logits is None else None
    inputs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask}
    if plan is not None:  # the rows packed into fewer rows; attention kept within each sequence
        inputs = {"input_ids": plan.pack(input_ids), "position_ids": plan.position_ids, "attention_mask": None}
    if is_data_parallel(model):
        # DDP all-reduces gradients only for forwards that go through its wrapper. Ask the full model
        # for the final hidden states and a single position of logits (not [B, T, V]).
        out = model(**inputs, use_cache=False, logits_to_keep=1, output_hidden_states=True, **extra)
        hidden = out.hidden_states[-1]
    else:
        out = body(**inputs, use_cache=False, **extra)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    if router_logits is not None:
        router_logits.append(out.router_logits)
    B, T = input_ids.shape
    sel = torch.zeros_like(completion_mask, dtype=torch.bool)
    sel[:, 1:] = completion_mask[:, 1:] > 0  # token t is predicted by the hidden state at t-1
    rows, cols = sel.nonzero(as_tuple=True)
    if plan is None:
        h = hidden[rows, cols - 1]
    else:
        h = hidden[plan.bin_of[rows], plan.offset_of[rows] + cols - 1]
    targets = input_ids[rows, cols]
    fp32 = bool(getattr(head, FP32_HEAD, False))  # cast_lm_head_to_fp32: float32 logits, outside autocast (TRL)
    with torch.autocast(h.device.type, enabled=False) if fp32 else contextlib.nullcontext():
        lp, ent = selective_logprobs(h.float() if fp32 else h, head.weight, targets, bias=getattr(head, "bias", None),
                                     temperature=temperature, chunk_size=chunk_size, entropy=entropy,
                                     entropy_grad=entropy_grad)
    logps = torch.zeros((B, T), dtype=lp.dtype, device=input_ids.device)
    logps = logps.index_put((rows, cols), lp)
    ent_full = None
    if ent is not None:
        ent_full = torch.zeros((B, T), dtype=ent.dtype, device=input_ids.device)
        ent_full = ent_full.index_put((rows, cols), ent)
    return logps, ent_full


#: model families whose transformers forward keeps packed sequences apart (``position_ids`` that
#: restart at 0 and no 2-D attention mask: transformers builds the block-diagonal causal mask)
PACKABLE_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
#: attention implementations that honour that mask (both build it from the position ids)
PACKABLE_ATTENTION = frozenset({"sdpa", "eager"})


class PackingPlan:
    """Where each row of a right-padded ``[B, T]`` batch goes in a packed ``[R, T]`` one (R < B):
    row ``i`` starts at column ``offset_of[i]`` of packed row ``bin_of[i]``; ``position_ids`` restart
    at 0 at each sequence (the tail padding of a packed row continues its last sequence, which a
    causal model never lets earlier tokens see)."""

    def __init__(self, lengths: list[int], T: int, device: Any) -> None:
        bins: list[list[int]] = []  # first fit, longest first
        room: list[int] = []
        for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
            n = lengths[i]
            for b, free in enumerate(room):
                if n <= free:
                    bins[b].append(i)
                    room[b] -= n
                    break
            else:
                bins.append([i])
                room.append(T - n)
        bin_of, offset_of = [0] * len(lengths), [0] * len(lengths)
        positions = torch.zeros((len(bins), T), dtype=torch.long)
        src_row, src_col = torch.zeros((len(bins), T), dtype=torch.long), torch.zeros((len(bins), T), dtype=torch.long)
        for b, members in enumerate(bins):
            at = 0
            for i in members:
                n = lengths[i]
                bin_of[i], offset_of[i] = b, at
                positions[b, at : at + n] = torch.arange(n)
                src_row[b, at : at + n], src_col[b, at : at + n] = i, torch.arange(n)
                at += n
            if at < T:  # tail padding: continues the last sequence (any token id; nothing reads it)
                last = members[-1]
                positions[b, at:] = torch.arange(lengths[last], lengths[last] + T - at)
                src_row[b, at:], src_col[b, at:] = last, 0
        self.rows = len(bins)
        self.bin_of = torch.tensor(bin_of, device=device)
        self.offset_of = torch.tensor(offset_of, device=device)
        self.position_ids = positions.to(device)
        self._src = (src_row.to(device), src_col.to(device))

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, T]`` laid out as the packed ``[R, T]``."""
        return x[self._src]


def packing_plan(model: Any, attention_mask: torch.Tensor, completion_mask: torch.Tensor) -> PackingPlan | None:
    """A :class:`PackingPlan` when packing is known to give the same logprobs and saves rows: a
    model of :data:`PACKABLE_MODEL_TYPES` under an attention of :data:`PACKABLE_ATTENTION`, every
    row right-padded (its attention mask a prefix of ones, its completion inside it). Else None,
    and the batch runs as it is."""
    if attention_mask is None or attention_mask.dim() != 2 or attention_mask.shape[0] < 2:
        return None
    from ..weights import base_model

    config = getattr(base_model(model), "config", None)
    if getattr(config, "model_type", None) not in PACKABLE_MODEL_TYPES:
        return None
    if getattr(config, "_attn_implementation", None) not in PACKABLE_ATTENTION:
        return None
    B, T = attention_mask.shape
    lengths = attention_mask.sum(1)
    prefix = torch.arange(T, device=attention_mask.device)[None, :] < lengths[:, None]
    if not torch.equal(attention_mask.bool(), prefix) or bool(((completion_mask > 0) & ~prefix).any()):
        return None
    lengths_list = [int(n) for n in lengths.tolist()]
    if sum(lengths_list) > (B - 1) * T:  # cannot save a row
        return None
    plan = PackingPlan(lengths_list, T, attention_mask.device)
    return plan if plan.rows < B else None


def is_data_parallel(model: Any) -> bool:
    """True for torch DDP / FSDP wrappers, whose gradient sync hooks need their own forward."""
    return isinstance(model, torch.nn.parallel.DistributedDataParallel) or type(model).__name__ in (
        "FullyShardedDataParallel", "FSDPModule",
    )


def _split_model(model: Any) -> tuple[Any, Any]:
    """(decoder body returning hidden states, lm_head) of a causal LM, also through PEFT and DDP /
    accelerate / compile wrappers (unwrapped by :func:`rlcore.weights.base_model`)."""
    from ..weights import base_model

    m = base_model(model)
    head = m.get_output_embeddings()
    body = getattr(m, m.base_model_prefix, None) if getattr(m, "base_model_prefix", None) else None
    if body is None:
        body = m.model
    return body, head


def naive_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The plain entropy of ``softmax(logits / temperature)`` (full tensors, autograd): the
    reference the chunked entropy and its gradient must equal."""
    logp = torch.log_softmax(_upcast(logits) / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def naive_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The plain computation (full log_softmax, then gather): the reference the chunked one must equal."""
    return torch.log_softmax(_upcast(logits) / temperature, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
