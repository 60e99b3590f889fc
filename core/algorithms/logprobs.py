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
import dataclasses
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
    padding_free: PaddingFree | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token logprobs ``[B, T]`` of ``input_ids`` under ``model`` where ``completion_mask`` is 1
    (0 elsewhere), aligned so position ``t`` scores token ``input_ids[:, t]`` — the layout of
    :class:`rlcore.Batch`. Runs the decoder body once, then only the selected positions go through
    the ``lm_head``, in chunks. ``entropy``: also the per-token entropy ``[B, T]`` (with gradient
    when ``entropy_grad``, for an entropy bonus; detached otherwise). ``router_logits``, a list,
    receives an MoE model's router logits of this forward (for its load-balancing loss).

    ``pack``: right-padded rows of a model family known to take packed sequences are packed into
    fewer rows first when that saves rows (see :func:`packing_plan`): the decoder body then runs on
    fewer padding positions; each token's logprob is the same up to float rounding.

    ``padding_free`` (a :class:`PaddingFree`): every row is packed, for any model (the caller has
    checked it with :func:`check_padding_free`), into rows of its token budget under mask-based
    attention or one row under flash-attention's varlen kernels; logprobs and entropies come back
    in the ``[B, T]`` layout, so every loss reads what it reads unpacked."""
    body, head = _split_model(model)
    extra: dict[str, Any] = {"output_router_logits": True} if router_logits is not None else {}
    if padding_free is not None:
        plan: PackingPlan | None = padding_free_plan(model, attention_mask, padding_free)
        if plan is not None and is_varlen_attention(attention_implementation(model)):
            extra.update(varlen_kwargs(plan))
    else:
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
        if plan is not None:  # the load-balancing loss then averages over the packed rows' real tokens
            router_logits.append(plan.token_mask)
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

    def __init__(self, lengths: list[int], T: int, device: Any, width: int | None = None) -> None:
        src_T, T = T, int(width) if width is not None else T  # packed rows are ``width`` wide (default: T)
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
        real = torch.zeros((len(bins), T), dtype=torch.long)
        for b, members in enumerate(bins):
            at = 0
            for i in members:
                n = lengths[i]
                bin_of[i], offset_of[i] = b, at
                positions[b, at : at + n] = torch.arange(n)
                src_row[b, at : at + n], src_col[b, at : at + n] = i, torch.arange(n)
                at += n
            real[b, :at] = 1
            if at < T:  # tail padding: continues the last sequence (any token id; nothing reads it)
                last = members[-1]
                positions[b, at:] = torch.arange(lengths[last], lengths[last] + T - at)
                src_row[b, at:], src_col[b, at:] = last, 0
        self.rows, self.width, self.source_width = len(bins), T, src_T
        self.lengths = list(lengths)
        self.bins = bins
        self.bin_of = torch.tensor(bin_of, device=device)
        self.offset_of = torch.tensor(offset_of, device=device)
        self.position_ids = positions.to(device)
        self.token_mask = real.to(device)  # 1 on the packed rows' real tokens, 0 on their tail padding
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
    from ..sampling.weight_export import base_model

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


#: model families whose padding-free forward rlcore's tests hold to the padded one (any other model
#: is accepted when :func:`check_padding_free` finds it keeps packed sequences apart)
TESTED_PADDING_FREE = frozenset({"llama", "qwen2", "qwen3", "qwen2_moe"})

#: attention implementations with varlen kernels: a padding-free micro-batch is one row of all its
#: tokens, its sequences told apart by ``position_ids`` (and the ``cu_seq_lens`` rlcore passes)
VARLEN_ATTENTION = frozenset({"flash_attention_2", "flash_attention_3"})


def attention_implementation(model: Any) -> str:
    """The ``attn_implementation`` ``model`` runs with (``config._attn_implementation``), ``"eager"`` when unset."""
    from ..sampling.weight_export import base_model

    config = getattr(base_model(model), "config", None)
    return str(getattr(config, "_attn_implementation", None) or "eager")


def is_varlen_attention(impl: str) -> bool:
    """flash-attention 2/3, also as a kernels-hub name (``kernels-community/flash-attn2``)."""
    return impl in VARLEN_ATTENTION or "flash" in impl.lower() and "/" in impl


@dataclasses.dataclass(frozen=True)
class PaddingFree:
    """How a padding-free forward lays a micro-batch out (``GRPOConfig.padding_free``).

    ``max_tokens`` (``padding_free_max_tokens``): the width of a packed row under mask-based
    attention (sdpa, eager, flex), whose block-diagonal causal mask costs ``width²`` per row; rows
    are packed first-fit, longest first, into as few rows of that width as hold them. ``None``: the
    micro-batch's longest sequence. A sequence longer than ``max_tokens`` widens every row of its
    micro-batch to its own length (nothing is cut). Under a varlen attention (flash-attention 2/3)
    the micro-batch is one row of all its tokens and ``max_tokens`` does not apply.
    ``pad_to_multiple_of``: the packed width is rounded up to a multiple of it (TRL's collator
    pads its padding-free row the same way)."""

    max_tokens: int | None = None
    pad_to_multiple_of: int | None = None


def padding_free_plan(model: Any, attention_mask: torch.Tensor, settings: PaddingFree) -> PackingPlan:
    """The packed layout of a right-padded ``[B, T]`` batch for a padding-free forward (see
    :class:`PaddingFree`); every row is packed, whether or not that saves a row."""
    B, T = attention_mask.shape
    lengths = attention_mask.sum(1)
    prefix = torch.arange(T, device=attention_mask.device)[None, :] < lengths[:, None]
    if not torch.equal(attention_mask.bool(), prefix):
        from ..errors import ConfigError

        raise ConfigError("padding_free packs right-padded rows (an attention mask of ones, then zeros); this batch has "
                          "a row with padding inside or on the left — build it with rlcore.loop.pack / Batch.from_trajectories")
    sizes = [int(n) for n in lengths.tolist()]
    longest = max(sizes, default=0)
    if is_varlen_attention(attention_implementation(model)):
        width = sum(sizes)  # one row: the varlen kernels take the sequences end to end
    else:
        width = max(int(settings.max_tokens or 0), longest)
    m = settings.pad_to_multiple_of
    if m and m > 1 and width % m:
        width += m - width % m
    return PackingPlan(sizes, T, attention_mask.device, width=max(1, width))


def varlen_kwargs(plan: PackingPlan) -> dict[str, Any]:
    """flash-attention's sequence boundaries of a one-row plan (TRL's collator passes the same keys):
    without them transformers derives them from ``position_ids`` with a device sync in every layer."""
    starts = [0]
    for i in plan.bins[0]:
        starts.append(starts[-1] + plan.lengths[i])
    if starts[-1] < plan.width:  # the tail continues the last sequence
        starts[-1] = plan.width
    starts = [s for k, s in enumerate(starts) if k == 0 or s > starts[k - 1]]  # empty rows add no boundary
    cu = torch.tensor(starts, dtype=torch.int32, device=plan.position_ids.device)
    longest = int(max(b - a for a, b in zip(starts, starts[1:])))
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}


def check_padding_free(model: Any) -> None:
    """One line (:class:`~rlcore.errors.ConfigError`) unless ``model`` keeps packed sequences apart
    under its attention implementation: two short sequences packed into one row must get the
    logprobs each gets alone (a model that lets one see the other, or ignores ``position_ids``,
    fails here, before training). Checked once per model object."""
    from ..errors import ConfigError
    from ..sampling.weight_export import base_model

    m = base_model(model)
    impl = attention_implementation(model)
    if getattr(m, "_rlcore_padding_free_ok", None) == impl:
        return
    config = getattr(m, "config", None)
    name = getattr(config, "_name_or_path", None) or type(m).__name__
    family = getattr(config, "model_type", None) or type(m).__name__
    try:
        param = next(m.parameters())
    except StopIteration:
        raise ConfigError(f"padding_free: {name} has no parameters to check packing with") from None
    vocab = int(getattr(config, "vocab_size", None) or 100)
    g = torch.Generator().manual_seed(1234)
    lengths = (7, 11)
    ids = torch.randint(1, max(2, min(vocab, 5000)), (2, max(lengths)), generator=g).to(param.device)
    attn = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        attn[i, :n] = 1
    cmask = attn.float()
    cmask[:, 0] = 0
    was = m.training
    m.eval()
    try:
        with torch.no_grad():
            alone, _ = completion_logprobs(model, ids, attn, cmask, pack=False)
            packed, _ = completion_logprobs(model, ids, attn, cmask, padding_free=PaddingFree(max_tokens=sum(lengths)))
    except Exception as exc:  # noqa: BLE001 - any failure of the packed forward is the same answer
        raise ConfigError(f"padding_free: {name} ({family}, attn_implementation={impl!r}) cannot run packed sequences "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); train it with "
                          "padding_free=False") from None
    finally:
        m.train(was)
    diff = float((packed.float() - alone.float()).abs().max())
    tol = 1e-3 if param.dtype in (torch.float32, torch.float64) else 0.05  # half precision: its rounding
    if not diff <= tol:
        raise ConfigError(f"padding_free: {name} ({family}, attn_implementation={impl!r}) does not keep packed sequences "
                          f"apart (a packed sequence's logprobs move by {diff:.3g} from its own: it sees the sequence before "
                          "it or ignores position_ids); train it with padding_free=False (families tested packed: "
                          f"{', '.join(sorted(TESTED_PADDING_FREE))})")
    m._rlcore_padding_free_ok = impl


def is_data_parallel(model: Any) -> bool:
    """True for torch DDP / FSDP wrappers, whose gradient sync hooks need their own forward."""
    return isinstance(model, torch.nn.parallel.DistributedDataParallel) or type(model).__name__ in (
        "FullyShardedDataParallel", "FSDPModule",
    )


def _split_model(model: Any) -> tuple[Any, Any]:
    """(decoder body returning hidden states, lm_head) of a causal LM, also through PEFT and DDP /
    accelerate / compile wrappers (unwrapped by :func:`rlcore.sampling.weight_export.base_model`)."""
    from ..sampling.weight_export import base_model

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
