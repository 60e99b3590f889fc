"""Asking a judge behind any OpenAI-compatible ``/v1/chat/completions`` endpoint (OpenAI, vLLM,
SGLang, llama.cpp's server, Ollama, a proxy).

Every question is one request, at most ``max_concurrency`` in flight; each attempt has a deadline
(``timeout`` seconds, the whole request, not httpx's per-read timeout: a server that trickles bytes
is stopped too). Connection errors, deadlines, 408, 429 and 5xx are retried ``retries`` times with
exponential backoff and jitter (``Retry-After`` honoured); another 4xx (a wrong model name, a bad
key) is not, since asking again cannot help; nor is a body over 4 MiB (a verdict is a few KiB).
What is still wrong after that is a
:class:`JudgeError` for that question — the reward counts it for its sample and goes on.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any
from urllib.parse import urlsplit

from rlcore.errors import ConfigError


class JudgeError(Exception):
    """One question the judge could not answer (after retries), or whose answer held no score."""


#: statuses worth asking again: the server is busy, restarting or briefly broken
RETRY_STATUS = frozenset({408, 429}) | frozenset(range(500, 600))


def chat_url(url: str) -> str:
    """The chat-completions URL for ``url``: as given when it ends in ``/chat/completions``, else
    ``/chat/completions`` appended to a base ending in ``/v1`` (OpenAI's ``base_url``), else
    ``/v1/chat/completions`` appended to a server root."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"llm_judge: judge_url {url!r} is not an http(s) URL; give the server's address, e.g. "
                          "http://127.0.0.1:8000/v1")
    base = url.rstrip("/")
    if base.endswith("/chat/completions"):
        return base
    if base.endswith("/v1"):
        return base + "/chat/completions"
    return base + "/v1/chat/completions"


#: the largest reply body read; a judge's verdict is a few KiB, a server that sends more is broken
MAX_REPLY_BYTES = 4 * 1024 * 1024


def _detail(raw: bytes) -> str:
    """The error message a server sent, short (OpenAI: ``{"error": {"message"}}``; vLLM: ``{"message"}``)."""
    try:
        body = json.loads(raw)
    except ValueError:
        text = raw.decode("utf-8", "replace").strip().splitlines()
        return (text[0] if text else "")[:200]
    if isinstance(body, dict):
        err = body.get("error")
        msg = err.get("message") if isinstance(err, dict) else err or body.get("message") or body.get("detail")
        return str(msg or body)[:200]
    return str(body)[:200]


def reply_text(body: Any) -> str:
    """``choices[0].message.content`` of a chat-completion body, or :class:`JudgeError`."""
    try:
        content = body["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise JudgeError(f"the judge's reply is not a chat completion (no choices[0].message.content): "
                         f"{json.dumps(body)[:120]}") from None
    if isinstance(content, list):  # content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(content, str):
        raise JudgeError("the judge's reply has no text (choices[0].message.content is empty)")
    return content


class EndpointJudge:
    """The judge at ``url`` (see :func:`chat_url`), asked with ``model`` (omitted when None)."""

    def __init__(self, url: str, model: str | None = None, *, api_key: str | None = None, timeout: float = 60.0,
                 retries: int = 2, backoff: float = 0.5, max_backoff: float = 8.0, max_tokens: int = 256,
                 temperature: float = 0.0, max_concurrency: int = 8) -> None:
        self.url = chat_url(url)
        self.model = model
        self.api_key = api_key
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff, self.max_backoff = float(backoff), float(max_backoff)
        self.max_tokens = int(max_tokens)
        self.temperature = float(temperature)
        self.max_concurrency = int(max_concurrency)

    @property
    def identity(self) -> str:
        """What the verdict cache keys on besides the question: the server and its model."""
        return f"{self.url}#{self.model or ''}"

    def describe(self) -> str:
        return f"{self.model or 'the served model'} at {self.url}"

    async def ask_all(self, questions: list[list[dict[str, Any]]]) -> list[str | JudgeError]:
        """The reply to each question (chat messages), or the :class:`JudgeError` it ended in."""
        import httpx

        if not questions:
            return []
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        limits = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
        gate = asyncio.Semaphore(self.max_concurrency)
        # one client per call: a client is bound to its event loop, and each scoring call may run on a new one
        async with httpx.AsyncClient(timeout=httpx.Timeout(self.timeout), limits=limits, headers=headers) as client:

            async def one(messages: list[dict[str, Any]]) -> str | JudgeError:
                async with gate:
                    try:
                        return await self.ask(client, messages)
                    except JudgeError as exc:
                        return exc

            return list(await asyncio.gather(*(one(q) for q in questions)))

    def _delay(self, attempt: int, response: Any = None) -> float:
        retry_after = response.headers.get("retry-after") if response is not None else None
        if retry_after:
            try:
                return max(0.0, min(float(retry_after), self.max_backoff))
            except ValueError:
                pass
        return min(self.max_backoff, self.backoff * 2 ** attempt) * (0.75 + 0.5 * random.random())

    async def _post(self, client: Any, body: dict[str, Any]) -> tuple[Any, bytes]:
        """One request: the response (closed) and its body, read up to :data:`MAX_REPLY_BYTES`."""
        async with client.stream("POST", self.url, json=body) as response:
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > MAX_REPLY_BYTES:
                    raise JudgeError(f"the judge at {self.url} sent more than {MAX_REPLY_BYTES} bytes; a verdict is "
                                     "a short reply (is judge_url a chat-completions server?)")
                chunks.append(chunk)
        return response, b"".join(chunks)

    async def ask(self, client: Any, messages: list[dict[str, Any]]) -> str:
        import httpx

        body: dict[str, Any] = {"messages": messages, "max_tokens": self.max_tokens, "temperature": self.temperature}
        if self.model:
            body["model"] = self.model
        last = ""
        for attempt in range(self.retries + 1):
            response = None
            try:
                response, raw = await asyncio.wait_for(self._post(client, body), self.timeout)
            except (asyncio.TimeoutError, httpx.TimeoutException):
                last = f"no reply within {self.timeout:g} s"
            except httpx.TransportError as exc:  # refused, reset, DNS
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                if response.status_code < 400:
                    try:
                        data = json.loads(raw)
                    except ValueError:
                        text = raw.decode("utf-8", "replace")[:120]
                        raise JudgeError(f"the judge at {self.url} answered {response.status_code} with no JSON: "
                                         f"{text!r}") from None
                    return reply_text(data)
                detail = _detail(raw)
                if response.status_code not in RETRY_STATUS:
                    raise JudgeError(f"the judge at {self.url} answered {response.status_code}: {detail}")
                last = f"{response.status_code}: {detail}"
            if attempt < self.retries:
                await asyncio.sleep(self._delay(attempt, response))
        tries = f"{self.retries + 1} {'try' if self.retries == 0 else 'tries'}"
        raise JudgeError(f"the judge at {self.url} failed {tries} ({last})")
