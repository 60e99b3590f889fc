"""The transformers sampler: :mod:`.sampler` (:class:`HFSampler`, micro-batched generation in
process), and its decode loops: :mod:`.decode` (the dynamic-cache loop and the shared host
protocol), :mod:`.static` (a static KV cache with slot reuse), :mod:`.fused` (a fused Llama/Qwen
decode step). ``rlcore.sampling.hf.HFSampler`` works as it did when this was one module.
"""

from __future__ import annotations

from ..base import attributes_of

__getattr__ = attributes_of(__name__, "sampler")
