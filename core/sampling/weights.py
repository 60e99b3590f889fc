"""In-place weight loading into a live ``nn.Module`` — how a colocated sampler follows the trainer.

Names are matched tolerantly (a trainer's names may carry ``module.`` from DDP, ``_orig_mod.``
from ``torch.compile`` or ``base_model.model.`` from PEFT), tensors are copied into the existing
parameters (no reallocation, so CUDA graphs / caches holding them stay valid), and a tensor that
already *is* the parameter (the sampler shares the trainer's module) is skipped: no copy at all.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..errors import SamplerError
from .base import WeightsLike

_PREFIXES = ("module.", "_orig_mod.", "base_model.model.", "model.")


def _candidates(name: str) -> list[str]:
    out = [name]
    changed = True
    while changed:
        changed = False
        for p in _PREFIXES:
            if out[-1].startswith(p):
                out.append(out[-1][len(p):])
                changed = True
    return out


def _iter_weights(weights: WeightsLike) -> Iterable[tuple[str, Any]]:
    if isinstance(weights, Mapping):
        return weights.items()
    return weights


def load_weights_into(module: Any, weights: WeightsLike, *, lora: bool = False) -> int:
    """Copy ``weights`` (a state dict or ``(name, tensor)`` pairs) into ``module`` in place.

    With ``lora=True`` only adapter tensors (names containing ``lora_``) are expected and every
    other parameter is left alone; the module must carry the adapters (a PEFT model).
    Returns how many tensors were copied. Unknown names or shape mismatches raise a SamplerError.
    """
    import torch

    # keep_vars: the live Parameters, including tied aliases (lm_head.weight ↔ embed_tokens.weight)
    params: dict[str, Any] = dict(module.state_dict(keep_vars=True))
    # index the module's names by every prefix-stripped form, so either side may carry prefixes
    index: dict[str, str] = {}
    for full in params:
        for c in _candidates(full):
            index.setdefault(c, full)
        index.setdefault(full.replace(".default.", "."), full)  # PEFT adapter name "default"
    copied = 0
    with torch.no_grad():
        for name, tensor in _iter_weights(weights):
            if lora and "lora_" not in name:
                continue
            target_name = next((index[c] for c in _candidates(name) if c in index), None)
            if target_name is None:
                target_name = next((index[c.replace(".default.", ".")] for c in _candidates(name)
                                    if c.replace(".default.", ".") in index), None)
            if target_name is None:
                raise SamplerError(
                    f"update_weights: the sampler's model has no parameter named {name!r}; "
                    "pass the trainer model's state_dict / named_parameters()"
                )
            target = params[target_name]
            if tensor is target or (
                hasattr(tensor, "data_ptr") and tensor.data_ptr() == target.data_ptr() and tensor.device == target.device
            ):
                continue  # shared module: the sampler already sees these weights
            if tuple(tensor.shape) != tuple(target.shape):
                raise SamplerError(
                    f"update_weights: {name!r} has shape {tuple(tensor.shape)} but the sampler's "
                    f"{target_name!r} has {tuple(target.shape)}; the models differ"
                )
            target.copy_(tensor.detach().to(device=target.device, dtype=target.dtype))
            copied += 1
    return copied
