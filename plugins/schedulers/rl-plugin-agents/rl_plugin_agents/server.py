"""The endpoint: one HTTP server per run on 127.0.0.1, sessions keyed by a per-trajectory API key.

Why a thread of its own: the trainer runs every rollout step in a fresh event loop
(``asyncio.run`` per step), while an agent's HTTP client and the server must outlive steps. So
the server (Starlette on uvicorn) lives in a daemon thread with its own loop for the whole run;
each session remembers the loop its trajectory runs on, and a request is handed to that loop
(``run_coroutine_threadsafe``) where the sampler, the token stream and the trajectory live. The
server thread only reads and writes HTTP.

Routes: ``POST /v1/chat/completions`` (JSON or SSE), ``GET /v1/models``, ``GET /health``. A
request without a live session's key is 401; a body over ``max_request_bytes`` is 413.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
from typing import Any, Protocol

from rlcore.asyncutil import serve_in_thread, stop_served

from .openai_format import ProxyError, completion_body, stream_chunks

#: the bind address, always: nothing listens beyond this machine
HOST = "127.0.0.1"


class Serving(Protocol):
    """What the server hands a request to (a :class:`~rl_plugin_agents.session.Session`)."""

    loop: asyncio.AbstractEventLoop
    model_name: str

    async def serve(self, body: Any) -> Any: ...


def _bearer(headers: Any) -> str | None:
    auth = headers.get("authorization") or ""
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return headers.get("x-api-key") or None


class ProxyServer:
    """The run's endpoint. :meth:`open` registers a session and returns its key; :meth:`close`
    forgets it (later requests with that key are 401)."""

    def __init__(self, *, max_request_bytes: int = 8 << 20, model_name: str = "rlcore-policy") -> None:
        self.max_request_bytes = int(max_request_bytes)
        self.model_name = model_name
        self.sessions: dict[str, Serving] = {}
        self.port = 0
        self.requests = 0  # requests answered (any status)
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The base URL agents use (OpenAI's ``base_url``: it ends in ``/v1``)."""
        return f"http://{HOST}:{self.port}/v1"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def open(self, session: Serving) -> str:
        key = f"rlcore-{secrets.token_urlsafe(24)}"
        self.sessions[key] = session
        return key

    def close(self, key: str) -> None:
        self.sessions.pop(key, None)

    # --- HTTP ------------------------------------------------------------------------------------------
    def _app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, StreamingResponse
        from starlette.routing import Route

        def error(exc: ProxyError) -> Any:
            return JSONResponse(exc.body(), status_code=exc.status)

        def session_of(request: Any) -> Serving:
            key = _bearer(request.headers)
            session = self.sessions.get(key) if key else None
            if session is None:
                raise ProxyError(401, "unknown or expired API key: each trajectory's agent gets its own key "
                                 "(OPENAI_API_KEY / the client it was handed), valid while the trajectory runs",
                                 kind="authentication_error", code="invalid_api_key")
            return session

        async def body_of(request: Any) -> Any:
            size = request.headers.get("content-length")
            if size is not None and size.isdigit() and int(size) > self.max_request_bytes:
                raise ProxyError(413, f"the request is {int(size)} bytes; max_request_bytes is {self.max_request_bytes}",
                                 code="request_too_large")
            chunks, total = [], 0
            async for chunk in request.stream():
                total += len(chunk)
                if total > self.max_request_bytes:
                    raise ProxyError(413, f"the request is over max_request_bytes ({self.max_request_bytes})",
                                     code="request_too_large")
                chunks.append(chunk)
            try:
                return json.loads(b"".join(chunks) or b"null")
            except (ValueError, RecursionError):
                raise ProxyError(400, "the request body is not JSON") from None

        async def chat(request: Any) -> Any:
            self.requests += 1
            try:
                session = session_of(request)
                body = await body_of(request)
                try:
                    fut = asyncio.run_coroutine_threadsafe(session.serve(body), session.loop)
                except RuntimeError:  # the trajectory's loop is gone: it ended
                    raise ProxyError(401, "the trajectory of this API key has ended", kind="authentication_error") from None
                reply = await asyncio.wrap_future(fut)
            except ProxyError as exc:
                return error(exc)
            if isinstance(body, dict) and body.get("stream"):
                options = body.get("stream_options") or {}
                usage = bool(isinstance(options, dict) and options.get("include_usage"))
                return StreamingResponse(iter(list(stream_chunks(reply, usage))), media_type="text/event-stream",
                                         headers={"cache-control": "no-cache"})
            return JSONResponse(completion_body(reply))

        async def models(request: Any) -> Any:
            try:
                session_of(request)
            except ProxyError as exc:
                return error(exc)
            return JSONResponse({"object": "list", "data": [
                {"id": self.model_name, "object": "model", "created": int(time.time()), "owned_by": "rlcore"}]})

        async def health(request: Any) -> Any:
            return JSONResponse({"status": "ok"})

        return Starlette(routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/chat/completions", chat, methods=["POST"]),  # a base_url given without /v1
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ])

    def start(self, timeout: float = 30.0) -> "ProxyServer":
        if self.running:
            return self
        self._server, self._thread, self.port = serve_in_thread(
            self._app(), HOST, 0, what="the agent proxy", thread_name="rlcore-agent-proxy",
            timeout=timeout, timeout_keep_alive=30, backlog=4096)
        return self

    def stop(self) -> None:
        stop_served(self._server, self._thread)
        self._thread = None
        self.sessions.clear()
