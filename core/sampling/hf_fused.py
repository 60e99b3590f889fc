"""A decode-step forward for Llama-family models in few kernels, for the static path.

Why: inside a CUDA graph a decode step of a small model costs what its *kernels* cost, not what its
weights cost. transformers' modules spend ~44 kernels per layer on a one-token step (RMSNorm as six
elementwise ops plus casts, rotary as ten, the residual adds apart from their matmuls); on a
Qwen2-0.5B shape that was ~1,100 kernels and 3.7 ms per step on an H200, against 0.24 ms to read the
weights. This forward computes the same function over the same parameters and the static slot cache
in ~16 kernels per layer:

- RMSNorm is ``F.rms_norm`` (one fused kernel on CUDA, same formula as the modules' on the CPU);
- the rotary embedding of every head of a row is one batched matmul with that row's rotation matrix,
  built once per step for all layers (rotate-half and the two products become one ``bmm``; the sum
  of the two non-zero terms is rounded once instead of twice);
- the residual adds ride on the output projections (``addmm``);
- grouped-query attention is one ``scaled_dot_product_attention`` with the query heads of a KV head
  as that head's query rows (KV heads are not repeated), as :func:`~rlcore.sampling.hf_static`'s
  decode attention does.

A model whose ``forward`` was wrapped in autocast (accelerate's mixed precision) gets the same
autocast here (:func:`forward_autocast`). It reads the model's parameters at every call (a graph captured over it follows in-place updates;
replaced tensors are caught by the static engine's fingerprint). It is used only for models it
knows module by module — :func:`unsupported` says why not otherwise, and the static path then runs
the model's own forward, which is always correct. Numerics: in float32 it agrees with the model's
forward to float rounding; in bf16 it differs by bf16 rounding of a different order of operations,
as any other kernel would. The logprob of each sampled token still comes from the logits that drew
it (sampling is unchanged).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

#: model types whose decoder layer is exactly: RMSNorm, q/k/v projections (+ per-head q/k RMSNorm for
#: qwen3), rotate-half RoPE, attention, o_proj, residual, RMSNorm, SiLU-gated MLP, residual
FAMILIES = {"llama": False, "mistral": False, "qwen2": False, "qwen3": True}  # value: has q_norm/k_norm


def unsupported(model: Any) -> str | None:
    """Why :class:`FusedDecode` cannot run ``model``, or None when it can."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in FAMILIES:
        return f"model type {kind!r} is not one of {sorted(FAMILIES)}"
    if getattr(config, "hidden_act", None) != "silu":
        return f"activation {getattr(config, 'hidden_act', None)!r} is not silu"
    if (getattr(config, "pretraining_tp", 1) or 1) > 1:
        return "pretraining_tp > 1 splits the projections"
    base = getattr(model, "model", None)
    lm_head = getattr(model, "lm_head", None)
    if base is None or type(lm_head) is not nn.Linear:
        return f"{type(model).__name__} is not a plain causal LM over a base model (a wrapped or quantized model?)"
    rotary = getattr(base, "rotary_emb", None)
    rope_type = str(getattr(rotary, "rope_type", "default"))
    if rotary is None or "dynamic" in rope_type or "longrope" in rope_type:
        return f"rope type {rope_type!r} changes with the sequence length (a host-side decision per step)"
    if type(getattr(base, "embed_tokens", None)) is not nn.Embedding or not _is_norm(getattr(base, "norm", None)):
        return "the embedding or the final norm is not a plain module"
    for i, layer in enumerate(getattr(base, "layers", [])):
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        linears = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        linears += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if any(type(m) is not nn.Linear for m in linears):
            return f"layer {i}'s projections are not plain nn.Linear (LoRA adapters, quantization)"
        norms = [getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None)]
        if FAMILIES[kind]:
            norms += [getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)]
        if not all(_is_norm(n) for n in norms):
            return f"layer {i}'s norms are not RMSNorm modules"
        if getattr(attn, "scaling", None) is None or getattr(attn, "head_dim", None) is None:
            return f"layer {i}'s attention has no scaling/head_dim"
    for m in model.modules():
        if m._forward_hooks or m._forward_pre_hooks or hasattr(m, "_hf_hook"):
            return f"{type(m).__name__} has forward hooks (this forward would bypass them)"
    if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
        return "global forward hooks are registered (this forward would bypass them)"
    return None


def _is_norm(m: Any) -> bool:
    return (m is not None and type(m).__name__.endswith("RMSNorm") and isinstance(getattr(m, "weight", None), torch.Tensor)
            and getattr(m, "variance_epsilon", None) is not None)


def rms_norm(x: torch.Tensor, norm: Any) -> torch.Tensor:
    """The modules' RMSNorm (``weight * (x / rms(x))`` in float32, cast back): fused when the dtypes
    agree, else computed as the module computes it."""
    w = norm.weight
    if x.dtype == w.dtype:
        return F.rms_norm(x, (x.shape[-1],), w, norm.variance_epsilon)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return w * h.to(x.dtype)


def rotate_half_matrix(d: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The signed permutation ``P`` ``[D, D]`` with ``x @ P == rotate_half(x)``, i.e.
    ``cat(-x[h:], x[:h])`` for ``h = D // 2``."""
    h = d // 2
    perm = torch.zeros((d, d), dtype=dtype, device=device)
    idx = torch.arange(h, device=device)
    perm[idx + h, idx] = -1
    perm[idx, idx + h] = 1
    return perm


def rotation(cos: torch.Tensor, sin: torch.Tensor, perm: torch.Tensor | None = None) -> torch.Tensor:
    """Per-row matrices ``R`` ``[B, D, D]`` with ``x @ R == x * cos + rotate_half(x) * sin`` (the
    rotate-half RoPE of transformers' Llama family), from ``cos``/``sin`` ``[B, D]``."""
    if perm is None:
        perm = rotate_half_matrix(cos.shape[-1], cos.dtype, cos.device)
    return torch.diag_embed(cos) + perm.unsqueeze(0) * sin.unsqueeze(1)


def forward_autocast(model: Any, device: torch.device) -> torch.dtype | None:
    """The autocast dtype the model's own ``forward`` runs its layers under, or None.

    accelerate's mixed precision replaces ``model.forward`` with one wrapped in ``torch.autocast``;
    a forward that bypasses ``model.forward`` must apply the same. A replaced forward is probed once
    with a one-token forward (a pre-hook on the first layer reads the autocast state it runs under)."""
    if "forward" not in vars(model):
        return None
    seen: dict[str, torch.dtype | None] = {}

    def look(module: Any, args: Any) -> None:
        kind = device.type
        seen["dtype"] = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None

    handle = model.model.layers[0].register_forward_pre_hook(look)
    try:
        with torch.inference_mode():
            model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), use_cache=False)
    finally:
        handle.remove()
    return seen.get("dtype")


class FusedDecode:
    """One decode step (one new token per row) of a supported model over the static slot cache."""

    def __init__(self, model: Any, device: torch.device) -> None:
        self.model = model
        self.base = model.model
        self.qk_norm = FAMILIES[model.config.model_type]
        self.autocast = forward_autocast(model, device)
        self._perm: dict[tuple, torch.Tensor] = {}

    def __call__(self, tok: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, keys: list[torch.Tensor],
                 values: list[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, V]`` of the next token after ``tok`` ``[B]``, written at column ``pos`` ``[B]``
        of slots ``rows`` of ``keys``/``values`` (``[slots, kv_heads, T, head_dim]`` per layer) and
        attending under the additive ``mask`` ``[B, 1, 1, T]``."""
        if self.autocast is not None:
            with torch.autocast(tok.device.type, dtype=self.autocast):
                return self._forward(tok, pos, mask, keys, values, rows)
        return self._forward(tok, pos, mask, keys, values, rows)

    def _forward(self, tok: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, keys: list[torch.Tensor],
                 values: list[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        base = self.base
        b = tok.shape[0]
        h = base.embed_tokens(tok)
        cos, sin = base.rotary_emb(h, pos.unsqueeze(1))
        key = (cos.shape[-1], cos.dtype, cos.device)
        if key not in self._perm:
            self._perm[key] = rotate_half_matrix(*key)
        rot = rotation(cos[:, 0], sin[:, 0], self._perm[key])
        rots: dict[torch.dtype, torch.Tensor] = {rot.dtype: rot}  # under autocast q/k are in the autocast dtype
        fuse_residual = not torch.is_autocast_enabled(h.device.type)
        for layer, k_cache, v_cache in zip(base.layers, keys, values):
            attn, mlp = layer.self_attn, layer.mlp
            d = attn.head_dim
            x = rms_norm(h, layer.input_layernorm)
            q = _linear(x, attn.q_proj).view(b, -1, d)
            k = _linear(x, attn.k_proj).view(b, -1, d)
            v = _linear(x, attn.v_proj).view(b, -1, d)
            if self.qk_norm:
                q, k = rms_norm(q, attn.q_norm), rms_norm(k, attn.k_norm)
            r = rots.get(q.dtype)
            if r is None:
                r = rots[q.dtype] = rot.to(q.dtype)
            q, k = torch.bmm(q, r), torch.bmm(k, r.to(k.dtype))
            k_cache[rows, :, pos] = k.to(k_cache.dtype)
            v_cache[rows, :, pos] = v.to(v_cache.dtype)
            hkv = k.shape[1]
            out = F.scaled_dot_product_attention(q.view(b, hkv, -1, d), k_cache, v_cache,
                                                 attn_mask=mask, scale=attn.scaling)
            h = _residual_linear(h, out.reshape(b, -1), attn.o_proj, fuse_residual)
            x = rms_norm(h, layer.post_attention_layernorm)
            act = F.silu(_linear(x, mlp.gate_proj)).mul_(_linear(x, mlp.up_proj))
            h = _residual_linear(h, act, mlp.down_proj, fuse_residual)
        return _linear(rms_norm(h, base.norm), self.model.lm_head)


def _linear(x: torch.Tensor, m: nn.Linear) -> torch.Tensor:
    return F.linear(x, m.weight, m.bias)


def _residual_linear(h: torch.Tensor, x: torch.Tensor, m: nn.Linear, fuse: bool) -> torch.Tensor:
    """``h + m(x)``: one ``addmm`` when the dtypes agree (under autocast the residual stream keeps its
    own dtype, as the modules' ``residual + out`` does)."""
    if fuse and m.bias is None and h.dtype == x.dtype == m.weight.dtype:
        return torch.addmm(h, x, m.weight.t())
    return h + _linear(x, m)
