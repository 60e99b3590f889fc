"""A stand-in for the parts of vLLM rlcore's vLLM backends touch, shaped by vLLM's real source.

vLLM needs a GPU and cannot be installed on the CPU test machines, so the ``vllm`` sampler and the
test server (:mod:`rlcore.testing.openai_server`) are tested against this module. Each behaviour
below reproduces a specific file of the vLLM wheels (``pip download vllm==X --no-deps``, unpacked);
the version is a parameter where vLLM changed:

- :func:`msgpack_roundtrip` — ``vllm/v1/serial_utils.py`` ``MsgpackEncoder``/``MsgpackDecoder``
  (0.10.0–0.33.0): what ``LLM.collective_rpc`` arguments look like in the engine process with
  ``VLLM_ENABLE_V1_MULTIPROCESSING=1`` (the default). A tensor in an untyped call arrives as a
  ``[dtype, shape, data]`` list; a CUDA tensor fails on 0.10.0 (``.numpy()``).
- :func:`token_logprobs` / :func:`sample_token` — ``vllm/v1/sample/sampler.py`` and
  ``ops/topk_topp_sampler.py``: the order of min-tokens masking, repetition penalty, temperature,
  min-p, top-k, top-p, and where ``raw_logprobs`` / ``processed_logprobs`` are taken (0.10.0–0.10.1:
  processed = after penalties, before temperature; from 0.10.2: after truncation, renormalised).
- :class:`SamplingParams` — ``vllm/sampling_params.py`` ``_verify_args``: ``n`` must be 1 for greedy,
  temperature in [0, 2] from 0.25 (>= 0 before), top_k >= -1, 0 < top_p <= 1, 0 <= min_p <= 1,
  repetition_penalty > 0, max_tokens >= 1, min_tokens <= max_tokens.
- :class:`LLM` — ``vllm/entrypoints/llm.py``: ``generate``, ``collective_rpc`` (through the msgpack
  round trip, then every TP rank's worker with the configured ``worker_extension_cls`` mixed in),
  ``reset_prefix_cache`` (``reset_running_requests`` from 0.13; returns False while blocks are
  held), ``sleep(level)`` / ``wake_up(tags)`` — generating while asleep blocks, like the real
  engine whose scheduler has no memory — and ``llm_engine.engine_core.shutdown()``.

The "model" on each rank is a real tiny transformers model; each TP rank's ``load_weights`` keeps
only its shard of every tensor (as vLLM's column-parallel weight loaders ``narrow`` it).
"""

from __future__ import annotations

import importlib
import threading
import types
from typing import Any, Iterable

import torch

from ..sampling.vllm.support import PROCESSED, RAW, parse_version

Version = tuple[int, int, int]


# --- vllm/v1/serial_utils.py --------------------------------------------------------------------------
def msgpack_roundtrip(obj: Any, version: Version = (0, 33, 0)) -> Any:
    """``obj`` as the engine process decodes it from an untyped utility call (no type hints).

    Tensors become ``[dtype, shape, bytes]`` (``_encode_tensor``; ``.numpy()`` on CUDA raises on
    0.10.0), tuples become lists, and objects msgpack cannot encode raise ``TypeError`` (vLLM falls
    back to pickle only with ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``).
    """
    if isinstance(obj, torch.Tensor):
        if obj.device.type != "cpu" and version < (0, 10, 1):
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first.")
        t = obj.detach().cpu().contiguous()
        return [str(t.dtype).removeprefix("torch."), list(t.shape), t.flatten().view(torch.uint8).numpy().tobytes()]
    if isinstance(obj, (list, tuple)):
        return [msgpack_roundtrip(x, version) for x in obj]
    if isinstance(obj, dict):
        return {k: msgpack_roundtrip(v, version) for k, v in obj.items()}
    if obj is None or isinstance(obj, (str, int, float, bool, bytes)):
        return obj
    raise TypeError(f"Object of type {type(obj).__name__} is not serializable; set VLLM_ALLOW_INSECURE_SERIALIZATION=1")


# --- vllm/sampling_params.py ----------------------------------------------------------------------------
class SamplingParams:
    """``vllm.SamplingParams`` with the validation of ``_verify_args`` that rlcore's requests can hit."""

    version: Version = (0, 33, 0)

    def __init__(self, n: int = 1, max_tokens: int | None = 16, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0, min_p: float = 0.0, repetition_penalty: float = 1.0, min_tokens: int = 0,
                 stop: list[str] | None = None, stop_token_ids: list[int] | None = None, logprobs: int | None = None,
                 seed: int | None = None, skip_special_tokens: bool = True, include_stop_str_in_output: bool = False) -> None:
        self.n, self.max_tokens, self.temperature, self.top_p, self.top_k = n, max_tokens, temperature, top_p, top_k
        self.min_p, self.repetition_penalty, self.min_tokens = min_p, repetition_penalty, min_tokens
        self.stop, self.stop_token_ids = list(stop or []), list(stop_token_ids or [])
        self.logprobs, self.seed = logprobs, seed
        self.skip_special_tokens, self.include_stop_str_in_output = skip_special_tokens, include_stop_str_in_output
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}.")
        if temperature < 0.0:
            raise ValueError(f"temperature must be non-negative, got {temperature}.")
        if self.version >= (0, 25, 0) and temperature > 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {temperature}.")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}.")
        if top_k < -1:
            raise ValueError(f"top_k must be 0 (disable), or at least 1, got {top_k}.")
        if not 0.0 <= min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {min_p}.")
        if repetition_penalty <= 0.0:
            raise ValueError(f"repetition_penalty must be greater than zero, got {repetition_penalty}.")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}.")
        if max_tokens is not None and min_tokens > max_tokens:
            raise ValueError(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.")
        if temperature < 1e-5 and n > 1:  # _verify_greedy_sampling
            raise ValueError(f"n must be 1 when using greedy sampling, got {n}.")


# --- vllm/v1/sample/sampler.py + ops/topk_topp_sampler.py -------------------------------------------------
def _process(logits: torch.Tensor, context: list[int], n_out: int, params: Any, stop_ids: list[int],
             version: Version) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(sampling logits, processed logprobs) of one position, in vLLM's order."""
    x = logits.float().clone()
    if n_out < (params.min_tokens or 0):  # MinTokensLogitsProcessor (non-argmax-invariant)
        x[list(stop_ids)] = float("-inf")
    rp = params.repetition_penalty
    if rp != 1.0 and context:  # apply_penalties: prompt and output tokens
        idx = torch.tensor(sorted(set(context)))
        v = x[idx]
        x[idx] = torch.where(v > 0, v / rp, v * rp)
    if version < (0, 10, 2):
        return x, torch.log_softmax(x, -1)  # processed before temperature
    t = params.temperature
    if t < 1e-5:
        return x, torch.log_softmax(x, -1)
    x = x / t
    if params.min_p > 0:
        probs = torch.softmax(x, -1)
        x = x.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    k = params.top_k if params.top_k and params.top_k > 0 else 0
    if k:
        kth = torch.topk(x, min(k, x.numel())).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        srt, order = torch.sort(x, descending=False)
        cum = torch.softmax(srt, -1).cumsum(-1)
        mask = cum <= 1 - params.top_p
        mask[-1] = False  # at least one token stays
        x = x.clone()
        x[order[mask]] = float("-inf")
    return x, torch.log_softmax(x, -1)


def token_logprobs(model: Any, prompt: list[int], tokens: list[int], params: Any, mode: str, version: Version,
                   stop_ids: list[int] = ()) -> list[float]:
    """The logprobs vLLM returns for ``tokens`` sampled after ``prompt`` in ``logprobs_mode=mode``."""
    if not tokens:
        return []
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    out = []
    for i, tok in enumerate(tokens):
        if mode == RAW:
            out.append(float(torch.log_softmax(logits[i], -1)[tok]))
            continue
        _, lp = _process(logits[i], prompt + tokens[:i], i, params, stop_ids, version)
        out.append(float(lp[tok]))
    return out


def sample_token(logits: torch.Tensor, context: list[int], n_out: int, params: Any, stop_ids: list[int],
                 version: Version, generator: torch.Generator) -> int:
    x, _ = _process(logits, context, n_out, params, stop_ids, max(version, (0, 10, 2)))
    if params.temperature < 1e-5:
        return int(torch.argmax(x))
    return int(torch.multinomial(torch.softmax(x, -1), 1, generator=generator))


# --- vllm/entrypoints/llm.py ------------------------------------------------------------------------------
class TokensPrompt(dict):
    """``vllm.inputs.TokensPrompt`` is a TypedDict."""


class _Logprob:
    def __init__(self, logprob: float) -> None:
        self.logprob, self.rank, self.decoded_token = logprob, 1, None


class _RankModel:
    """A rank's model: ``load_weights`` keeps this rank's row shard of every tensor (TP ``narrow``)."""

    def __init__(self, hf_model: Any, rank: int, world: int) -> None:
        self.hf, self.rank, self.world = hf_model, rank, world
        self.loaded: list[str] = []

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.hf.named_parameters(remove_duplicate=False))  # tied embeddings answer to both names
        done = set()
        with torch.no_grad():
            for name, t in weights:
                if not isinstance(t, torch.Tensor):
                    raise AttributeError(f"'{type(t).__name__}' object has no attribute 'to'")
                if name not in params:
                    raise KeyError(f"unexpected weight {name!r}")
                p = params[name]
                shard = t.shape[0] // self.world if t.dim() and t.shape[0] % self.world == 0 else None
                if shard and self.world > 1:  # only this rank's slice is copied (the rest is another rank's)
                    p[self.rank * shard:(self.rank + 1) * shard].copy_(t.narrow(0, self.rank * shard, shard))
                else:
                    p.copy_(t.to(p.dtype))
                self.loaded.append(name)
                done.add(name)
        return done


class _EngineCore:
    def __init__(self) -> None:
        self.shut_down = False

    def shutdown(self) -> None:
        self.shut_down = True


class LLM:
    """``vllm.LLM`` for a tiny transformers model, with the behaviours listed in the module docstring."""

    version: Version = (0, 33, 0)
    hang_s: float = 30.0  # how long generate blocks while asleep before the stand-in gives up

    def __init__(self, model: str, tensor_parallel_size: int = 1, logprobs_mode: str = RAW,
                 worker_extension_cls: str | None = None, enable_sleep_mode: bool = False, seed: int = 0,
                 gpu_memory_utilization: float = 0.9, **kwargs: Any) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.kwargs = dict(kwargs, model=model, tensor_parallel_size=tensor_parallel_size, logprobs_mode=logprobs_mode,
                           worker_extension_cls=worker_extension_cls, enable_sleep_mode=enable_sleep_mode,
                           gpu_memory_utilization=gpu_memory_utilization)
        self.logprobs_mode = logprobs_mode
        self.hf = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(kwargs.get("tokenizer") or model)
        bases: tuple[type, ...] = (object,)
        if worker_extension_cls:
            mod, _, cls = worker_extension_cls.rpartition(".")
            bases = (getattr(importlib.import_module(mod), cls),)
        worker_cls = type("Worker", bases, {})
        self.workers = []
        for rank in range(tensor_parallel_size):
            w = worker_cls()
            w.rank, w.model_runner = rank, types.SimpleNamespace(model=_RankModel(self.hf, rank, tensor_parallel_size))
            self.workers.append(w)
        self.enable_sleep_mode = enable_sleep_mode
        self.sleeping: set[str] = set()
        self._awake = threading.Event()
        self._awake.set()
        self.running = 0  # requests holding KV blocks (tests raise it to simulate other clients)
        self.prefix_cache_resets = 0
        self.rpc_calls: list[tuple[str, Any]] = []
        self.generate_calls = 0
        self.llm_engine = types.SimpleNamespace(engine_core=_EngineCore())
        self.seed = seed

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = (),
                       kwargs: dict[str, Any] | None = None) -> list[Any]:
        args, kwargs = msgpack_roundtrip(tuple(args), self.version), msgpack_roundtrip(dict(kwargs or {}), self.version)
        self.rpc_calls.append((method, args))
        if "weights" in self.sleeping:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (weights are offloaded)")
        return [getattr(w, method)(*args, **kwargs) for w in self.workers]

    def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> bool:
        if self.version < (0, 13, 0) and kwargs:
            raise TypeError(f"reset_prefix_cache() got an unexpected keyword argument {next(iter(kwargs))!r}")
        if self.running and not kwargs.get("reset_running_requests"):
            return False  # KVCacheManager.reset_prefix_cache: blocks still in use
        self.prefix_cache_resets += 1
        return True

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        if not self.enable_sleep_mode:
            raise ValueError("Sleep mode is not enabled; start the engine with enable_sleep_mode=True")
        self.sleeping = {"weights", "kv_cache"}
        self._awake.clear()
        if level == 2:  # weights discarded: whatever is mapped on wake-up is garbage
            with torch.no_grad():
                for p in self.hf.parameters():
                    p.fill_(float("nan"))

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.sleeping -= set(tags or ["weights", "kv_cache"])
        if not self.sleeping:
            self._awake.set()

    def generate(self, prompts: list[Any], sampling_params: Any, use_tqdm: bool = False) -> list[Any]:
        self.generate_calls += 1
        if not self._awake.wait(self.hang_s):
            raise TimeoutError("stand-in LLM.generate blocked while the engine was asleep")
        sps = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        for p in prompts:  # vLLM validates every prompt before running any: one bad prompt fails the call
            ids = p["prompt_token_ids"]
            if not ids or max(ids) >= self.hf.config.vocab_size:
                raise ValueError(f"Token id {max(ids or [-1])} is out of vocabulary")
        stop_default = [self.tokenizer.eos_token_id]
        outputs = []
        for i, (p, sp) in enumerate(zip(prompts, sps)):
            prompt = list(p["prompt_token_ids"])
            comps = []
            for j in range(sp.n):
                g = torch.Generator().manual_seed((sp.seed if sp.seed is not None else self.seed + i) * 1000 + j)
                stop_ids = list(sp.stop_token_ids) + stop_default
                toks: list[int] = []
                finish = "length"
                for _ in range(sp.max_tokens):
                    with torch.no_grad():
                        logits = self.hf(torch.tensor([prompt + toks])).logits[0, -1]
                    tok = sample_token(logits, prompt + toks, len(toks), sp, stop_ids, self.version, g)
                    toks.append(tok)
                    if tok in stop_ids and len(toks) >= sp.min_tokens:
                        finish = "stop"
                        break
                lps = token_logprobs(self.hf, prompt, toks, sp, self.logprobs_mode, self.version, stop_ids)
                comps.append(types.SimpleNamespace(
                    index=j, text=self.tokenizer.decode(toks), token_ids=toks, finish_reason=finish, stop_reason=None,
                    logprobs=[{t: _Logprob(v)} for t, v in zip(toks, lps)] if sp.logprobs is not None else None,
                ))
            outputs.append(types.SimpleNamespace(request_id=str(i), outputs=comps))
        return outputs


def make_vllm_module(version: str = "0.33.0") -> types.ModuleType:
    """A module object standing in for ``import vllm`` at ``version``."""
    v = parse_version(version) or (0, 33, 0)
    mod = types.ModuleType("vllm")
    mod.__version__ = version  # type: ignore[attr-defined]
    mod.LLM = type("LLM", (LLM,), {"version": v})  # type: ignore[attr-defined]
    mod.SamplingParams = type("SamplingParams", (SamplingParams,), {"version": v})  # type: ignore[attr-defined]
    mod.TokensPrompt = TokensPrompt  # type: ignore[attr-defined]
    return mod


__all__ = ["LLM", "PROCESSED", "RAW", "SamplingParams", "TokensPrompt", "make_vllm_module", "msgpack_roundtrip",
           "sample_token", "token_logprobs"]
