"""``openai`` (alias ``vllm_server``): generation on a vLLM / OpenAI-compatible server over HTTP.

Token-in / token-out through ``POST /v1/completions``: the prompt is sent as a list of token ids
(vLLM accepts them as ``prompt``), ``logprobs: 1`` returns the sampled token's logprob and
``return_tokens_as_token_ids: true`` returns every token as ``"token_id:123"`` — vLLM's documented
way to get ids back without re-tokenising text. ``n`` samples and many prompts go in one request.

Robustness: one pooled ``httpx.AsyncClient`` per event loop, timeouts, and bounded retries with
exponential backoff (and ``Retry-After``) on connection errors, 5xx and 429; after the last try a
one-line :class:`SamplerError` names the URL and the status.

Weight sync (full weights): the tensors are written as safetensors buckets into ``sync_dir`` (a
directory the server can read; ``/dev/shm`` by default) and the server loads them through vLLM's
dev-mode ``POST /collective_rpc`` (vLLM >= 0.10.2) calling rlcore's worker extension (start the
server with ``VLLM_SERVER_DEV_MODE=1 vllm serve … --worker-extension-cls
rlcore.sampling.vllm.worker.WeightSyncExtension``); then ``POST
/reset_prefix_cache?reset_running_requests=true`` drops KV blocks computed with the old weights, and
a ``{"success": false}`` answer is retried, then reported.

Logprob semantics: on first use the sampler reads the server's version (``GET /version``) and
``logprobs_mode`` (``GET /server_info?config_format=json``, dev mode, vLLM >= 0.11) and refuses,
with one line, requests whose logprobs would differ from the trainer's
(:func:`~rlcore.sampling.vllm.support.logprob_mismatch`); when the mode cannot be read it warns
once instead. Pass ``server_logprobs_mode=`` to state it yourself.

Sleep state is tracked: generating while asleep fails at once (a sleeping vLLM queues requests
forever), ``sleep`` asks vLLM to wait for running requests (``mode=wait``; the default ``abort``
would cut them off), and ``update_weights`` while asleep wakes the weights first.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from typing import Any

from ..errors import ConfigError, SamplerError
from ..types import Completion, SamplingParams
from .base import Sampler, WeightsLike
from .vllm.support import (
    LOGPROBS_MODES,
    MIN_VERSION,
    PROCESSED,
    RAW,
    SUPPORTED_RANGE,
    SleepState,
    SleepStateMixin,
    logprob_mismatch,
    parse_version,
)

log = logging.getLogger(__name__)

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def completion_payload(prompts: list[list[int]], params: SamplingParams, model: str) -> dict[str, Any]:
    """Our SamplingParams as a vLLM ``/v1/completions`` request body (vLLM's extra fields included).

    Every sampling field is sent, "off" values too: a vLLM server fills omitted ones from the
    model's ``generation_config`` (``--generation-config auto``, the default; Qwen's sets
    ``top_k=20``, ``repetition_penalty=1.05``), and the policy would sample from another
    distribution than the one the trainer assumes.
    """
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompts[0] if len(prompts) == 1 else prompts,
        "n": params.n,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k and params.top_k > 0 else -1,  # -1: off on every vLLM version
        "min_p": params.min_p,
        "repetition_penalty": params.repetition_penalty,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "min_tokens": params.min_tokens,
        "logprobs": 1,  # OpenAI's legacy field: >=0 returns the sampled token's logprob
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
        "include_stop_str_in_output": False,
    }
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop:
        body["stop"] = list(params.stop)
    if params.stop_token_ids:
        body["stop_token_ids"] = list(params.stop_token_ids)
    return body


def parse_token(token: str, tokenizer: Any = None) -> int:
    """``"token_id:123"`` → 123; a plain token string is converted with the tokenizer when there is one."""
    if token.startswith("token_id:"):
        return int(token[len("token_id:"):])
    if tokenizer is not None:
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != getattr(tokenizer, "unk_token_id", None):
            return tid
    raise SamplerError(
        f"server returned token {token!r} instead of a token id; it must support return_tokens_as_token_ids (vLLM ≥ 0.6)"
    )


def choice_to_completion(choice: dict[str, Any], tokenizer: Any = None, meta: dict[str, Any] | None = None) -> Completion:
    """One ``choices[i]`` of a vLLM completions response as a Completion."""
    lp = choice.get("logprobs") or {}
    tokens = lp.get("tokens")
    if tokens is None:
        raise SamplerError("server response has no logprobs.tokens; the request must set logprobs=1")
    ids = [parse_token(t, tokenizer) for t in tokens]
    logprobs = lp.get("token_logprobs")
    if logprobs is not None and (len(logprobs) != len(ids) or any(x is None for x in logprobs)):
        logprobs = None  # incomplete: IS correction is disabled for it rather than misaligned
    finish = choice.get("finish_reason") or "length"
    if finish not in ("stop", "length"):
        raise SamplerError(
            f"openai sampler: the server ended a completion with finish_reason={finish!r} (aborted: was it put to sleep or shut down?)"
        )
    m = dict(meta or {})
    if choice.get("stop_reason") is not None:
        m["stop"] = choice["stop_reason"]
    return Completion(token_ids=ids, logprobs=logprobs, finish_reason=finish, text=choice.get("text") or "", meta=m)


class OpenAISampler(SleepStateMixin, Sampler):
    """Talks to ``base_url`` (``http://host:port``, with or without ``/v1``).

    Args:
        base_url: the server.
        model: the served model name (default: the first of ``GET /v1/models``); a local directory
            also provides the tokenizer.
        tokenizer: a tokenizer or path (optional: text comes from the server; used for chat templates).
        api_key: sent as a bearer token.
        timeout: seconds for a whole request (generation can be long); ``connect_timeout`` for connecting.
        max_retries: retries after the first try on connection errors / 5xx / 429.
        backoff: first retry delay in seconds, doubled each retry up to ``max_backoff``.
        max_connections: connection-pool size (concurrent requests in flight).
        sync_dir: where ``update_weights`` writes tensors for the server to read (must be shared;
            default a fresh ``/dev/shm`` directory, right for a server on the same machine).
        bucket_bytes: most bytes of weights per file / ``collective_rpc`` call.
        server_logprobs_mode: the server's ``--logprobs-mode`` if you know it; ``None`` reads it
            from ``/server_info`` (warns once when it cannot).
        max_response_bytes: the largest completion response read (default 256 MiB); a server that
            sends more is an error, not an out-of-memory.
    """

    name = "openai"

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        model: str | None = None,
        tokenizer: Any = None,
        *,
        api_key: str | None = None,
        timeout: float = 600.0,
        connect_timeout: float = 5.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        max_connections: int = 256,
        sync_dir: str | None = None,
        bucket_bytes: int | None = None,
        server_logprobs_mode: str | None = None,
        max_response_bytes: int = 256 * 1024 * 1024,
        **opts: Any,
    ) -> None:
        if opts:
            raise ConfigError(f"openai sampler got unknown options: {', '.join(sorted(opts))}")
        url = base_url.rstrip("/")
        self.base_url = url[:-3] if url.endswith("/v1") else url
        self.model = model
        if tokenizer is None and model and os.path.isdir(model):
            tokenizer = model
        if isinstance(tokenizer, (str, os.PathLike)):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        self.tokenizer = tokenizer
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY")
        self.timeout, self.connect_timeout = timeout, connect_timeout
        self.max_retries, self.backoff, self.max_backoff = max(0, max_retries), backoff, max_backoff
        self.max_connections = max_connections
        from .weights import DEFAULT_BUCKET_BYTES

        if server_logprobs_mode is not None and server_logprobs_mode not in LOGPROBS_MODES:
            raise ConfigError(f"openai sampler: server_logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, got {server_logprobs_mode!r}")
        self.sync_dir = sync_dir
        self.bucket_bytes = int(bucket_bytes or DEFAULT_BUCKET_BYTES)
        self.server_logprobs_mode = server_logprobs_mode
        self.server_version: tuple[int, int, int] | None = None
        self._probed = False
        self._warned: set[str] = set()
        self._sleep = SleepState()
        self.in_flight = 0
        self.max_response_bytes = int(max_response_bytes)
        self._clients: dict[Any, Any] = {}  # event loop -> AsyncClient (a client is bound to its loop)

    # --- HTTP plumbing --------------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _timeout(self) -> Any:
        import httpx

        return httpx.Timeout(self.timeout, connect=self.connect_timeout)

    def _client(self) -> Any:
        import httpx

        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None or client.is_closed:
            for old in [lp for lp in self._clients if lp.is_closed()]:
                self._clients.pop(old, None)
            limits = httpx.Limits(max_connections=self.max_connections, max_keepalive_connections=self.max_connections)
            client = httpx.AsyncClient(base_url=self.base_url, timeout=self._timeout(), limits=limits, headers=self._headers())
            self._clients[loop] = client
        return client

    def _delay(self, attempt: int, response: Any = None) -> float:
        retry_after = response.headers.get("retry-after") if response is not None else None
        if retry_after:
            try:
                return min(float(retry_after), self.max_backoff)
            except ValueError:
                pass
        base = min(self.max_backoff, self.backoff * (2 ** attempt))
        return base * (0.75 + 0.5 * random.random())  # jitter: many trajectories must not retry in lockstep

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        import httpx

        last = ""
        for attempt in range(self.max_retries + 1):
            response = None
            try:
                response = await _capped_post(self._client(), path, body, self.max_response_bytes)
            except (httpx.TransportError,) as exc:  # connect/read errors and timeouts
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                if response.status_code < 400:
                    return response.json()
                detail = _error_message(response)
                if response.status_code not in RETRY_STATUS:
                    raise SamplerError(f"openai sampler: {self.base_url}{path} answered {response.status_code}: {detail}")
                last = f"{response.status_code}: {detail}"
            if attempt < self.max_retries:
                await asyncio.sleep(self._delay(attempt, response))
        raise SamplerError(
            f"openai sampler: {self.base_url}{path} failed after {self.max_retries + 1} attempts ({last}); is the server up?"
        )

    async def _model_name(self) -> str:
        if self.model is None:
            import httpx

            try:
                r = await self._client().get("/v1/models")
                r.raise_for_status()
                self.model = r.json()["data"][0]["id"]
            except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
                raise SamplerError(
                    f"openai sampler: could not list models at {self.base_url}/v1/models ({type(exc).__name__}); pass model=…"
                ) from exc
        return self.model

    # --- the protocol ---------------------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        return (await self._request([list(prompt_ids)], params.replace(n=1)))[0][0]

    async def generate_n(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        return (await self._request([list(prompt_ids)], params))[0]

    async def generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        return await self._request([list(p) for p in prompts], params) if prompts else []

    async def _request(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        if any(not p for p in prompts):
            raise SamplerError("openai sampler got an empty prompt; encode at least one token")
        self._check_awake()
        await self._probe_server()
        self._check_logprobs(params)
        body = completion_payload(prompts, params, await self._model_name())
        self.in_flight += 1
        try:
            data = await self._post("/v1/completions", body)
        finally:
            self.in_flight -= 1
        choices = sorted(data.get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != len(prompts) * params.n:
            raise SamplerError(
                f"openai sampler: server returned {len(choices)} choices for {len(prompts)} prompt(s) × n={params.n}"
            )
        meta = {"policy_version": self.policy_version, "id": data.get("id"), "logprobs_mode": self.server_logprobs_mode}
        out = [choice_to_completion(c, self.tokenizer, meta) for c in choices]
        return [out[i * params.n:(i + 1) * params.n] for i in range(len(prompts))]

    # --- what the server is ---------------------------------------------------------------------------
    async def _probe_server(self) -> None:
        """Read the server's vLLM version and logprobs mode once (best effort: other servers lack them)."""
        if self._probed:
            return
        self._probed = True
        import httpx

        client = self._client()
        try:
            r = await client.get("/version")
            if r.status_code == 200:
                self.server_version = parse_version((r.json() or {}).get("version"))
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
        if self.server_logprobs_mode is None:
            try:
                r = await client.get("/server_info", params={"config_format": "json"})
                info = r.json().get("vllm_config") if r.status_code == 200 else None
                mode = info.get("model_config", {}).get("logprobs_mode") if isinstance(info, dict) else None
                if isinstance(mode, str):
                    self.server_logprobs_mode = mode.rsplit(".", 1)[-1].lower()  # "LogprobsMode.RAW_LOGPROBS" on 0.10.2-0.11
            except (httpx.HTTPError, ValueError, AttributeError):
                pass

    def _check_logprobs(self, params: SamplingParams) -> None:
        """Refuse a request whose logprobs would differ from the trainer's; warn once when unknowable."""
        mode = self.server_logprobs_mode
        if mode is not None:
            mismatch = logprob_mismatch(params, mode, self.server_version)
            if mismatch:
                hint = f" (restart vLLM with --logprobs-mode {PROCESSED})" if mode == RAW else ""
                raise SamplerError(f"openai sampler: {self.base_url}: {mismatch}{hint}")
            return
        if logprob_mismatch(params, RAW, self.server_version) or logprob_mismatch(params, PROCESSED, self.server_version):
            key = "unknown-mode"
            if key not in self._warned:
                self._warned.add(key)
                log.warning(
                    "openai sampler: could not read %s's logprobs mode (GET /server_info needs VLLM_SERVER_DEV_MODE=1 "
                    "and vLLM >= 0.11); with temperature=%s%s its logprobs may differ from the trainer's. Start vLLM "
                    "with --logprobs-mode %s and pass server_logprobs_mode=%r.",
                    self.base_url, params.temperature,
                    "" if params.temperature in (0.0, 1.0) else " (raw_logprobs, vLLM's default, ignores it)",
                    PROCESSED, PROCESSED,
                )

    def _check_awake(self) -> None:
        if self._sleep:
            raise SamplerError(
                f"openai sampler: the server was put to sleep (sleep(level={self.sleep_level})); call wake_up() before generating"
            )
        if self._sleep.weights_discarded:
            raise SamplerError(
                "openai sampler: sleep(level=2) discarded the server's weights; call update_weights(full state dict) first"
            )

    def _server_version_sync(self) -> tuple[int, int, int] | None:
        if self.server_version is None:
            import httpx

            try:
                with httpx.Client(base_url=self.base_url, timeout=self._timeout(), headers=self._headers()) as client:
                    r = client.get("/version")
                if r.status_code == 200:
                    self.server_version = parse_version((r.json() or {}).get("version"))
            except (httpx.HTTPError, ValueError, AttributeError):
                pass
        return self.server_version

    # --- control plane (vLLM dev-mode endpoints) -------------------------------------------------------
    def _control(self, path: str, body: dict[str, Any] | None = None, params: dict[str, Any] | None = None) -> Any:
        import httpx

        try:
            with httpx.Client(base_url=self.base_url, timeout=self._timeout(), headers=self._headers()) as client:
                r = client.post(path, json=body, params=params)
        except httpx.TransportError as exc:
            raise SamplerError(f"openai sampler: {self.base_url}{path} unreachable ({type(exc).__name__}); is the server up?") from exc
        if r.status_code == 404:
            version = self._server_version_sync()
            if path == "/collective_rpc" and version is not None and version < MIN_VERSION:
                raise SamplerError(
                    f"openai sampler: the server runs vLLM {'.'.join(map(str, version))}, which has no /collective_rpc "
                    f"(added in 0.10.2); upgrade it to vLLM {SUPPORTED_RANGE} to sync weights"
                )
            raise SamplerError(
                f"openai sampler: {self.base_url}{path} does not exist; start vLLM {SUPPORTED_RANGE} with VLLM_SERVER_DEV_MODE=1"
            )
        if r.status_code >= 400:
            raise SamplerError(f"openai sampler: {self.base_url}{path} answered {r.status_code}: {_error_message(r)}")
        try:
            return r.json() if r.content else None
        except ValueError:
            return None

    def update_weights(self, weights: WeightsLike, *, lora: bool = False, version: int | None = None) -> None:
        """Write the tensors to ``sync_dir`` bucket by bucket and have the server load each (see the
        module docstring); asleep, the server's weights are woken first."""
        from .weights import RPC_LOAD_FROM_PATH, default_sync_dir, sync_in_buckets

        if lora:
            raise SamplerError(
                "openai sampler syncs full weights only; merge LoRA adapters (model.merge_and_unload()) before syncing"
            )
        if "weights" in self._sleep.parts:
            self._control("/wake_up", params={"tags": "weights"})
            self._sleep.parts.discard("weights")
        if self.sync_dir is None:
            self.sync_dir = default_sync_dir()

        def load(path: str) -> Any:
            data = self._control("/collective_rpc", {"method": RPC_LOAD_FROM_PATH, "kwargs": {"path": path}})
            return (data or {}).get("results") if isinstance(data, dict) else None

        sync_in_buckets(weights, directory=self.sync_dir, bucket_bytes=self.bucket_bytes, load=load,
                        who="openai sampler", hint="is the server started with "
                        "--worker-extension-cls rlcore.sampling.vllm.worker.WeightSyncExtension?")
        self._sleep.weights_discarded = False
        self.reset_prefix_cache()
        self._advance_version(version)

    def reset_prefix_cache(self, attempts: int = 4) -> None:
        """``POST /reset_prefix_cache?reset_running_requests=true`` (vLLM >= 0.13 preempts running
        requests so the reset can succeed); ``{"success": false}`` is retried, then an error.
        Older servers answer nothing and fail silently while requests run, so this sampler refuses
        to reset there while its own requests are in flight."""
        version = self._server_version_sync()
        if version is not None and version < (0, 13, 0) and self.in_flight:
            raise SamplerError(
                f"openai sampler: vLLM {'.'.join(map(str, version))} cannot reset its prefix cache while "
                f"{self.in_flight} request(s) run (reset_running_requests needs 0.13); sync weights between rollouts"
            )
        for attempt in range(attempts):
            data = self._control("/reset_prefix_cache", params={"reset_running_requests": "true"})
            if not (isinstance(data, dict) and data.get("success") is False):
                return
            time.sleep(min(self.max_backoff, self.backoff * 2 ** attempt))
        raise SamplerError(
            f"openai sampler: {self.base_url}/reset_prefix_cache kept answering success=false after {attempts} tries; "
            "KV blocks computed with the old weights would be reused"
        )

    def sleep(self, level: int = 1) -> None:
        """``POST /sleep?level=…&mode=wait``: vLLM >= 0.17 aborts running requests by default."""
        if level not in (1, 2):
            raise SamplerError(f"openai sampler: sleep level must be 1 or 2, got {level}")
        if self._sleep:
            return
        version = self._server_version_sync()
        if self.in_flight and version is not None and version < (0, 17, 0):
            raise SamplerError(
                f"openai sampler: {self.in_flight} request(s) still running; vLLM {'.'.join(map(str, version))} "
                "cannot wait for them before sleeping (mode=wait needs 0.17): await them first"
            )
        self._control("/sleep", params={"level": level, "mode": "wait"})
        self._sleep.fell_asleep(level)

    def wake_up(self) -> None:
        if not self._sleep:
            return
        tags = self._sleep.wake_tags()
        self._control("/wake_up", params=None if tags is None else {"tags": tags})
        self._sleep.woke()

    async def close(self) -> None:
        clients, self._clients = self._clients, {}
        for loop, client in clients.items():
            if loop is asyncio.get_running_loop():
                await client.aclose()


async def _capped_post(client: Any, path: str, body: dict[str, Any], limit: int) -> Any:
    """POST and read the (decoded) body, at most ``limit`` bytes; returns a plain ``httpx.Response``."""
    import httpx

    async with client.stream("POST", path, json=body) as r:
        buf = bytearray()
        async for chunk in r.aiter_bytes():
            buf += chunk
            if len(buf) > limit:
                raise SamplerError(f"openai sampler: {client.base_url}{path.lstrip('/')} sent more than {limit} bytes "
                                   "(max_response_bytes); raise it if such responses are expected")
        headers = [(k, v) for k, v in r.headers.items() if k.lower() not in ("content-encoding", "content-length")]
        return httpx.Response(r.status_code, headers=headers, content=bytes(buf), request=r.request)


def _error_message(response: Any) -> str:
    try:
        data = response.json()
    except ValueError:
        return (response.text or response.reason_phrase or "").strip().splitlines()[0] if response.text else response.reason_phrase
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            return str(err.get("message") or err)
        return str(err)
    return str(data)
