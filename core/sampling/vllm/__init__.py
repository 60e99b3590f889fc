"""The vLLM sampler: :mod:`.engine` (:class:`VLLMSampler`, an in-process engine), :mod:`.worker`
(the worker extension that loads synced weights inside vLLM's workers), :mod:`.support` (what each
vLLM version we claim calls things). Importing this package does not import vLLM;
``rlcore.sampling.vllm.VLLMSampler`` works as it did when this was one module.
"""

from __future__ import annotations

from ..base import attributes_of

__getattr__ = attributes_of(__name__, "engine")
