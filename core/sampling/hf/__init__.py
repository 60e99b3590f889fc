"""The transformers sampler: :mod:`.sampler` (:class:`HFSampler`, micro-batched generation in
process), and its decode loops: :mod:`.decode` (the dynamic-cache loop and the shared host
protocol), :mod:`.static` (a static KV cache with slot reuse), :mod:`.fused` (a fused Llama/Qwen
decode step). ``rlcore.sampling.hf.HFSampler`` works as it did when this was one module.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    import importlib

    sampler = importlib.import_module(__name__ + ".sampler")

    try:
        return getattr(sampler, name)
    except AttributeError:
        raise AttributeError(f"module 'rlcore.sampling.hf' has no attribute {name!r}") from None
