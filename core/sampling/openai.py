"""``openai`` (alias ``vllm_server``): generation on a vLLM / OpenAI-compatible server over HTTP.

Token-in / token-out through ``POST /v1/completions``: the prompt is sent as a list of token ids
(vLLM accepts them as ``prompt``), ``logprobs: 1`` returns the sampled token's logprob and
``return_tokens_as_token_ids: true`` returns every token as ``"token_id:123"`` — vLLM's documented
way to get ids back without re-tokenising text. ``n`` samples and many prompts go in one request.

Robustness: one pooled ``httpx.AsyncClient`` per event loop, timeouts, and bounded retries with
exponential backoff (and ``Retry-After``) on connection errors, 5xx and 429; after the last try a
one-line :class:`SamplerError` names the URL and the status.

Weight sync (full weights): the tensors are written as safetensors into ``sync_dir`` (a directory
the server can read) and the server loads them through vLLM's dev-mode ``POST /collective_rpc``
calling rlcore's worker extension (start the server with ``VLLM_SERVER_DEV_MODE=1 vllm serve …
--worker-extension-cls rlcore.sampling.vllm_worker.WeightSyncExtension``); then
``POST /reset_prefix_cache`` drops KV blocks computed with the old weights.
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
from typing import Any

from ..errors import ConfigError, SamplerError
from ..types import Completion, SamplingParams
from .base import Sampler, WeightsLike

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def completion_payload(prompts: list[list[int]], params: SamplingParams, model: str) -> dict[str, Any]:
    """Our SamplingParams as a vLLM ``/v1/completions`` request body (vLLM's extra fields included)."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompts[0] if len(prompts) == 1 else prompts,
        "n": params.n,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "logprobs": 1,  # OpenAI's legacy field: ≥0 returns the sampled token's logprob
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
        "include_stop_str_in_output": False,
    }
    if params.top_k and params.top_k > 0:
        body["top_k"] = params.top_k
    if params.min_p:
        body["min_p"] = params.min_p
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop:
        body["stop"] = list(params.stop)
    if params.stop_token_ids:
        body["stop_token_ids"] = list(params.stop_token_ids)
    if params.repetition_penalty != 1.0:
        body["repetition_penalty"] = params.repetition_penalty
    if params.min_tokens:
        body["min_tokens"] = params.min_tokens
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
    m = dict(meta or {})
    if choice.get("stop_reason") is not None:
        m["stop"] = choice["stop_reason"]
    return Completion(token_ids=ids, logprobs=logprobs, finish_reason=finish, text=choice.get("text") or "", meta=m)


class OpenAISampler(Sampler):
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
        sync_dir: where ``update_weights`` writes tensors for the server to read (must be shared).
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
        self.sync_dir = sync_dir
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
        body = completion_payload(prompts, params, await self._model_name())
        data = await self._post("/v1/completions", body)
        choices = sorted(data.get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != len(prompts) * params.n:
            raise SamplerError(
                f"openai sampler: server returned {len(choices)} choices for {len(prompts)} prompt(s) × n={params.n}"
            )
        meta = {"policy_version": self.policy_version, "id": data.get("id")}
        out = [choice_to_completion(c, self.tokenizer, meta) for c in choices]
        return [out[i * params.n:(i + 1) * params.n] for i in range(len(prompts))]

    # --- control plane (vLLM dev-mode endpoints) -------------------------------------------------------
    def _control(self, path: str, body: dict[str, Any] | None = None, params: dict[str, Any] | None = None) -> Any:
        import httpx

        try:
            with httpx.Client(base_url=self.base_url, timeout=self._timeout(), headers=self._headers()) as client:
                r = client.post(path, json=body, params=params)
        except httpx.TransportError as exc:
            raise SamplerError(f"openai sampler: {self.base_url}{path} unreachable ({type(exc).__name__}); is the server up?") from exc
        if r.status_code == 404:
            raise SamplerError(
                f"openai sampler: {self.base_url}{path} does not exist; start vLLM with VLLM_SERVER_DEV_MODE=1"
            )
        if r.status_code >= 400:
            raise SamplerError(f"openai sampler: {self.base_url}{path} answered {r.status_code}: {_error_message(r)}")
        return r.json() if r.content else None

    def update_weights(self, weights: WeightsLike, *, lora: bool = False) -> None:
        """Write the tensors to ``sync_dir`` and have the server load them (see the module docstring)."""
        from .vllm_worker import write_weights

        if lora:
            raise SamplerError(
                "openai sampler syncs full weights only; merge LoRA adapters (model.merge_and_unload()) before syncing"
            )
        if self.sync_dir is None:
            self.sync_dir = tempfile.mkdtemp(prefix="rlcore-sync-")
        path = write_weights(weights, self.sync_dir)
        self._control("/collective_rpc", {"method": "rlcore_load_weights_from_path", "kwargs": {"path": path}})
        self.reset_prefix_cache()
        self.policy_version += 1

    def reset_prefix_cache(self) -> None:
        self._control("/reset_prefix_cache")

    def sleep(self, level: int = 1) -> None:
        self._control("/sleep", params={"level": level})

    def wake_up(self) -> None:
        self._control("/wake_up")

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
