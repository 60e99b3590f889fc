"""Built-in sampler backends, registered like any third-party plugin's.

Factories are ``"module:attr"`` strings so listing samplers imports neither torch nor vLLM; the
``vllm`` backend is listed even where vLLM is not installed and says how to install it when used.
"""

from __future__ import annotations

from typing import Callable

from ..hookspecs import hookimpl


@hookimpl
def register_samplers(register: Callable[..., None]) -> None:
    register("hf", "rlcore.sampling.hf:HFSampler", aliases=("transformers",),
             description="transformers model in-process, micro-batched; CPU or GPU")
    register("vllm", "rlcore.sampling.vllm:VLLMSampler",
             description="in-process vLLM engine (GPU); pip install 'rlcore[vllm]'")
    register("openai", "rlcore.sampling.openai:OpenAISampler", aliases=("vllm_server",),
             description="a vLLM / OpenAI-compatible server over HTTP (/v1/completions, token ids)")
