"""What weights a sync sends: adapters only when the sampler can load them, else full (merged) weights.

Why merged for a LoRA model whose sampler has no adapters: the sampler's model is the plain base
architecture, so it needs ``W + BA`` under the base names. We add each adapter's delta to a copy,
never merging in place (merge + unmerge is not exact in floating point).
"""

from __future__ import annotations

from typing import Any


def is_peft_model(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "merge_adapter")


def unwrap(model: Any) -> Any:
    """The module under DDP / torch.compile wrappers."""
    while hasattr(model, "module") and not is_peft_model(model):
        model = model.module
    return getattr(model, "_orig_mod", model)


def export_weights(model: Any, *, sampler_accepts_lora: bool, to_cpu: bool = True) -> tuple[dict[str, Any], bool]:
    """CPU copies of the weights to send, and whether they are adapter-only (``lora``).

    Plain model: its parameters (``named_parameters``: tied weights once, as loaders expect).
    PEFT model + sampler with adapters: only ``lora_`` tensors.
    PEFT model + plain sampler: merged weights (``W + ΔW`` computed aside; the module is never
    merged in place, so its weights stay bit-for-bit what the optimizer made them) under the base
    model's names.
    """
    import torch

    def out_(t: Any) -> Any:  # CPU copies for the object store; device tensors for a broadcast
        return t.detach().to("cpu", copy=True) if to_cpu else t.detach().clone()

    model = unwrap(model)
    with torch.no_grad():
        if not is_peft_model(model):
            return {n: out_(t) for n, t in model.named_parameters()}, False
        if sampler_accepts_lora:
            return {n: out_(t) for n, t in model.named_parameters() if "lora_" in n}, True
        deltas = _lora_deltas(model)
        out = {}
        for n, t in model.named_parameters():
            if "lora_" in n:
                continue
            module_name = n.rsplit(".", 1)[0].removesuffix(".base_layer")
            w = t.detach()
            if n.endswith(".base_layer.weight") and module_name in deltas:
                w = w + deltas[module_name].to(w.dtype)
            out[_base_name(n)] = out_(w)
        return out, False


def nbytes(weights: dict[str, Any]) -> int:
    return int(sum(t.numel() * t.element_size() for t in weights.values()))


def _base_name(name: str) -> str:
    return name.replace("base_model.model.", "", 1).replace(".base_layer.", ".")


def _lora_deltas(model: Any) -> dict[str, Any]:
    """``{module name: ΔW}`` summed over each LoRA layer's active adapters."""
    out: dict[str, Any] = {}
    for name, mod in model.named_modules():
        get_delta = getattr(mod, "get_delta_weight", None)
        adapters = getattr(mod, "active_adapters", None)
        lora_a = getattr(mod, "lora_A", None)
        if get_delta is None or adapters is None or lora_a is None or getattr(mod, "merged", False):
            continue
        for ad in adapters:
            if ad in lora_a:
                d = get_delta(ad).detach()
                out[name] = out[name] + d if name in out else d
    return out
