"""One place for a policy's weights: unwrap wrappers, export them for a sampler (LoRA merged or
adapter-only), and tell whether a sampler shares the trainer's module.

Why one module: the single-process trainer, the loop API's ``sync_weights`` and the Ray trainer
group all send weights to samplers; they must agree on names (a plain model's names, never
``base_model.model.`` or ``.base_layer.``), on tied weights (sent once, as loaders expect) and on
LoRA (``W + ΔW`` computed on the side — merging into the trained module and unmerging again drifts
the frozen base weights by rounding at every sync). Loading weights into a live module is the
sampler's side (:mod:`rlcore.sampling.weights`).
"""

from __future__ import annotations

from typing import Any


def is_peft_model(model: Any) -> bool:
    """A PEFT (LoRA) wrapper — the ``PeftModel`` or the ``LoraModel`` inside it (what some unwrapping
    helpers hand back): either carries ``peft_config``."""
    return hasattr(model, "peft_config")


def unwrap(model: Any) -> Any:
    """The module under DDP / accelerate / ``torch.compile`` wrappers (a PEFT wrapper is kept)."""
    while hasattr(model, "module") and not is_peft_model(model) and not hasattr(model, "get_output_embeddings"):
        model = model.module
    return getattr(model, "_orig_mod", model)


def base_model(model: Any) -> Any:
    """The plain causal LM: :func:`unwrap` and, for a PEFT model, its base model (adapters stay
    injected in its layers)."""
    model = unwrap(model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def shares_module(sampler: Any, model: Any) -> bool:
    """True when ``sampler`` generates with ``model``'s own parameters (a colocated ``hf`` sampler):
    a weight sync then has nothing to copy."""
    m = getattr(sampler, "model", None)
    return m is not None and (m is model or m is unwrap(model) or m is base_model(model))


def sampler_accepts_lora(sampler: Any) -> bool:
    """Whether ``sampler`` can take adapter-only updates: it says so (``accepts_lora()`` of a Ray
    pool, ``supports_lora``), or its module already carries LoRA adapters to copy into."""
    ask = getattr(sampler, "accepts_lora", None)
    if callable(ask):
        return bool(ask())
    flag = getattr(sampler, "supports_lora", None)
    if flag is not None:
        return bool(flag)
    model = getattr(sampler, "model", None)
    if model is None or not hasattr(model, "named_parameters"):
        return False
    return any("lora_" in n for n, _ in model.named_parameters())


def export_weights(model: Any, *, sampler_accepts_lora: bool = False, to_cpu: bool = True,
                   copy: bool = True) -> tuple[dict[str, Any], bool]:
    """The weights to send to a sampler, and whether they are adapter-only (``lora``).

    Plain model: its parameters (``named_parameters``: tied weights once).
    PEFT model + sampler with adapters: only the ``lora_`` tensors.
    PEFT model + plain sampler: merged weights under the base model's names (``W + ΔW`` computed
    aside; the module is never merged in place, so its weights stay what the optimizer made them).

    ``to_cpu`` makes CPU copies (the Ray object store, weight files); otherwise tensors stay on
    their device, cloned when ``copy`` (a broadcast must not see the next step's update) or the
    live parameters themselves when not (a sampler that copies them in right away).
    """
    import torch

    def out_(t: Any) -> Any:
        t = t.detach()
        if to_cpu:
            return t.to("cpu", copy=True)
        return t.clone() if copy else t

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
                w = w + deltas[module_name].to(w.dtype)  # a new tensor already: never the live base weight
                out[_base_name(n)] = w.to("cpu") if to_cpu else w
                continue
            out[_base_name(n)] = out_(w)
        return out, False


def nbytes(weights: dict[str, Any]) -> int:
    """Total size of ``weights`` in bytes (sync metrics)."""
    return int(sum(t.numel() * t.element_size() for t in weights.values()))


def _base_name(name: str) -> str:
    return name.replace("base_model.model.", "", 1).replace(".base_layer.", ".")


def _lora_deltas(model: Any) -> dict[str, Any]:
    """``{module name: ΔW}`` summed over each LoRA layer's active, unmerged adapters."""
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
