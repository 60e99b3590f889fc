"""A decode-step forward for Llama-family models in few kernels, for the static path.

Why: inside a CUDA graph a decode step of a small model costs what its *kernels* cost, not what its
weights cost. transformers' modules spend ~42 operations per layer on a one-token step (RMSNorm as
six elementwise ops plus casts, rotary as ten, the residual adds apart from their matmuls); on a
Qwen2-0.5B shape that is ~1,000 kernels per step (3.7 ms on an H200, against 0.24 ms to read the
weights). This forward computes the same function over the same parameters and the static slot
cache in ~16 operations per layer (``bench/decode_ops.py`` counts them):

- RMSNorm is ``F.rms_norm`` (one fused kernel on CUDA, same formula as the modules' on the CPU);
- the rotary embedding of every head of a row is one batched matmul with that row's rotation matrix,
  built once per step for all layers (rotate-half and the two products become one ``bmm``; the sum
  of the two non-zero terms is rounded once instead of twice);
- the residual adds ride on the output projections (``addmm``), and a LoRA adapter's ``B(A(x))·s``
  is one ``mm`` plus one ``addmm`` on the projection's output (PEFT LoRA layers, not merged);
- grouped-query attention is one ``scaled_dot_product_attention`` with the query heads of a KV head
  as that head's query rows (KV heads are not repeated), as :func:`~rlcore.sampling.hf.static`'s
  decode attention does;
- *packed projections* (when the memory allows, see :func:`pack_budget`): q/k/v become one matmul
  over a copy of their weights stacked, gate/up another, and the rotary embedding of q and k one
  ``bmm`` (~12 operations per layer instead of ~16). The copies are refreshed from the live
  parameters before every batch (:meth:`FusedDecode.refresh`, a device copy, not a check of version
  counters that ``.data`` writes would evade): a batch decodes with the weights it started with,
  which the sampler's contract already asks (no training step while a batch decodes).

A model whose ``forward`` was wrapped in autocast (accelerate's mixed precision) gets the same
autocast here (:func:`forward_autocast`). Apart from the packed copies, it reads the model's parameters
at every call (a graph captured over it follows in-place updates; replaced tensors are caught by the
static engine's fingerprint, changed LoRA scalings by :func:`adapter_state`). It is used only for models it
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

from ..base import FP32_HEAD

#: model types whose decoder layer is exactly: RMSNorm, q/k/v projections (+ per-head q/k RMSNorm for
#: qwen3), rotate-half RoPE, attention, o_proj, residual, RMSNorm, SiLU-gated MLP, residual
FAMILIES = {"llama": False, "mistral": False, "qwen2": False, "qwen3": True}  # value: has q_norm/k_norm


def causal_lm(model: Any) -> Any:
    """The transformers causal LM inside ``model`` (a PEFT model's base model, LoRA layers in place)."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def unsupported(model: Any) -> str | None:
    """Why :class:`FusedDecode` cannot run ``model``, or None when it can."""
    lm = causal_lm(model)
    config = getattr(lm, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in FAMILIES:
        return f"model type {kind!r} is not one of {sorted(FAMILIES)}"
    if getattr(config, "hidden_act", None) != "silu":
        return f"activation {getattr(config, 'hidden_act', None)!r} is not silu"
    if (getattr(config, "pretraining_tp", 1) or 1) > 1:
        return "pretraining_tp > 1 splits the projections"
    base = getattr(lm, "model", None)
    if base is None or _projection_why(getattr(lm, "lm_head", None)) is not None:
        return f"{type(lm).__name__} is not a plain causal LM over a base model (a wrapped or quantized model?)"
    rotary = getattr(base, "rotary_emb", None)
    if rotary is None:
        return f"{type(base).__name__} has no rotary_emb module"
    rope_type = str(getattr(rotary, "rope_type", "default"))
    if "dynamic" in rope_type or "longrope" in rope_type:
        return f"rope type {rope_type!r} changes with the sequence length (a host-side decision per step)"
    if type(getattr(base, "embed_tokens", None)) is not nn.Embedding or not _is_norm(getattr(base, "norm", None)):
        return "the embedding or the final norm is not a plain module"
    for i, layer in enumerate(getattr(base, "layers", [])):
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        linears = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        linears += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        for m in linears:
            why = _projection_why(m)
            if why is not None:
                return f"layer {i}: {why}"
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


def _is_lora(m: Any) -> bool:
    return type(m).__module__.startswith("peft.tuners.lora") and hasattr(m, "base_layer") and hasattr(m, "lora_A")


def _projection_why(m: Any) -> str | None:
    """Why projection ``m`` is not one the fused forward computes: a plain ``nn.Linear``, or PEFT's
    LoRA ``Linear`` over one with plain low-rank adapters (no DoRA or other variant)."""
    if type(m) is nn.Linear:
        return None
    if not _is_lora(m):
        return f"{type(m).__name__} is not nn.Linear or a LoRA Linear (quantized or custom layers)"
    if type(m.base_layer) is not nn.Linear or getattr(m, "fan_in_fan_out", False):
        return f"LoRA over {type(m.base_layer).__name__} (quantized or transposed)"
    if getattr(m, "disable_adapters", False):
        return "LoRA adapters are disabled (the module unmerges them on its next forward)"
    variants = getattr(m, "lora_variant", {}) or {}
    for name in _active(m):
        if name in variants or (getattr(m, "use_dora", {}) or {}).get(name):
            return f"LoRA adapter {name!r} is a variant (DoRA, ...)"
        if type(m.lora_A[name]) is not nn.Linear or type(m.lora_B[name]) is not nn.Linear:
            return f"LoRA adapter {name!r} is not a pair of nn.Linear"
    return None


def _active(m: Any) -> list[str]:
    """The LoRA adapters ``m``'s forward adds (none when merged into the base weight)."""
    if getattr(m, "merged", False):
        return []
    return [a for a in m.active_adapters if a in m.lora_A.keys()]


def adapter_state(model: Any) -> tuple:
    """What a graph of the fused step bakes in besides tensors: each LoRA layer's active adapters and
    scalings (a change must drop the graphs)."""
    return tuple((tuple(_active(m)), tuple(float(m.scaling[a]) for a in _active(m)))
                 for m in model.modules() if _is_lora(m))


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

    handle = causal_lm(model).model.layers[0].register_forward_pre_hook(look)
    try:
        with torch.inference_mode():
            model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), use_cache=False)
    finally:
        handle.remove()
    return seen.get("dtype")


PACK_SHARE = 0.10  # packed copies may take this share of the device's memory (CUDA) …
PACK_CPU_BYTES = 1 << 30  # … or this many bytes of host memory


def _packable(mods: list[Any]) -> bool:
    """Plain ``nn.Linear`` projections of one input, one dtype and device, all with or all without bias."""
    if not all(type(m) is nn.Linear for m in mods):
        return False
    w0 = mods[0].weight
    same = all(m.weight.dtype == w0.dtype and m.weight.device == w0.device and m.weight.shape[1] == w0.shape[1]
               for m in mods)
    return same and len({m.bias is None for m in mods}) == 1


def pack_groups(lm: Any) -> list[dict[str, list[Any]]]:
    """Per layer, the projection groups that can be packed: ``qkv`` and ``gate_up`` (a group with a
    LoRA layer, or projections of different dtypes, is left as it is)."""
    out = []
    for layer in lm.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        groups = {"qkv": [attn.q_proj, attn.k_proj, attn.v_proj], "gate_up": [mlp.gate_proj, mlp.up_proj]}
        out.append({k: v for k, v in groups.items() if _packable(v)})
    return out


def pack_budget(lm: Any, device: torch.device, groups: list[dict[str, list[Any]]] | None = None) -> tuple[int, int]:
    """``(bytes the packed copies take, bytes allowed)`` on ``device``: ``PACK_SHARE`` of a CUDA
    device's memory, ``PACK_CPU_BYTES`` elsewhere. ``groups``: :func:`pack_groups` of ``lm``, when known."""
    need = sum(m.weight.numel() * m.weight.element_size() + (m.bias.numel() * m.bias.element_size() if m.bias is not None else 0)
               for layer in (groups if groups is not None else pack_groups(lm)) for mods in layer.values() for m in mods)
    if device.type == "cuda":
        return need, int(PACK_SHARE * torch.cuda.get_device_properties(device).total_memory)
    return need, PACK_CPU_BYTES


class FusedDecode:
    """One decode step (one new token per row) of a supported model over the static slot cache.

    ``pack``: stack q/k/v and gate/up weights into one matmul each (True, False, or None: when
    :func:`pack_budget` allows)."""

    def __init__(self, model: Any, device: torch.device, pack: bool | None = None) -> None:
        self.model = causal_lm(model)
        self.base = self.model.model
        self.qk_norm = FAMILIES[self.model.config.model_type]
        self.autocast = forward_autocast(model, device)
        self._perm: dict[tuple, torch.Tensor] = {}
        groups_by_layer = pack_groups(self.model)
        if pack is None:
            need, allowed = pack_budget(self.model, device, groups_by_layer)
            pack = need <= allowed
        # per layer: group name -> (modules, stacked weight, stacked bias or None)
        self.packs: list[dict[str, tuple[list[Any], torch.Tensor, torch.Tensor | None]]] = []
        if pack:
            for groups in groups_by_layer:
                layer = {}
                for name, mods in groups.items():
                    w = torch.empty((sum(m.weight.shape[0] for m in mods), mods[0].weight.shape[1]),
                                    dtype=mods[0].weight.dtype, device=mods[0].weight.device)
                    b = torch.empty(w.shape[0], dtype=mods[0].bias.dtype, device=w.device) if mods[0].bias is not None else None
                    layer[name] = (mods, w, b)
                self.packs.append(layer)
            self.refresh()

    @property
    def packed(self) -> bool:
        return any(self.packs)

    @torch.inference_mode()
    def refresh(self) -> None:
        """Copy the live parameters into the packed weights (in place: graphs captured over the
        packed tensors stay valid). Run before every batch."""
        for layer in self.packs:
            for mods, w, b in layer.values():
                torch.cat([m.weight for m in mods], out=w)
                if b is not None:
                    torch.cat([m.bias for m in mods], out=b)

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
        packs = self.packs or [{}] * len(base.layers)
        for layer, k_cache, v_cache, pack in zip(base.layers, keys, values, packs):
            attn, mlp = layer.self_attn, layer.mlp
            d = attn.head_dim
            x = rms_norm(h, layer.input_layernorm)
            casts: dict = {}
            if "qkv" in pack:
                mods, w, bias = pack["qkv"]
                qkv = F.linear(x, w, bias)
                nq, nk = mods[0].weight.shape[0], mods[1].weight.shape[0]
                q, k, v = (t.view(b, -1, d) for t in qkv.split([nq, nk, qkv.shape[1] - nq - nk], dim=1))
            else:
                q = _residual_linear(None, x, attn.q_proj, fuse_residual, casts).view(b, -1, d)
                k = _residual_linear(None, x, attn.k_proj, fuse_residual, casts).view(b, -1, d)
                v = _residual_linear(None, x, attn.v_proj, fuse_residual, casts).view(b, -1, d)
            if self.qk_norm:
                q, k = rms_norm(q, attn.q_norm), rms_norm(k, attn.k_norm)
            r = rots.get(q.dtype)
            if r is None:
                r = rots[q.dtype] = rot.to(q.dtype)
            if "qkv" in pack and not self.qk_norm:
                # q and k side by side in the packed output: one rotation for all their heads
                hq = q.shape[1]
                qk = torch.bmm(qkv[:, : (hq + k.shape[1]) * d].view(b, -1, d), r)
                q, k = qk[:, :hq], qk[:, hq:]
            else:
                q, k = torch.bmm(q, r), torch.bmm(k, r.to(k.dtype))
            k_cache[rows, :, pos] = k.to(k_cache.dtype)
            v_cache[rows, :, pos] = v.to(v_cache.dtype)
            hkv = k.shape[1]
            out = F.scaled_dot_product_attention(q.view(b, hkv, -1, d), k_cache, v_cache,
                                                 attn_mask=mask, scale=attn.scaling)
            h = _residual_linear(h, out.reshape(b, -1), attn.o_proj, fuse_residual)
            x = rms_norm(h, layer.post_attention_layernorm)
            if "gate_up" in pack:
                mods, w, bias = pack["gate_up"]
                gate, up = F.linear(x, w, bias).split([mods[0].weight.shape[0], mods[1].weight.shape[0]], dim=1)
                act = F.silu(gate).mul_(up)
            else:
                act = F.silu(_residual_linear(None, x, mlp.gate_proj, fuse_residual, casts))
                act = act.mul_(_residual_linear(None, x, mlp.up_proj, fuse_residual, casts))
            h = _residual_linear(h, act, mlp.down_proj, fuse_residual)
        head = self.model.lm_head
        if getattr(head, FP32_HEAD, False):  # cast_lm_head_to_fp32: the head's own float32 forward (logits in float32)
            return head(rms_norm(h, base.norm))
        return _residual_linear(None, rms_norm(h, base.norm), head, fuse_residual)


def _residual_linear(h: torch.Tensor | None, x: torch.Tensor, m: Any, fuse: bool, casts: dict | None = None) -> torch.Tensor:
    """``h + m(x)`` (``m(x)`` when ``h`` is None): one ``addmm`` when the dtypes agree, and one more
    ``mm`` + ``addmm`` per active LoRA adapter (``B(A(x)) * scaling``). Under autocast the residual
    stream keeps its own dtype, as the modules' ``residual + out`` does. ``casts`` shares the cast of
    an input to the adapters' dtype between the projections that read it."""
    lin = m.base_layer if _is_lora(m) else m
    w, bias = lin.weight, lin.bias
    if h is not None and fuse and bias is None and h.dtype == x.dtype == w.dtype:
        y = torch.addmm(h, x, w.t())
    else:
        y = F.linear(x, w, bias)
        if h is not None:
            y = h + y
    if lin is m:
        return y
    out_dtype = y.dtype
    for name in _active(m):
        a, b, scale = m.lora_A[name], m.lora_B[name], m.scaling[name]
        t = F.linear(_cast(x, a.weight.dtype, casts), a.weight, a.bias)
        if fuse and b.bias is None and y.dtype == t.dtype == b.weight.dtype:
            y = torch.addmm(y, t, b.weight.t(), alpha=scale)
        else:  # PEFT adds in the promoted dtype (float32 adapters over a bf16 base) and casts back once
            y = y + F.linear(t, b.weight, b.bias) * scale
    return y.to(out_dtype)


def _cast(x: torch.Tensor, dtype: torch.dtype, casts: dict | None) -> torch.Tensor:
    """``x.to(dtype)``, made once per input when several projections read it (q/k/v, gate/up)."""
    if x.dtype == dtype or casts is None:
        return x.to(dtype)
    hit = casts.get((id(x), dtype))
    if hit is None or hit[0] is not x:
        hit = casts[(id(x), dtype)] = (x, x.to(dtype))
    return hit[1]
