"""The vLLM sampler: :mod:`.engine` (:class:`VLLMSampler`, an in-process engine), :mod:`.worker`
(the worker extension that loads synced weights inside vLLM's workers), :mod:`.support` (what each
vLLM version we claim calls things). Importing this package does not import vLLM;
``rlcore.sampling.vllm.VLLMSampler`` works as it did when this was one module.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    import importlib

    engine = importlib.import_module(__name__ + ".engine")

    try:
        return getattr(engine, name)
    except AttributeError:
        raise AttributeError(f"module 'rlcore.sampling.vllm' has no attribute {name!r}") from None
