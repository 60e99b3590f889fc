"""A real HTTP server speaking vLLM's OpenAI-compatible ``/v1/completions`` dialect, on 127.0.0.1.

Tests of HTTP samplers (and anything that talks to "a vLLM server") run against this instead of a
mocked client: a FastAPI app served by uvicorn on a free port in a background thread, generating
with a real model through :class:`rlcore.sampling.hf.sampler.HFSampler`. It implements the parts of vLLM's
server that rlcore uses, in vLLM's response format:

- ``POST /v1/completions`` — ``prompt`` as token ids (a list of ints, or a list of such lists) or
  text; ``n``, ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``seed``, ``stop``,
  ``stop_token_ids``, ``min_tokens``, ``repetition_penalty``, ``logprobs``,
  ``return_tokens_as_token_ids`` (tokens come back as ``"token_id:123"``).
- ``POST /v1/chat/completions`` — ``messages`` rendered with the sampler's tokenizer chat template
  (``add_generation_prompt``); ``n``, ``max_tokens`` (or ``max_completion_tokens``), ``temperature``,
  ``top_p``, ``seed``, ``stop``; the reply in OpenAI's ``chat.completion`` shape (what a client of
  a chat endpoint reads: ``choices[i].message.content``, ``finish_reason``, ``usage``). Served
  with a :class:`~rlcore.testing.ScriptedSampler`, it answers with scripted text (an LLM judge's
  verdicts in rl-plugin-judge's tests).
- ``GET /v1/models``, ``GET /health``, ``GET /version``.
- vLLM's dev-mode control endpoints (``VLLM_SERVER_DEV_MODE=1``): ``POST /collective_rpc``,
  ``/reset_prefix_cache``, ``/sleep``, ``/wake_up``, ``GET /is_sleeping``, ``GET /server_info``. The
  one RPC method served is the one rlcore's worker extension adds
  (:mod:`rlcore.sampling.vllm.worker`): ``rlcore_load_weights_from_path``.

It behaves like a real vLLM server of ``version`` where that matters to a client (each point read
from that version's ``vllm/entrypoints/openai/api_server.py`` / ``entrypoints/serve/*`` and
``completion/protocol.py``):

- omitted sampling fields are filled from ``generation_config`` (vLLM's ``--generation-config
  auto`` default: "user -> server default -> OpenAI default" in ``to_sampling_params``);
- logprobs follow ``logprobs_mode`` (``raw_logprobs`` by default, as in vLLM) with that version's
  order of processing (:func:`rlcore.testing.vllm_standin.token_logprobs`);
- ``/collective_rpc`` is 404 before 0.10.2, ``/server_info?config_format=json`` exists from 0.11;
- ``/reset_prefix_cache`` fails while requests run unless ``reset_running_requests=true`` (0.13+),
  and says so with ``{"success": false}`` only from 0.33 (earlier: an empty 200);
- ``/sleep`` aborts running requests (``mode=abort``, the default from 0.17) or waits for them
  (``mode=wait``); a completion request while asleep queues until ``wake_up`` (up to ``hang_s``);
- ``/collective_rpc`` while the weights sleep fails (vLLM would write to unmapped memory), and a
  weight name the model's checkpoint lacks fails as vLLM's ``load_weights`` does
  (:func:`check_vllm_weight_names`).

Fault injection for tests: append HTTP status codes to ``server.faults`` and the next
``/v1/completions`` or ``/v1/chat/completions`` requests answer with them (one each) before normal
service resumes. ``server.peak_running`` is the most requests that were generating at once;
``server.request_headers`` the headers of each chat request (an API key as sent).
"""

# no `from __future__ import annotations`: FastAPI resolves the endpoint annotations (Request) at runtime

import asyncio
import threading
import time
import uuid
from typing import Any

from ..asyncutil import serve_in_thread, stop_served
from ..sampling.hf.sampler import HFSampler
from .vllm_standin import token_logprobs
from ..sampling.vllm.support import RAW, parse_version
from ..types import SamplingParams

RPC_LOAD_WEIGHTS = "rlcore_load_weights_from_path"  # the one method rlcore's worker extension adds
#: vLLM's OpenAI defaults for fields neither the request nor the generation config set
OPENAI_DEFAULTS = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                   "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}


def check_vllm_weight_names(model: Any, weights: Any) -> None:
    """Refuse a name the model's own checkpoint does not have, as vLLM's ``load_weights`` does.

    vLLM 0.33 ``vllm/model_executor/models/utils.py`` (``AutoWeightsLoader._load_module``, which
    Qwen2/Llama ``load_weights`` go through) walks each name down the module tree from the causal
    LM and raises ``ValueError`` for a prefix that is no child module or parameter there — so
    ``embed_tokens.weight`` without its ``model.`` prefix fails (only ``.bias`` suffixes are ignored).
    The HF sampler this server generates with would accept such names (it matches suffixes)."""
    names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    known = {".".join(n.split(".")[: i + 1]) for n in names for i in range(n.count(".") + 1)}
    for name in weights:
        if name not in names and not name.endswith(".bias"):
            parts = name.split(".")
            first = next(".".join(parts[: i + 1]) for i in range(len(parts)) if ".".join(parts[: i + 1]) not in known)
            raise ValueError(f"There is no module or parameter named {first!r} in {type(model).__name__}")


def _error(status: int, message: str, kind: str = "BadRequestError") -> Any:
    from fastapi.responses import JSONResponse

    return JSONResponse(
        {"object": "error", "message": message, "type": kind, "param": None, "code": status}, status_code=status
    )


def build_app(server: "OpenAICompatServer") -> Any:
    """The FastAPI app; ``server`` holds the sampler, the fault queue and what was received."""
    from fastapi import FastAPI, Request

    app = FastAPI(title="rlcore test vLLM-compatible server")
    sampler = server.sampler

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": server.model_name, "object": "model", "owned_by": "rlcore"}]}

    def refusal(body: dict[str, Any]) -> Any:
        """An injected fault, or the 404 for another model's name: the answer before any work (None: go on)."""
        if server.faults:
            status = server.faults.pop(0)
            return _error(status, f"injected fault {status}", "ServiceUnavailableError")
        if body.get("model") not in (None, server.model_name):
            return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        return None

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await request.json()
        server.requests.append(body)
        refused = refusal(body)
        if refused is not None:
            return refused
        prompts = body.get("prompt")
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not isinstance(prompts, list) or not prompts:
            return _error(400, "prompt must be a string, a list of token ids, or a list of those")
        token_prompts = [
            sampler.tokenizer.encode(p, add_special_tokens=False) if isinstance(p, str) else [int(t) for t in p]
            for p in prompts
        ]
        n = int(body.get("n") or 1)
        seed = body.get("seed")
        stop = body.get("stop") or []

        def field(name: str) -> Any:  # user -> server default (generation_config) -> OpenAI default
            value = body.get(name)
            return value if value is not None else server.generation_config.get(name, OPENAI_DEFAULTS[name])

        top_k = int(field("top_k"))
        params = SamplingParams(
            max_tokens=int(body.get("max_tokens") or 16),
            temperature=float(field("temperature")),
            top_p=float(field("top_p")),
            top_k=top_k if top_k > 0 else -1,
            min_p=float(field("min_p")),
            stop=[stop] if isinstance(stop, str) else list(stop),
            stop_token_ids=list(body.get("stop_token_ids") or []),
            min_tokens=int(body.get("min_tokens", 0)),
            repetition_penalty=float(field("repetition_penalty")),
        )
        server.effective.append({**{k: field(k) for k in OPENAI_DEFAULTS}, "min_tokens": params.min_tokens})
        from ..errors import SamplerError

        if server.sleeping:  # a sleeping engine schedules nothing: the request waits for wake_up
            try:
                await asyncio.wait_for(server._awake.wait(), server.hang_s)
            except asyncio.TimeoutError:
                return _error(503, "request waited for a sleeping engine", "ServiceUnavailableError")
        token = object()
        server.running.add(token)
        server.peak_running = max(server.peak_running, len(server.running))
        try:
            outs = await asyncio.gather(*(
                sampler.generate(p, params.replace(seed=None if seed is None else int(seed) + i))
                for p in token_prompts for i in range(n)
            ))
            stop_ids = list(params.stop_token_ids) + list(sampler.default_stop_token_ids)
            lps = await asyncio.to_thread(lambda: [
                token_logprobs(sampler.model, token_prompts[k // n], c.token_ids, params, server.logprobs_mode,
                               server.version_tuple, stop_ids)
                for k, c in enumerate(outs)
            ])
            for c, lp in zip(outs, lps):
                c.logprobs = lp
        except SamplerError as exc:
            return _error(400, str(exc))
        finally:
            server.running.discard(token)
            aborted = token in server.aborted
            server.aborted.discard(token)
        if aborted:
            for c in outs:
                c.finish_reason = "abort"
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        want_logprobs = body.get("logprobs") is not None
        choices = []
        for index, c in enumerate(outs):
            logprobs = None
            if want_logprobs:
                toks = [f"token_id:{t}" if as_ids else sampler.tokenizer.convert_ids_to_tokens(t) for t in c.token_ids]
                offsets, pos = [], 0
                for t in c.token_ids:
                    offsets.append(pos)
                    pos += len(sampler.tokenizer.decode([t]))
                logprobs = {
                    "text_offset": offsets,
                    "token_logprobs": c.logprobs,
                    "tokens": toks,
                    "top_logprobs": [{tok: lp} for tok, lp in zip(toks, c.logprobs)],
                }
            stop_reason = c.meta.get("stop")
            if stop_reason in sampler.default_stop_token_ids and not params.stop_token_ids:
                stop_reason = None  # vLLM reports None when the model's own EOS ended the sequence
            choices.append({
                "index": index, "text": c.text, "logprobs": logprobs,
                "finish_reason": c.finish_reason, "stop_reason": stop_reason,
            })
        prompt_tokens = sum(len(p) for p in token_prompts) * n
        completion_tokens = sum(len(c.token_ids) for c in outs)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": server.model_name, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        body = await request.json()
        server.requests.append(body)
        server.request_headers.append(dict(request.headers))
        refused = refusal(body)
        if refused is not None:
            return refused
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) and "role" in m for m in messages):
            return _error(400, "messages must be a non-empty list of {role, content} objects")
        text = sampler.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt_ids = sampler.tokenizer.encode(text, add_special_tokens=False)
        n = int(body.get("n") or 1)
        seed = body.get("seed")
        stop = body.get("stop") or []
        params = SamplingParams(
            max_tokens=int(body.get("max_completion_tokens") or body.get("max_tokens") or 16),
            temperature=float(body["temperature"] if body.get("temperature") is not None else 1.0),
            top_p=float(body["top_p"] if body.get("top_p") is not None else 1.0),
            stop=[stop] if isinstance(stop, str) else list(stop),
        )
        from ..errors import SamplerError

        token = object()
        server.running.add(token)
        server.peak_running = max(server.peak_running, len(server.running))
        try:
            outs = await asyncio.gather(*(
                sampler.generate(prompt_ids, params.replace(seed=None if seed is None else int(seed) + i)) for i in range(n)
            ))
        except SamplerError as exc:
            return _error(400, str(exc))
        finally:
            server.running.discard(token)
        completion_tokens = sum(len(c.token_ids) for c in outs)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": server.model_name,
            "choices": [{"index": i, "message": {"role": "assistant", "content": c.text}, "logprobs": None,
                         "finish_reason": c.finish_reason} for i, c in enumerate(outs)],
            "usage": {"prompt_tokens": len(prompt_ids) * n, "completion_tokens": completion_tokens,
                      "total_tokens": len(prompt_ids) * n + completion_tokens},
        }

    def dev_only() -> Any:
        return None if server.dev_mode else _error(404, "Not Found", "NotFoundError")

    @app.get("/version")
    async def version() -> Any:
        return {"version": server.version}

    @app.get("/server_info")
    async def server_info(config_format: str = "text") -> Any:
        if (err := dev_only()) is not None:
            return err
        if config_format == "json" and server.version_tuple >= (0, 11, 0):
            return {"vllm_config": {"model_config": {"logprobs_mode": server.logprobs_mode, "model": server.model_name}}}
        return {"vllm_config": f"model={server.model_name!r}, seed=0"}  # 0.10.x's str(VllmConfig) has no logprobs_mode

    @app.post("/collective_rpc")
    async def collective_rpc(request: Request) -> Any:
        if (err := dev_only()) is not None or server.version_tuple < (0, 10, 2):
            return err if err is not None else _error(404, "Not Found", "NotFoundError")
        body = await request.json()
        method = body.get("method")
        if method != RPC_LOAD_WEIGHTS:
            return _error(400, f"unknown collective_rpc method {method!r}")
        if "weights" in server.sleeping:
            return _error(500, "CUDA error: an illegal memory access was encountered", "InternalServerError")
        kwargs = body.get("kwargs") or {}
        from ..sampling.weights import read_weights

        try:
            weights = read_weights(kwargs["path"])
            check_vllm_weight_names(sampler.model, weights)
            await asyncio.to_thread(sampler.update_weights, weights)
        except Exception as exc:  # noqa: BLE001 - reported to the client like vLLM does
            return _error(500, f"{type(exc).__name__}: {exc}", "InternalServerError")
        server.weight_syncs += 1
        return {"results": [str(len(weights))]}  # vLLM str()s results that are not dict/list/None

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(reset_running_requests: bool = False) -> Any:
        if (err := dev_only()) is not None:
            return err
        can_preempt = reset_running_requests and server.version_tuple >= (0, 13, 0)
        success = (not (server.running or server.busy) or can_preempt) and not server.kv_transfers_in_flight
        if success:
            server.prefix_cache_resets += 1
        if server.version_tuple >= (0, 33, 0):
            return {"success": success}
        from fastapi.responses import Response

        return Response(status_code=200)

    @app.post("/sleep")
    async def sleep(level: int = 1, mode: str = "abort") -> Any:
        if (err := dev_only()) is not None:
            return err
        if mode == "wait" and server.version_tuple >= (0, 17, 0):
            while server.running:
                await asyncio.sleep(0.01)
        else:
            server.aborted |= server.running
        sampler.sleep(level)
        server.sleeping = {"weights", "kv_cache"}
        server._awake.clear()
        server.sleep_calls.append({"level": level, "mode": mode})
        return {}

    @app.post("/wake_up")
    async def wake_up(request: Request) -> Any:
        if (err := dev_only()) is not None:
            return err
        tags = request.query_params.getlist("tags") or ["weights", "kv_cache"]
        server.wake_calls.append(tags)
        server.sleeping -= set(tags)
        if not server.sleeping:
            sampler.wake_up()
            server._awake.set()
        return {}

    @app.get("/is_sleeping")
    async def is_sleeping() -> Any:
        return {"is_sleeping": bool(server.sleeping)}

    return app


class OpenAICompatServer:
    """Serve ``sampler`` (or a model path, loaded into an ``HFSampler``) on 127.0.0.1 in a thread.

    Use as a context manager or call :meth:`start` / :meth:`stop`. ``url`` is the base URL.
    """

    def __init__(
        self,
        sampler: HFSampler | str,
        *,
        model_name: str = "rlcore-tiny",
        host: str = "127.0.0.1",
        port: int = 0,
        version: str = "0.33.0",
        logprobs_mode: str = RAW,
        generation_config: dict[str, Any] | None = None,
        dev_mode: bool = True,
        hang_s: float = 30.0,
    ) -> None:
        self.sampler = HFSampler(sampler, batch_window_ms=5) if isinstance(sampler, str) else sampler
        self.model_name = model_name
        self.host = host
        self.port = port
        self.version = version
        self.version_tuple = parse_version(version) or (0, 33, 0)
        self.logprobs_mode = logprobs_mode
        self.generation_config = dict(generation_config or {})
        self.dev_mode = dev_mode
        self.hang_s = hang_s
        self.faults: list[int] = []
        self.requests: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []  # each chat request's headers (lower-case names), as received
        self.effective: list[dict[str, Any]] = []  # the sampling fields each request ran with
        self.weight_syncs = 0
        self.prefix_cache_resets = 0
        self.busy = False  # True: another client's requests hold KV blocks
        self.kv_transfers_in_flight = False  # True: blocks held by KV offload transfers (reset fails regardless)
        self.running: set[Any] = set()
        self.peak_running = 0  # the most requests generating at once (a client's concurrency cap, seen here)
        self.aborted: set[Any] = set()
        self.sleeping: set[str] = set()
        self.sleep_calls: list[dict[str, Any]] = []
        self.wake_calls: list[list[str]] = []
        self._awake = asyncio.Event()
        self._awake.set()
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> "OpenAICompatServer":
        self._server, self._thread, self.port = serve_in_thread(build_app(self), self.host, self.port,
                                                                what="test OpenAI server",
                                                                thread_name="openai-server", timeout=timeout)
        return self

    def stop(self) -> None:
        stop_served(self._server, self._thread)

    def __enter__(self) -> "OpenAICompatServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
