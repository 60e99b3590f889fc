"""``vllm``: an in-process vLLM engine for GPUs (``pip install 'rlcore[vllm]'``, vLLM 0.10.2–0.33).

Built on vLLM's offline API: ``vllm.LLM(**engine_args)``, ``LLM.generate`` with
``TokensPrompt(prompt_token_ids=…)`` and one ``vllm.SamplingParams`` per prompt (``logprobs=0``
returns the sampled token's logprob), ``LLM.sleep(level)`` / ``LLM.wake_up(tags)`` (engine created
with ``enable_sleep_mode=True``), ``LLM.reset_prefix_cache()`` and ``LLM.collective_rpc`` to run
rlcore's worker extension (:mod:`rlcore.sampling.vllm.worker`). Concurrent ``generate`` calls are
gathered by arrival (the same :class:`~rlcore.sampling.batcher.MicroBatcher` as ``hf``) into one
``LLM.generate`` call, inside which vLLM batches continuously.

What a GPU user would otherwise hit first, and how it is handled (details in ``docs/samplers.md``):

- weights cross to the engine process as safetensors buckets in ``/dev/shm`` named by path
  (:mod:`~rlcore.sampling.vllm.worker` says why tensors cannot be passed through ``collective_rpc``);
- every request is checked against the shared logprob semantics
  (:func:`~rlcore.sampling.vllm.support.logprob_mismatch`) and built into its own
  ``vllm.SamplingParams`` before it joins a batch, so one bad request fails alone;
- sleep state is tracked: generating while asleep fails at once instead of queueing behind a lock,
  ``update_weights`` while asleep wakes the weights first, and after ``sleep(level=2)`` generation
  is refused until ``update_weights`` reloads them;
- ``close()`` shuts the engine core down and frees its GPU memory.

The argument mapping and the output conversion are plain functions (:func:`engine_kwargs`,
:func:`sampling_kwargs`, :func:`request_output_to_completions`) so they are tested without vLLM.
This module imports vLLM only when a sampler is constructed.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import threading
import time
from typing import Any

import attrs

from ...errors import MissingDependencyError, SamplerError
from ...types import Completion, SamplingParams
from ..base import Sampler, WeightsLike
from ..batcher import MicroBatcher
from .support import (
    MAX_VERSION_EXCLUSIVE,
    MIN_VERSION,
    PROCESSED,
    RAW,
    SUPPORTED_RANGE,
    SleepState,
    SleepStateMixin,
    logprob_mismatch,
    parse_version,
)
from ..weights import DEFAULT_BUCKET_BYTES, RPC_LOAD_FROM_PATH, default_sync_dir, sync_in_buckets

log = logging.getLogger(__name__)

WORKER_EXTENSION = "rlcore.sampling.vllm.worker.WeightSyncExtension"
INSTALL_HINT = "the vllm sampler needs vLLM, which is not installed: pip install 'rlcore[vllm]'"
#: colocated with a trainer that holds GPU memory (TRL's colocate default is 0.3 too)
DEFAULT_GPU_MEMORY_UTILIZATION = 0.3


def engine_kwargs(
    model: str,
    *,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_model_len: int | None = None,
    tensor_parallel_size: int = 1,
    enable_sleep_mode: bool = True,
    enable_prefix_caching: bool = True,
    dtype: str = "auto",
    seed: int = 0,
    logprobs_mode: str | None = PROCESSED,
    tokenizer: str | None = None,
    engine_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM``: seed 001's engine args plus what RL needs.

    ``logprobs_mode="processed_logprobs"`` asks vLLM (>= 0.10.2) for logprobs after temperature
    scaling (vLLM's default, ``raw_logprobs``, is the untempered model distribution); ``None``
    leaves vLLM's default. ``engine_args`` are passed through last and win.
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
        if o.finish_reason not in (None, "stop", "length"):
            raise SamplerError(f"vllm sampler: request {getattr(output, 'request_id', '?')} ended with finish_reason={o.finish_reason!r}")
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


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


@attrs.define
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    sampling: Any  # the request's own vllm.SamplingParams, validated before batching


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise MissingDependencyError(INSTALL_HINT) from exc
    return vllm


class VLLMSampler(SleepStateMixin, Sampler):
    """Generation with an in-process ``vllm.LLM``.

    Args:
        model: a model directory / hub id, or an ``nn.Module`` (its ``name_or_path`` is loaded and
            its current weights are synced in).
        tokenizer: tokenizer path (default: the model's).
        gpu_memory_utilization: the engine's share of GPU memory; 0.3 by default because the
            sampler is colocated with a trainer that holds the rest (raise it on a GPU of its own).
        max_model_len, tensor_parallel_size, enable_sleep_mode, dtype, seed, logprobs_mode: vLLM
            engine args (see :func:`engine_kwargs`).
        engine_args: any further ``vllm.LLM`` keyword arguments.
        batch_window_ms, max_batch_size: how concurrent calls are gathered into one ``generate``.
        sync_dir: where weight buckets are written for the workers (default a fresh ``/dev/shm`` dir).
        bucket_bytes: most bytes of weights in flight per ``collective_rpc`` call.
    """

    name = "vllm"

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
        max_model_len: int | None = None,
        tensor_parallel_size: int = 1,
        enable_sleep_mode: bool = True,
        dtype: str = "auto",
        seed: int = 0,
        logprobs_mode: str | None = PROCESSED,
        engine_args: dict[str, Any] | None = None,
        batch_window_ms: float = 5.0,
        max_batch_size: int = 1024,
        sync_dir: str | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        **opts: Any,
    ) -> None:
        self._vllm = _import_vllm()
        self.vllm_version = parse_version(getattr(self._vllm, "__version__", None))
        if self.vllm_version is not None and self.vllm_version < MIN_VERSION:
            raise SamplerError(
                f"vllm sampler needs vLLM {SUPPORTED_RANGE}, found {self._vllm.__version__}: pip install 'rlcore[vllm]'"
            )
        if self.vllm_version is not None and self.vllm_version >= MAX_VERSION_EXCLUSIVE:
            log.warning("vllm sampler: vLLM %s is newer than the checked range %s", self._vllm.__version__, SUPPORTED_RANGE)
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
        self.enable_sleep_mode = bool(kw.get("enable_sleep_mode"))
        try:
            self.llm = self._vllm.LLM(**kw)
        except Exception as exc:  # noqa: BLE001 - engine start-up errors become one line
            raise SamplerError(f"vllm sampler could not start the engine for {model!r}: {_first_line(exc)}") from exc
        self.tokenizer = tokenizer if tokenizer is not None and tok_path is None else self.llm.get_tokenizer()
        self.logprobs_mode = kw.get("logprobs_mode") or RAW
        self.sync_dir = sync_dir
        self._own_sync_dir = sync_dir is None
        self.bucket_bytes = max(1, int(bucket_bytes))
        self._lock = threading.RLock()
        self._closed = False
        # sleep state: what is offloaded/discarded right now (vLLM's sleep tags: "weights", "kv_cache")
        self._sleep = SleepState()
        self._batcher: MicroBatcher[_Request] = MicroBatcher(
            self._run_batch, window_s=batch_window_ms / 1000.0, max_batch_size=max_batch_size, name="vllm sampler"
        )
        if module is not None:
            self.update_weights(module.state_dict())
            self.policy_version = 0

    # --- generation ------------------------------------------------------------------------------------
    def _check_awake(self) -> None:
        if self._closed:
            raise SamplerError("vllm sampler is closed; create a new sampler")
        if self._sleep:
            raise SamplerError(
                f"vllm sampler is asleep (sleep(level={self.sleep_level})); call wake_up() before generating"
            )
        if self._sleep.weights_discarded:
            raise SamplerError(
                "vllm sampler: sleep(level=2) discarded the weights; call update_weights(full state dict) before generating"
            )

    def build_request(self, prompt_ids: list[int], params: SamplingParams) -> _Request:
        """Validate one request on its own: the shared logprob semantics, then vLLM's SamplingParams."""
        if not prompt_ids:
            raise SamplerError("vllm sampler got an empty prompt; encode at least one token")
        mismatch = logprob_mismatch(params, self.logprobs_mode, self.vllm_version)
        if mismatch:
            raise SamplerError(f"vllm sampler: {mismatch}")
        try:
            sampling = self._vllm.SamplingParams(**sampling_kwargs(params))
        except Exception as exc:  # noqa: BLE001 - vLLM validates in __post_init__ with ValueError
            raise SamplerError(f"vllm sampler: vLLM rejected the sampling parameters: {_first_line(exc)}") from exc
        return _Request(list(prompt_ids), params, sampling)

    def _generate(self, requests: list[_Request]) -> list[Any]:
        prompts = [self._vllm.TokensPrompt(prompt_token_ids=r.prompt_ids) for r in requests]
        return self.llm.generate(prompts, [r.sampling for r in requests], use_tqdm=False)

    def _run_batch(self, requests: list[_Request]) -> list[Any]:
        with self._lock:
            try:
                self._check_awake()  # sleep() may have won the lock since these were queued
            except SamplerError as exc:
                return [exc] * len(requests)
            meta = {"policy_version": self.policy_version, "logprobs_mode": self.logprobs_mode}
            try:
                outputs = self._generate(requests)
            except Exception as exc:  # noqa: BLE001 - one bad prompt must not fail the batch
                if len(requests) == 1:
                    return [SamplerError(f"vllm sampler: generation failed: {_first_line(exc)}")]
                outputs = []
                for r in requests:  # vLLM validates prompts inside generate: run each alone to find it
                    try:
                        outputs.append(self._generate([r])[0])
                    except Exception as one:  # noqa: BLE001
                        outputs.append(SamplerError(f"vllm sampler: generation failed: {_first_line(one)}"))
        results: list[Any] = []
        for o in outputs:
            if isinstance(o, BaseException):
                results.append(o)
                continue
            try:
                results.append(request_output_to_completions(o, meta))
            except SamplerError as exc:
                results.append(exc)
        return results

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        return (await self.generate_n(prompt_ids, params.replace(n=1)))[0]

    async def generate_n(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        self._check_awake()
        return await self._batcher.submit_async(self.build_request(prompt_ids, params))

    # --- weights and engine state --------------------------------------------------------------------
    def update_weights(self, weights: WeightsLike, *, lora: bool = False, version: int | None = None) -> None:
        """Load new weights on every worker through the model's ``load_weights`` (bucket by bucket,
        as files named by path; see :mod:`rlcore.sampling.vllm.worker`), then drop the prefix cache
        (its KV blocks were computed with the old weights). Asleep, the weights are woken first (the
        KV cache stays asleep until :meth:`wake_up`), as writing into offloaded memory is undefined."""
        if lora:
            raise SamplerError("vllm sampler syncs full weights; merge LoRA adapters (merge_and_unload) before syncing")
        with self._lock:
            if self._closed:
                raise SamplerError("vllm sampler is closed; create a new sampler")
            if "weights" in self._sleep.parts:
                self._call("wake_up", tags=["weights"])
                self._sleep.parts.discard("weights")
            if self.sync_dir is None:
                self.sync_dir = default_sync_dir()
            sync_in_buckets(weights, directory=self.sync_dir, bucket_bytes=self.bucket_bytes,
                            load=lambda path: self._call("collective_rpc", RPC_LOAD_FROM_PATH, args=(path,)),
                            who="vllm sampler", hint=f"is worker_extension_cls={WORKER_EXTENSION}?")
            self._sleep.weights_discarded = False
            self._reset_prefix_cache_locked()
            self._advance_version(version)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self.llm, method)(*args, **kwargs)
        except SamplerError:
            raise
        except Exception as exc:  # noqa: BLE001 - engine errors become one line
            raise SamplerError(f"vllm sampler: LLM.{method} failed: {_first_line(exc)}") from exc

    def _reset_prefix_cache_locked(self, attempts: int = 4) -> None:
        # vLLM >= 0.13 can preempt running requests so their blocks can be freed; older versions
        # answer False while any block is held. Under our lock no generate of ours is running.
        kwargs = {"reset_running_requests": True} if self.vllm_version is None or self.vllm_version >= (0, 13, 0) else {}
        for attempt in range(attempts):
            if self._call("reset_prefix_cache", **kwargs) is not False:
                return
            time.sleep(0.05 * 2 ** attempt)
        raise SamplerError(
            "vllm sampler: vLLM refused to reset its prefix cache (blocks still held by running requests); "
            "KV blocks computed with the old weights would be reused"
        )

    def reset_prefix_cache(self) -> None:
        with self._lock:
            self._reset_prefix_cache_locked()

    def sleep(self, level: int = 1) -> None:
        """Offload (level 1) or discard (level 2) the weights and drop the KV cache; waits for the
        running batch. After level 2, :meth:`update_weights` with the full state dict must run
        before the next generation."""
        if level not in (1, 2):
            raise SamplerError(f"vllm sampler: sleep level must be 1 or 2, got {level}")
        if not self.enable_sleep_mode:
            raise SamplerError("vllm sampler: sleep() needs enable_sleep_mode=True")
        with self._lock:
            if self._sleep:
                return
            self._call("sleep", level=level)
            self._sleep.fell_asleep(level)

    def wake_up(self) -> None:
        with self._lock:
            if not self._sleep:
                return
            tags = self._sleep.wake_tags()
            if tags is None:
                self._call("wake_up")
            else:  # update_weights already woke the weights
                self._call("wake_up", tags=tags)
            self._sleep.woke()

    async def close(self) -> None:
        """Finish the running batch, fail queued requests, shut the engine down (off the event loop)."""
        import asyncio

        await asyncio.to_thread(self._shutdown)

    def _shutdown(self) -> None:
        self._batcher.close()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            llm, self.llm = self.llm, None
        engine = getattr(llm, "llm_engine", None)
        for owner in (getattr(engine, "engine_core", None), engine, llm):  # V1: the engine-core client
            shutdown = getattr(owner, "shutdown", None)
            if callable(shutdown):
                try:
                    shutdown()
                except Exception as exc:  # noqa: BLE001 - closing must not raise on a dying engine
                    log.warning("vllm sampler: engine shutdown failed: %s", _first_line(exc))
                break
        del llm, engine
        gc.collect()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:  # pragma: no cover - torch is a dependency
            pass
        if self._own_sync_dir and self.sync_dir:
            shutil.rmtree(self.sync_dir, ignore_errors=True)
