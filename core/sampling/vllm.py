"""``vllm``: an in-process vLLM engine for GPUs (``pip install 'rlcore[vllm]'``).

Built on vLLM's documented offline API: ``vllm.LLM(**engine_args)``, ``LLM.generate`` with
``TokensPrompt(prompt_token_ids=…)`` and one ``vllm.SamplingParams`` per prompt (``logprobs=0``
returns the sampled token's logprob), ``LLM.sleep(level)`` / ``LLM.wake_up()`` (engine created with
``enable_sleep_mode=True``), ``LLM.reset_prefix_cache()`` and ``LLM.collective_rpc`` to run
rlcore's worker extension (:mod:`rlcore.sampling.vllm_worker`) that feeds new weights to the
model's own ``load_weights``. Concurrent ``generate`` calls are gathered by arrival (the same
:class:`~rlcore.sampling.batcher.MicroBatcher` as ``hf``) into one ``LLM.generate`` call, inside
which vLLM batches continuously.

The argument mapping and the output conversion are plain functions (:func:`engine_kwargs`,
:func:`sampling_kwargs`, :func:`request_output_to_completions`) so they are tested without vLLM.
This module imports vLLM only when a sampler is constructed.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Iterable

import attrs

from ..errors import MissingDependencyError, SamplerError
from ..types import Completion, SamplingParams
from .base import Sampler, WeightsLike
from .batcher import MicroBatcher

WORKER_EXTENSION = "rlcore.sampling.vllm_worker.WeightSyncExtension"
INSTALL_HINT = "the vllm sampler needs vLLM, which is not installed: pip install 'rlcore[vllm]'"


def engine_kwargs(
    model: str,
    *,
    gpu_memory_utilization: float = 0.9,
    max_model_len: int | None = None,
    tensor_parallel_size: int = 1,
    enable_sleep_mode: bool = True,
    enable_prefix_caching: bool = True,
    dtype: str = "auto",
    seed: int = 0,
    logprobs_mode: str | None = "processed_logprobs",
    tokenizer: str | None = None,
    engine_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM``: seed 001's engine args plus what RL needs.

    ``logprobs_mode="processed_logprobs"`` asks vLLM for logprobs after temperature scaling (vLLM's
    default, ``raw_logprobs``, is the untempered model distribution); ``None`` leaves vLLM's default.
    ``engine_args`` are passed through last and win.
    """
    kw: dict[str, Any] = {
        "model": model,
        "gpu_memory_utilization": gpu_memory_utilization,
        "tensor_parallel_size": tensor_parallel_size,
        "enable_sleep_mode": enable_sleep_mode,
        "enable_prefix_caching": enable_prefix_caching,
        "dtype": dtype,
        "seed": seed,
        "worker_extension_cls": WORKER_EXTENSION,
    }
    if max_model_len is not None:
        kw["max_model_len"] = max_model_len
    if logprobs_mode is not None:
        kw["logprobs_mode"] = logprobs_mode
    if tokenizer is not None:
        kw["tokenizer"] = tokenizer
    kw.update(engine_args or {})
    return kw


def sampling_kwargs(params: SamplingParams) -> dict[str, Any]:
    """Keyword arguments for ``vllm.SamplingParams`` from ours."""
    kw: dict[str, Any] = {
        "n": params.n,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k and params.top_k > 0 else -1,
        "min_p": params.min_p,
        "repetition_penalty": params.repetition_penalty,
        "min_tokens": params.min_tokens,
        "stop": list(params.stop),
        "stop_token_ids": list(params.stop_token_ids),
        "logprobs": 0,  # 0: just the sampled token's logprob
        "skip_special_tokens": False,
        "include_stop_str_in_output": False,
    }
    if params.seed is not None:
        kw["seed"] = params.seed
    return kw


def _token_logprob(entry: Any, token_id: int) -> float | None:
    """The logprob of ``token_id`` in one position's ``{token_id: Logprob}`` dict (or a float)."""
    if entry is None:
        return None
    if isinstance(entry, (int, float)):
        return float(entry)
    item = entry.get(token_id) if hasattr(entry, "get") else None
    if item is None:
        return None
    return float(getattr(item, "logprob", item))


def request_output_to_completions(output: Any, meta: dict[str, Any] | None = None) -> list[Completion]:
    """A vLLM ``RequestOutput`` (``.outputs``: ``CompletionOutput``\\ s) as Completions, by index."""
    completions = []
    for o in sorted(output.outputs, key=lambda c: getattr(c, "index", 0)):
        ids = [int(t) for t in o.token_ids]
        lps: list[float] | None = None
        if getattr(o, "logprobs", None) is not None and len(o.logprobs) == len(ids):
            vals = [_token_logprob(entry, t) for entry, t in zip(o.logprobs, ids)]
            lps = None if any(v is None for v in vals) else vals  # type: ignore[assignment]
        m = dict(meta or {})
        if getattr(o, "stop_reason", None) is not None:
            m["stop"] = o.stop_reason
        m["request_id"] = getattr(output, "request_id", None)
        completions.append(
            Completion(token_ids=ids, logprobs=lps, finish_reason=o.finish_reason or "length", text=o.text or "", meta=m)
        )
    return completions


@attrs.define
class _Request:
    prompt_ids: list[int]
    params: SamplingParams


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise MissingDependencyError(INSTALL_HINT) from exc
    return vllm


class VLLMSampler(Sampler):
    """Generation with an in-process ``vllm.LLM``.

    Args:
        model: a model directory / hub id, or an ``nn.Module`` (its ``name_or_path`` is loaded and
            its current weights are synced in).
        tokenizer: tokenizer path (default: the model's).
        gpu_memory_utilization, max_model_len, tensor_parallel_size, enable_sleep_mode, dtype,
        seed, logprobs_mode: vLLM engine args (see :func:`engine_kwargs`).
        engine_args: any further ``vllm.LLM`` keyword arguments.
        batch_window_ms, max_batch_size: how concurrent calls are gathered into one ``generate``.
    """

    name = "vllm"

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
        tensor_parallel_size: int = 1,
        enable_sleep_mode: bool = True,
        dtype: str = "auto",
        seed: int = 0,
        logprobs_mode: str | None = "processed_logprobs",
        engine_args: dict[str, Any] | None = None,
        batch_window_ms: float = 5.0,
        max_batch_size: int = 1024,
        **opts: Any,
    ) -> None:
        self._vllm = _import_vllm()
        module = None
        if not isinstance(model, (str, os.PathLike)):
            module = model
            model = getattr(getattr(model, "config", None), "_name_or_path", None)
            if not model:
                raise SamplerError("vllm sampler needs a model path; this module has no config._name_or_path")
        tok_path = tokenizer if isinstance(tokenizer, (str, os.PathLike)) else None
        kw = engine_kwargs(
            str(model), gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
            tensor_parallel_size=tensor_parallel_size, enable_sleep_mode=enable_sleep_mode, dtype=dtype, seed=seed,
            logprobs_mode=logprobs_mode, tokenizer=str(tok_path) if tok_path else None,
            engine_args={**(engine_args or {}), **opts},
        )
        try:
            self.llm = self._vllm.LLM(**kw)
        except Exception as exc:  # noqa: BLE001 - engine start-up errors become one line
            raise SamplerError(f"vllm sampler could not start the engine for {model!r}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
        self.tokenizer = tokenizer if tokenizer is not None and tok_path is None else self.llm.get_tokenizer()
        self.logprobs_mode = logprobs_mode
        self._lock = threading.RLock()
        self._batcher: MicroBatcher[_Request] = MicroBatcher(
            self._run_batch, window_s=batch_window_ms / 1000.0, max_batch_size=max_batch_size, name="vllm sampler"
        )
        if module is not None:
            self.update_weights(module.state_dict())
            self.policy_version = 0

    def _run_batch(self, requests: list[_Request]) -> list[Any]:
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=r.prompt_ids) for r in requests]
        sps = [self._vllm.SamplingParams(**sampling_kwargs(r.params)) for r in requests]
        with self._lock:
            outputs = self.llm.generate(prompts, sps, use_tqdm=False)
        meta = {"policy_version": self.policy_version, "logprobs_mode": self.logprobs_mode}
        return [request_output_to_completions(o, meta) for o in outputs]

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        return (await self.generate_n(prompt_ids, params.replace(n=1)))[0]

    async def generate_n(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        if not prompt_ids:
            raise SamplerError("vllm sampler got an empty prompt; encode at least one token")
        return await self._batcher.submit_async(_Request(list(prompt_ids), params))

    def update_weights(self, weights: WeightsLike, *, lora: bool = False) -> None:
        """Load new weights on every worker through the model's ``load_weights``, then drop the
        prefix cache (its KV blocks were computed with the old weights)."""
        if lora:
            raise SamplerError("vllm sampler syncs full weights; merge LoRA adapters (merge_and_unload) before syncing")
        items: Iterable[tuple[str, Any]] = weights.items() if hasattr(weights, "items") else weights
        payload = [(n, t.detach()) for n, t in items]
        with self._lock:
            self.llm.collective_rpc("rlcore_load_weights", args=(payload,))
            self.llm.reset_prefix_cache()
            self.policy_version += 1

    def reset_prefix_cache(self) -> None:
        with self._lock:
            self.llm.reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        with self._lock:
            self.llm.sleep(level=level)

    def wake_up(self) -> None:
        with self._lock:
            self.llm.wake_up()

    async def close(self) -> None:
        """Finish the running batch, fail queued requests, stop the worker (off the event loop)."""
        import asyncio

        await asyncio.to_thread(self._batcher.close)
