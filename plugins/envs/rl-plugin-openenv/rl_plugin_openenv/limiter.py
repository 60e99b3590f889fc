"""A session cap per server: how many OpenEnv sessions this process holds at once.

OpenEnv servers refuse sessions beyond ``max_concurrent_envs`` (``CAPACITY_REACHED``). Instead of a
burst of 64 trajectories tripping that limit and retrying in a storm, trajectories queue here for
a slot. The limit starts at what the server says it allows (``GET /capacity`` on this package's
servers, else the ``max_sessions`` a ``CAPACITY_REACHED`` error reports) and only ever shrinks.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

DEFAULT_SESSIONS = 8  # when neither the user nor the server says


class SessionLimiter:
    """An asyncio semaphore whose size can shrink, with a synchronous ``release`` (safe in ``finally``)."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, int(limit))
        self.in_use = 0
        self.waiting = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        # A training loop may call asyncio.run once per step: slots held on a dead loop are gone.
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self.in_use, self.waiting = loop, 0, 0
            self._waiters.clear()
        return loop

    async def acquire(self) -> None:
        loop = self._bind_loop()
        while self.in_use >= self.limit:
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append(fut)
            self.waiting += 1
            try:
                await fut
            except asyncio.CancelledError:
                if fut in self._waiters:
                    self._waiters.remove(fut)
                elif fut.done() and not fut.cancelled():
                    self._wake()  # we were handed a slot we will not use: pass it on
                raise
            finally:
                self.waiting -= 1
        self.in_use += 1

    def release(self) -> None:
        self.in_use = max(0, self.in_use - 1)
        self._wake()

    def shrink_to(self, limit: int) -> None:
        """Lower the cap (e.g. to the ``max_sessions`` a capacity error reported); never raises it."""
        if 1 <= limit < self.limit:
            self.limit = int(limit)

    def _wake(self) -> None:
        while self._waiters and self.in_use < self.limit:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return


#: Largest ``/capacity`` and ``/schema`` bodies read (bytes); a bigger one is a broken or hostile server.
MAX_CAPACITY_BYTES = 64 * 1024
MAX_SCHEMA_BYTES = 4 * 1024 * 1024


class ResponseTooLarge(ValueError):
    """A response body passed its size cap; it was not read further."""


async def get_json_capped(client: Any, url: str, max_bytes: int) -> tuple[int, Any]:
    """``GET url`` and parse its JSON body, reading at most ``max_bytes`` (streamed: a server that
    sends gigabytes costs ``max_bytes`` of memory, not gigabytes). Returns (status, parsed body)."""
    import json

    async with client.stream("GET", url) as resp:
        declared = resp.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > max_bytes:
            raise ResponseTooLarge(f"{url} answered with {declared} bytes (limit {max_bytes})")
        buf = bytearray()
        async for chunk in resp.aiter_bytes():
            buf += chunk
            if len(buf) > max_bytes:
                raise ResponseTooLarge(f"{url} answered with more than {max_bytes} bytes")
        return resp.status_code, json.loads(bytes(buf)) if resp.status_code == 200 else None


async def server_capacity(base_url: str, timeout: float = 3.0) -> int | None:
    """The server's session limit from ``GET /capacity`` (this package's servers), or None if unknown
    (also when the answer is over :data:`MAX_CAPACITY_BYTES`)."""
    import httpx

    url = http_url(base_url)
    try:
        # plain http needs no CA bundle (loading one blocks the event loop for ~0.1 s)
        async with httpx.AsyncClient(timeout=timeout, verify=url.startswith("https://")) as client:
            status, body = await get_json_capped(client, url + "/capacity", MAX_CAPACITY_BYTES)
        if status == 200:
            value: Any = body.get("max_sessions")
            return int(value) if value else None
    except (httpx.HTTPError, ValueError, TypeError, AttributeError):
        return None
    return None


SERVER_SCHEMES = ("http", "https", "ws", "wss")


def check_server_url(base_url: Any, what: str = "env_url") -> None:
    """Refuse, in one line naming ``what``, a server URL that cannot be an OpenEnv server: another
    scheme (``file://``, ``gopher://``), no host, a port outside 1-65535. (Was: retried for seconds,
    or an ``ExceptionGroup`` from deep inside the HTTP client.)"""
    from urllib.parse import urlsplit

    from rlcore.errors import ConfigError

    text = str(base_url)
    shown = repr(text[:120])
    url = text.strip() if "://" in text else "http://" + text.strip()
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError past 65535
    except ValueError as exc:
        raw = url.split("://", 1)[1].split("/", 1)[0].rpartition(":")[2]
        if raw.isdigit():
            raise ConfigError(f"{what} {shown}: the port must be 1-65535, got {raw}") from None
        raise ConfigError(f"{what} {shown} is not a server URL ({exc}); give http://HOST:PORT") from None
    if parts.scheme.lower() not in SERVER_SCHEMES:
        raise ConfigError(f"{what} {shown} is not an OpenEnv server URL: the scheme must be http, https, ws or wss, "
                          f"not {parts.scheme}; give http://HOST:PORT")
    if not parts.hostname:
        raise ConfigError(f"{what} {shown} names no host; give http://HOST:PORT")
    if port is not None and not 1 <= port <= 65535:
        raise ConfigError(f"{what} {shown}: the port must be 1-65535, got {port}")


def http_url(base_url: str) -> str:
    """``http(s)://host:port`` form of a base URL given as http(s) or ws(s), without a trailing slash."""
    url = base_url.rstrip("/")
    if url.endswith("/ws"):
        url = url[:-3]
    if url.startswith("ws://"):
        url = "http://" + url[5:]
    elif url.startswith("wss://"):
        url = "https://" + url[6:]
    elif "://" not in url:
        url = "http://" + url
    return url


def ws_url(base_url: str) -> str:
    """The session endpoint ``ws(s)://host:port/ws`` of a server's base URL."""
    url = http_url(base_url)
    return ("wss://" + url[8:] if url.startswith("https://") else "ws://" + url[7:]) + "/ws"
