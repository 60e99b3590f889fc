"""A robust async client for OpenEnv's WebSocket session endpoint: one session per trajectory.

Why not the stateless HTTP ``/reset`` and ``/step``: each request gets a fresh environment, so a
multi-turn episode needs the ``/ws`` session, where one socket = one server-side environment.

What this client guarantees (the failures OpenEnv users report):

* every call has a timeout; after a timeout, a closed socket or a broken frame the socket is
  *dropped* (closed in the background) and never read again, so a late reply can never be taken
  for the answer to the next call; the next session opens a fresh socket;
* ``CAPACITY_REACHED`` (the server sends it right after accepting, then closes) is retried with
  exponential backoff, as are refused connections and timeouts while opening a session, a bounded
  number of times; then :class:`rlcore.EnvError` with a one-line reason;
* sessions are always closed (``close`` is idempotent and never raises), and each holds a slot of
  the per-server :class:`~rl_plugin_openenv.limiter.SessionLimiter` while open.

A step is not retried on a fresh session: the new session would have a different episode. The
trajectory fails with the reason instead, and the run carries on.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import attrs
from rlcore.errors import EnvError

from .limiter import SessionLimiter, check_server_url, ws_url

#: server error codes after which the session is still usable (the request itself was bad)
REQUEST_ERRORS = ("VALIDATION_ERROR", "EXECUTION_ERROR", "INVALID_JSON", "UNKNOWN_TYPE")


class ActionRejected(EnvError):
    """The server refused one request (e.g. an action failing validation); the session is still open."""

    def __init__(self, code: str, message: str, details: Any = None) -> None:
        super().__init__(f"server rejected the request ({code}): {message}{_summarize(details)}")
        self.code = code
        self.server_message = message
        self.details = details


class _Retryable(Exception):
    """Opening a session failed in a way worth another try (capacity, refused, timeout, dropped)."""


@attrs.define
class ClientOptions:
    """Timeouts and retry policy of :class:`OpenEnvSession`."""

    connect_timeout: float = 10.0
    call_timeout: float = 30.0
    max_retries: int = 5  # extra attempts to open a session (capacity, refused, timeout)
    backoff: float = 0.2  # first wait, doubled each retry, jittered
    max_backoff: float = 5.0
    close_timeout: float = 2.0


@attrs.define
class ClientStats:
    """Counters summed over every session of a run (reported as metrics)."""

    sessions_opened: int = 0
    sessions_closed: int = 0
    capacity_retries: int = 0
    connect_retries: int = 0
    timeouts: int = 0
    dropped_sockets: int = 0
    rejected_actions: int = 0

    def as_metrics(self, prefix: str = "openenv/") -> dict[str, float]:
        return {prefix + k: float(v) for k, v in attrs.asdict(self).items()}


@attrs.define
class StepResult:
    """One reply: the observation fields, the step reward (None at reset), ``done``, metadata."""

    observation: dict[str, Any]
    reward: float | None = None
    done: bool = False
    metadata: dict[str, Any] = attrs.field(factory=dict)

    @classmethod
    def from_payload(cls, data: dict[str, Any]) -> "StepResult":
        obs = data.get("observation")
        reward = data.get("reward")
        return cls(
            observation=dict(obs) if isinstance(obs, dict) else {"value": obs},
            reward=None if reward is None else float(reward),
            done=bool(data.get("done", False)),
            metadata=dict(data.get("metadata") or {}),
        )


class OpenEnvSession:
    """One episode's session on an OpenEnv server. ``reset`` opens it, ``close`` ends it.

    ``limiter`` caps sessions per server across trajectories; ``stats`` is shared by a run.
    """

    def __init__(
        self,
        base_url: str,
        options: ClientOptions | None = None,
        *,
        limiter: SessionLimiter | None = None,
        stats: ClientStats | None = None,
    ) -> None:
        self.base_url = base_url
        self.url = ws_url(base_url)
        self.options = options or ClientOptions()
        self.limiter = limiter
        self.stats = stats if stats is not None else ClientStats()
        self._ws: Any = None
        self._holds_slot = False
        self._lock = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()

    @property
    def is_open(self) -> bool:
        return self._ws is not None

    # --- public calls ---------------------------------------------------------------------------
    async def acquire_slot(self) -> None:
        """Wait for a session slot on this server now (``reset`` would otherwise wait inside it)."""
        if self.limiter is not None and not self._holds_slot:
            await self.limiter.acquire()
            self._holds_slot = True

    async def reset(self, **kwargs: Any) -> StepResult:
        """Open a fresh session (closing any previous one) and reset it with ``kwargs``."""
        if self._ws is not None:
            await self.close()
        check_server_url(self.base_url, "OpenEnv server URL")  # file://, port 99999: one line, not retries
        opt = self.options
        last = "no attempt made"
        for attempt in range(opt.max_retries + 1):
            if attempt:
                await asyncio.sleep(self._backoff(attempt))
            try:
                return await self._open_and_reset(kwargs)
            except _Retryable as exc:
                last = str(exc)
        raise EnvError(
            f"OpenEnv server {self.base_url}: could not open a session after {opt.max_retries + 1} attempts "
            f"(last: {last}); check the server is up and its --max-concurrent-envs"
        )

    async def step(self, action: dict[str, Any]) -> StepResult:
        """Send one action. Raises :class:`ActionRejected` (session usable) or EnvError (session gone)."""
        if self._ws is None:
            raise EnvError(f"OpenEnv session to {self.base_url} is not open; reset() first")
        return StepResult.from_payload(await self._session_call({"type": "step", "data": action}, "step"))

    async def state(self) -> dict[str, Any]:
        """The server-side state of this session's environment."""
        if self._ws is None:
            raise EnvError(f"OpenEnv session to {self.base_url} is not open; reset() first")
        return dict(await self._session_call({"type": "state"}, "state"))

    async def close(self) -> None:
        """End the session: tell the server, close the socket, free the slot. Never raises."""
        ws, self._ws = self._ws, None
        try:
            if ws is not None:
                self.stats.sessions_closed += 1
                # a task of its own, shielded: a caller cancelled mid-close still ends the server session
                task = asyncio.ensure_future(_quiet(self._graceful_close(ws), self.options.close_timeout))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
                await asyncio.shield(task)
        finally:
            self._release_slot()

    async def __aenter__(self) -> "OpenEnvSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # --- internals --------------------------------------------------------------------------------
    async def _session_call(self, message: dict[str, Any], what: str) -> Any:
        """A call inside an open episode: a lost socket ends the episode with an EnvError."""
        try:
            return await self._call(message, what)
        except _SessionLost as exc:
            raise EnvError(f"OpenEnv server {self.base_url}: {exc}") from None
        except _CapacityReached as exc:
            await self._drop()
            raise EnvError(f"OpenEnv server {self.base_url}: {exc}") from None

    async def _open_and_reset(self, kwargs: dict[str, Any]) -> StepResult:
        await self.acquire_slot()
        try:
            self._ws = await asyncio.wait_for(
                _connect_without_redirects()(self.url, open_timeout=None, ping_interval=None, max_size=2**24, proxy=None),
                self.options.connect_timeout,
            )
        except asyncio.TimeoutError:
            self.stats.timeouts += 1
            self.stats.connect_retries += 1
            self._release_slot()
            raise _Retryable(f"connect timed out after {self.options.connect_timeout:g}s") from None
        except OSError as exc:  # refused, reset, DNS: server down or restarting
            self.stats.connect_retries += 1
            self._release_slot()
            raise _Retryable(f"cannot connect to {self.url}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - handshake rejected (e.g. HTTP 503 from a proxy)
            self._release_slot()
            response = getattr(exc, "response", None)
            status = getattr(response, "status_code", None)
            if isinstance(status, int) and 300 <= status < 400:  # the allowed server hands the session on: no
                location = str(response.headers.get("Location", "?"))[:120]  # type: ignore[union-attr]
                raise EnvError(
                    f"OpenEnv server {self.base_url} answered {self.url} with a redirect ({status} to {location}); "
                    "redirects are not followed (the allow-list names the servers a run talks to): point the URL "
                    "at the server itself") from None
            self.stats.connect_retries += 1
            raise _Retryable(f"websocket handshake with {self.url} failed: {type(exc).__name__}: {exc}") from None
        self.stats.sessions_opened += 1
        try:
            return StepResult.from_payload(await self._call({"type": "reset", "data": kwargs}, "reset"))
        except _CapacityReached as exc:
            self.stats.capacity_retries += 1
            await self._drop()
            if self.limiter is not None and exc.max_sessions:
                self.limiter.shrink_to(exc.max_sessions)
            raise _Retryable(str(exc)) from None
        except _SessionLost as exc:
            await self._drop()
            raise _Retryable(str(exc)) from None
        except BaseException:
            await self.close()
            raise

    async def _call(self, message: dict[str, Any], what: str) -> Any:
        """Send one message and read exactly its reply; any transport problem drops the socket."""
        from websockets.exceptions import ConnectionClosed

        async with self._lock:
            ws = self._ws
            if ws is None:
                raise _SessionLost(f"{what}: session already dropped")
            try:
                try:
                    await ws.send(json.dumps(message))
                except ConnectionClosed:
                    pass  # a refused session sends its error frame and closes: read it below
                raw = await asyncio.wait_for(ws.recv(), self.options.call_timeout)
            except asyncio.TimeoutError:
                self.stats.timeouts += 1
                await self._drop()
                raise _SessionLost(
                    f"{what} got no reply within {self.options.call_timeout:g}s; the session was dropped"
                ) from None
            except asyncio.CancelledError:
                await self._drop()  # a reply may still arrive: this socket must never be read again
                raise
            except ConnectionClosed as exc:
                await self._drop()
                raise _SessionLost(f"server closed the session during {what} ({_close_reason(exc)})") from None
            except OSError as exc:
                await self._drop()
                raise _SessionLost(f"connection lost during {what}: {exc}") from None
        try:
            reply = json.loads(raw)
        except (TypeError, ValueError):
            await self._drop()
            raise _SessionLost(f"{what}: server sent a non-JSON frame") from None
        if not isinstance(reply, dict):
            await self._drop()
            raise _SessionLost(f"{what}: server sent an unexpected frame")
        if reply.get("type") == "error":
            data = reply.get("data") or {}
            code = str(data.get("code", "UNKNOWN"))
            msg = str(data.get("message", "unknown error"))
            if code == "CAPACITY_REACHED":
                raise _CapacityReached(msg, data.get("max_sessions"))
            if code in REQUEST_ERRORS:
                self.stats.rejected_actions += what == "step"
                raise ActionRejected(code, msg, data.get("errors"))
            await self._drop()  # SESSION_ERROR / FACTORY_ERROR: the server ended this session
            raise EnvError(f"OpenEnv server {self.base_url} failed the session during {what} ({code}): {msg}")
        return reply.get("data") or {}

    async def _drop(self) -> None:
        """Forget the socket now; close it in the background so the caller is not held up."""
        ws, self._ws = self._ws, None
        if ws is not None:
            self.stats.dropped_sockets += 1
            task = asyncio.ensure_future(_quiet_close(ws, self.options.close_timeout))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        self._release_slot()

    async def _graceful_close(self, ws: Any) -> None:
        try:
            await ws.send(json.dumps({"type": "close"}))
        finally:
            await ws.close()

    def _release_slot(self) -> None:
        if self._holds_slot:
            self._holds_slot = False
            if self.limiter is not None:
                self.limiter.release()

    def _backoff(self, attempt: int) -> float:
        base = min(self.options.max_backoff, self.options.backoff * (2 ** (attempt - 1)))
        return base * (0.5 + random.random() / 2)


def _connect_without_redirects() -> Any:
    """websockets' ``connect`` that never follows a redirect: a 3xx to the ``/ws`` handshake raises
    (``InvalidStatus``) instead of opening a socket to wherever ``Location`` points."""
    global _NO_REDIRECTS
    if _NO_REDIRECTS is None:
        from websockets.asyncio.client import connect

        class connect_without_redirects(connect):  # type: ignore[misc, valid-type]
            def process_redirect(self, exc: Exception) -> Exception | str:
                return exc

        _NO_REDIRECTS = connect_without_redirects
    return _NO_REDIRECTS


_NO_REDIRECTS: Any = None


class _SessionLost(_Retryable):
    """The socket is gone (timeout, close, broken frame); the server-side episode is lost."""


class _CapacityReached(Exception):
    def __init__(self, message: str, max_sessions: Any = None) -> None:
        super().__init__(f"CAPACITY_REACHED: {message}")
        try:
            self.max_sessions = int(max_sessions) if max_sessions else None
        except (TypeError, ValueError):
            self.max_sessions = None


async def _quiet(coro: Any, timeout: float) -> None:
    """Await ``coro`` for at most ``timeout`` seconds, swallowing every failure (best-effort cleanup)."""
    try:
        await asyncio.wait_for(coro, timeout)
    except (Exception, asyncio.TimeoutError, asyncio.CancelledError):  # noqa: BLE001
        pass


async def _quiet_close(ws: Any, timeout: float) -> None:
    await _quiet(ws.close(), timeout)


def _close_reason(exc: Any) -> str:
    rcvd = getattr(exc, "rcvd", None)
    if rcvd is not None:
        return f"close code {rcvd.code}{': ' + rcvd.reason if rcvd.reason else ''}"
    return "connection dropped without a close frame"


def _summarize(details: Any) -> str:
    """The first validation problem, e.g. ``; guess: Input should be a valid integer``."""
    if isinstance(details, list) and details and isinstance(details[0], dict):
        first = details[0]
        loc = ".".join(str(p) for p in first.get("loc", ()) if p not in ("data",))
        return f"; {loc + ': ' if loc else ''}{first.get('msg', '')}".rstrip(": ")
    return ""
