"""Token-in / token-out generation backends. See :class:`rlcore.sampling.base.Sampler`.

Backends are imported lazily (``rlcore.sampling.HFSampler`` loads torch only when touched).
"""

from __future__ import annotations

from typing import Any

from .base import Sampler, WeightsLike

__all__ = ["HFSampler", "OpenAISampler", "Sampler", "VLLMSampler", "WeightsLike", "make_sampler"]

_LAZY = {
    "HFSampler": "rlcore.sampling.hf.sampler",
    "VLLMSampler": "rlcore.sampling.vllm.engine",
    "OpenAISampler": "rlcore.sampling.openai",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rlcore.sampling' has no attribute {name!r}")


def make_sampler(name: str, **kwargs: Any) -> Sampler:
    """Build the sampler registered as ``name`` (``hf``, ``vllm``, ``openai``/``vllm_server`` or a plugin's)."""
    from ..plugins import get

    return get("sampler", name)(**kwargs)
