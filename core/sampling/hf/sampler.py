"""``hf``: the embedded transformers backend — runs anywhere torch runs, CPU included.

Concurrent ``generate`` calls (64 trajectories of a rollout each waiting on their next turn) are
gathered by arrival into one left-padded batch and decoded together by our own loop over the
model's forward with a KV cache (:mod:`rlcore.sampling.hf.decode`): a finished row is answered at
once and leaves the batch, a request arriving mid-batch joins it at the next step. Our own loop
rather than ``model.generate`` because every row has its own sampling parameters and seed, and
the logprob of each sampled token comes out of the same logits that drew it (semantics in
:mod:`rlcore.sampling.processing`).

On CUDA the decode loop is the static one (:mod:`rlcore.sampling.hf.static`): a KV cache allocated
once, each step (sampling included) captured as a CUDA graph per batch-size bucket and replayed with
one launch, the host one step behind. On the CPU the dynamic loop stays (it is faster there: no
padding to a fixed cache length); ``decode="static"`` runs the static path anywhere, eagerly off CUDA.

Weight sync is an in-place copy into the model; when the sampler was given the trainer's own
``nn.Module`` (colocated on one device) the parameters are shared and there is nothing to copy.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ...chat_template import check_vocabulary
from ...errors import ConfigError, SamplerError
from ...gguf import resolve_model
from ...types import Completion, SamplingParams
from ..base import Sampler, WeightsLike
from ..batcher import BatchHandle, MicroBatcher
from .decode import Request
from ..stops import StopChecker, default_stop_ids


#: forwards below this many FLOPs (~2 x parameters x new tokens) run on one CPU thread: OpenMP's
#: fork/join per op costs more than it saves there, and far more when the cores are shared
PARALLEL_MIN_FLOPS = 2e8


class HFSampler(Sampler):
    """Generation with a transformers causal LM, micro-batched across concurrent requests.

    Args:
        model: a HF model directory / hub id (loaded here; the sampler owns it) or an ``nn.Module``
            (used as is — pass the trainer's module to share weights with no copy).
        tokenizer: a tokenizer or a path; defaults to the model's directory.
        device: where to run (default: the module's device, else CUDA when available, else CPU).
        dtype: ``torch.dtype`` or name for a model loaded from a path (default float32 on CPU,
            bfloat16 on CUDA). Ignored for a given module.
        batch_window_ms: a new batch closes once no request arrived for this long (the window
            restarts on each arrival, so a trickle of requests is gathered rather than split).
        max_batch_wait_ms: the most the first request of a new batch waits (default 4 windows).
        join_window_ms: requests arriving while a batch decodes are gathered until the oldest has
            waited this long (or they fill every free row), then prefilled together and merged
            into the batch: one extra forward per group of joiners, not per joiner.
        max_batch_size: the most sequences decoded together.
        max_model_len: prompt + completion limit (default: the model's ``max_position_embeddings``).
        seed: seeds the generator used by requests without their own seed.
        decode: ``"auto"`` (static cache + CUDA graphs on CUDA when the model is full-attention,
            else the dynamic loop), ``"static"`` (the static path; eager off CUDA) or ``"dynamic"``.
        cuda_graphs: capture the static path's steps as CUDA graphs (False: run them eagerly —
            for debugging; the results are the same).
        fused_decode: on the static path, run Llama-family models (llama, mistral, qwen2, qwen3) through
            :mod:`~rlcore.sampling.hf.fused`, a decode forward in ~16 kernels per layer instead of ~44
            (False: the model's own forward; same function, float rounding apart).
        pack_projections: let the fused forward stack q/k/v and gate/up weights into one matmul each
            (~4 fewer kernels per layer), in copies refreshed before every batch. None (default):
            when the copies fit in 10% of the GPU's memory (1 GiB on the CPU); True/False: always/never.
        num_threads: CPU threads every forward of the decode loop uses (set on the sampler's worker
            thread only). Default on CPU: small forwards (decode steps, a few joiners' prefill —
            under ``PARALLEL_MIN_FLOPS``) run on one thread and larger ones on every core the process
            may use. Why one thread for small ones: an OpenMP op whose threads are descheduled stalls
            on its barrier — small forwards on 2 threads next to another torch process were measured
            15-40x slower than on 1. Why every core for large ones: on SmolLM2-135M at 16 rows, 2
            threads decode 1.5x faster than 1 on an idle 2-core machine, and still 1.3x faster with
            a GIL-holding Python thread busy half the time beside them (an event loop templating and
            tokenising); the rule once kept a core for the event loop, and halved a 2-core machine
            for it. The count depends on the batch only, never on the machine's load, so a run
            samples the same tokens whatever else the host is doing. On a host shared with other
            torch processes, pass ``num_threads=1``.
    """

    name = "hf"
    shares_trainer_module = True  # make_sampler hands it the trainer's own module: colocated, no sync

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        device: Any = None,
        dtype: Any = None,
        batch_window_ms: float = 5.0,
        max_batch_wait_ms: float | None = None,
        join_window_ms: float = 5.0,
        max_batch_size: int = 64,
        max_model_len: int | None = None,
        seed: int | None = None,
        num_threads: int | None = None,
        decode: str = "auto",
        cuda_graphs: bool = True,
        fused_decode: bool = True,
        pack_projections: bool | None = None,
        **opts: Any,
    ) -> None:
        import torch

        if opts:
            raise ConfigError(
                f"hf sampler got unknown options: {', '.join(sorted(opts))}; it takes device, dtype, "
                "batch_window_ms, max_batch_wait_ms, join_window_ms, max_batch_size, max_model_len, seed, num_threads, "
                "decode, cuda_graphs, fused_decode, pack_projections"
            )
        if decode not in ("auto", "static", "dynamic"):
            raise ConfigError(f"hf sampler decode must be auto, static or dynamic, got {decode!r}")
        self.owns_model = isinstance(model, (str, os.PathLike))
        model = resolve_model(model)  # a .gguf file: its converted float32 directory
        tokenizer = resolve_model(tokenizer)
        if self.owns_model:
            self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
            self.model = _load_model(str(model), self.device, dtype)
        else:
            if not isinstance(model, torch.nn.Module):
                raise ConfigError(f"HFSampler model must be a path or a torch nn.Module, got {type(model).__name__}")
            self.model = model
            self.device = torch.device(device) if device is not None else _module_device(model)
        if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = _load_tokenizer(tokenizer or (str(model) if self.owns_model else _name_or_path(model)))
        self.tokenizer = tokenizer
        config = getattr(self.model, "config", None)
        self.max_model_len = int(max_model_len or getattr(config, "max_position_embeddings", 0) or 1 << 30)
        self.vocab_size = int(getattr(config, "vocab_size", 0) or len(tokenizer))
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad if pad is not None else (getattr(tokenizer, "eos_token_id", None) or 0))
        self.default_stop_token_ids = default_stop_ids(tokenizer, self.model)
        self.cache_kwarg = _cache_kwarg(self.model)
        self._rng = torch.Generator().manual_seed(seed if seed is not None else int.from_bytes(os.urandom(4), "little"))
        self._lock = threading.RLock()  # a batch and a weight load never overlap
        self._asleep = False
        self.num_threads = num_threads
        self._n_params = sum(p.numel() for p in self.model.parameters())
        self._cores = _usable_cores()
        self.join_window_s = max(0.0, join_window_ms / 1000.0)
        self.decode_mode = decode
        self.cuda_graphs = cuda_graphs
        self.fused_decode = fused_decode
        self.pack_projections = pack_projections
        self._engine: Any = None  # the static path's cache and graphs, built on first use
        self.prefill_dedup = True  # identical prompts prefilled once (decode.prefill turns it off if the cache cannot)
        from .static import static_eligible

        why = static_eligible(self.model) if decode != "dynamic" else None
        if why and decode == "static":
            raise ConfigError(f"hf sampler decode='static' cannot serve this model: {why}; use decode='auto' or 'dynamic'")
        self._static_ok = decode == "static" or (decode == "auto" and why is None and self.device.type == "cuda")
        self._batcher: MicroBatcher[Request] = MicroBatcher(
            self._run_batch, window_s=batch_window_ms / 1000.0, max_batch_size=max_batch_size, name="hf sampler",
            max_wait_s=None if max_batch_wait_ms is None else max_batch_wait_ms / 1000.0, streaming=True,
        )

    # --- the protocol ---------------------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        """One completion; concurrent calls are batched together."""
        self._check_request(prompt_ids, params)
        return await self._batcher.submit_async(Request(list(prompt_ids), params))

    def generate_sync(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        """Blocking form for scripts and benchmarks."""
        self._check_request(prompt_ids, params)
        return self._batcher.submit(Request(list(prompt_ids), params)).result()

    def update_weights(self, weights: WeightsLike, *, lora: bool = False, version: int | None = None) -> None:
        """Copy new weights into the model in place (waits for the running batch to finish)."""
        from ..weights import load_weights_into

        with self._lock:
            load_weights_into(self.model, weights, lora=lora)
            self._advance_version(version)

    def sleep(self, level: int = 1) -> None:
        """Free what generation holds while the trainer works: the static path's KV cache, sampling
        state and CUDA graphs (rebuilt at the next batch), and an owned model's GPU copy (moved to
        the CPU; ``level`` 1 and 2 alike — a shared module stays where the trainer keeps it). Waits
        for the running batch; until :meth:`wake_up`, generation is refused."""
        import torch

        if level not in (1, 2):
            raise SamplerError(f"hf sampler: sleep level must be 1 or 2, got {level}")
        with self._lock:
            if self._asleep:
                return
            # the static cache and the graphs go back to torch's allocator, where the training step
            # in this process reuses them; an owned model's weights leave the GPU altogether
            self._engine = None
            if self.owns_model and self.device.type != "cpu":
                self.model.to("cpu")
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            self._asleep = True

    def wake_up(self) -> None:
        with self._lock:
            if self._asleep:
                if self.owns_model and self.device.type != "cpu":
                    self.model.to(self.device)
                self._asleep = False

    @property
    def is_sleeping(self) -> bool:
        return self._asleep

    async def close(self) -> None:
        """Finish the running batch, fail queued requests, stop the worker (off the event loop)."""
        import asyncio

        await asyncio.to_thread(self._batcher.close)

    @property
    def max_batch_size(self) -> int:
        """The most sequences decoded together (the decode loops size their batches by it)."""
        return self._batcher.max_batch_size

    @property
    def batch_sizes(self) -> list[int]:
        """Sizes of the batches decoded so far (how well concurrent requests were gathered)."""
        return self._batcher.batch_sizes

    # --- the decode loop ----------------------------------------------------------------------------
    def _check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if not prompt_ids:
            raise SamplerError("hf sampler got an empty prompt; encode at least one token")
        if params.max_tokens < 1:
            raise SamplerError(f"max_tokens must be at least 1, got {params.max_tokens}")
        if len(prompt_ids) >= self.max_model_len:
            raise SamplerError(
                f"prompt of {len(prompt_ids)} tokens leaves no room under max_model_len={self.max_model_len}; shorten it"
            )
        bad = [t for t in prompt_ids if not 0 <= int(t) < self.vocab_size]
        if bad:
            raise SamplerError(f"prompt token id {bad[0]} is outside the model's vocabulary of {self.vocab_size}")
        if self._asleep:
            raise SamplerError("hf sampler is asleep; call wake_up() before generating")

    def set_threads_for(self, tokens: int) -> None:
        """Pick the intra-op threads for a forward over ``tokens`` new tokens (see ``num_threads``)."""
        import torch

        if self.device.type != "cpu":
            return
        if self.num_threads:
            want = self.num_threads
        elif 2 * self._n_params * tokens < PARALLEL_MIN_FLOPS:
            want = 1
        else:
            want = self._cores
        if torch.get_num_threads() != want:
            torch.set_num_threads(want)  # per-thread: the worker's setting only

    def _run_batch(self, handle: BatchHandle[Request]) -> None:
        import torch

        from .decode import Decoder
        from .static import NotStatic, StaticDecoder, StaticEngine

        with self._lock, torch.inference_mode():
            if self._asleep:  # queued before sleep() took the lock
                raise SamplerError("hf sampler is asleep; call wake_up() before generating")
            # eval for the duration: no dropout, no gradient checkpointing (it would drop the KV
            # cache); a shared trainer module gets its own mode back
            was_training = self.model.training
            self.model.eval()
            try:
                last = None
                if self._static_ok:
                    if self._engine is None:
                        self._engine = StaticEngine(self, use_graphs=self.cuda_graphs, fused=self.fused_decode,
                                                    pack=self.pack_projections)
                    try:
                        last = StaticDecoder(self, handle, self._engine).run()
                    except NotStatic as exc:  # found at the first prefill, before any row was answered
                        if self.decode_mode == "static":
                            raise SamplerError(f"hf sampler decode='static' cannot serve this model: {exc}") from exc
                        self._static_ok, self._engine = False, None
                if last is None:
                    last = Decoder(self, handle).run()
            finally:
                if was_training:
                    self.model.train()
        for index, completion in last:
            handle.finish(index, completion)

    def rng_state(self) -> list[int]:
        """The generator state of requests without their own seed; checkpoints keep it so a resumed
        run samples exactly what an uninterrupted one would."""
        return [int(b) for b in self._rng.get_state().tolist()]

    def set_rng_state(self, state: list[int]) -> None:
        import torch

        self._rng.set_state(torch.tensor(state, dtype=torch.uint8))

    def draw_seed(self) -> int:
        """A seed for a request that brought none, from the sampler's own seeded generator."""
        import torch

        return int(torch.randint(0, 2**62, (1,), generator=self._rng))


def _usable_cores() -> int:
    """Cores this process may use, capped by torch's default."""
    import torch

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(torch.get_num_threads(), cores))


def _load_model(path: str, device: Any, dtype: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    elif isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise SamplerError(f"hf sampler could not load model {path!r}: {str(exc).splitlines()[0]}") from exc
    return model.to(device).eval()


def _load_tokenizer(path: str | None) -> Any:
    from transformers import AutoTokenizer

    if not path:
        raise ConfigError("HFSampler needs a tokenizer (or a model loaded from a directory that has one)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise SamplerError(f"hf sampler could not load a tokenizer from {path!r}: {str(exc).splitlines()[0]}") from exc
    return check_vocabulary(tokenizer, path, "or pass HFSampler(tokenizer=)")


def _module_device(module: Any) -> Any:
    import torch

    try:
        return next(module.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def _name_or_path(module: Any) -> str | None:
    config = getattr(module, "config", None)
    return getattr(config, "_name_or_path", None) or getattr(config, "name_or_path", None)


def _cache_kwarg(model: Any) -> str:
    """transformers 5 calls the KV cache argument ``cache``; 4.x called it ``past_key_values``."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        names = inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in names else "past_key_values"

