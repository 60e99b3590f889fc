"""Serve this package's environments with OpenEnv's own ``create_app`` + uvicorn.

Binds 127.0.0.1 unless told otherwise: an environment server executes whatever actions it is sent,
so exposing it beyond the machine must be a deliberate choice. ``GET /capacity`` is added next to
OpenEnv's routes so clients can size their session pool to the server (``max_sessions``) and
tests can see leaked sessions (``active_sessions``).

Keep-alive: WebSocket pings every ``ping_interval`` seconds drop a client that vanished without
closing, and :class:`~rl_plugin_openenv.keepalive.IdleReaper` ends a session that sent nothing for
``idle_timeout`` seconds, so no client holds a session slot forever.
"""

from __future__ import annotations

import functools
import socket
import threading
import time
from typing import Any

from rlcore.errors import ConfigError

from .games import GAMES, game
from .keepalive import IDLE_TIMEOUT, PING_INTERVAL, PING_TIMEOUT, IdleReaper

DEFAULT_HOST = "127.0.0.1"


def build_app(name: str, *, max_concurrent_envs: int = 64, step_delay: float = 0.0,
              idle_timeout: float | None = IDLE_TIMEOUT) -> Any:
    """The app serving environment ``name`` with at most ``max_concurrent_envs`` sessions, each
    ended after ``idle_timeout`` seconds without a message (None: never)."""
    if name not in GAMES:
        raise ConfigError(f"unknown OpenEnv environment {name!r}; choose one of: {', '.join(sorted(GAMES))}")
    if max_concurrent_envs < 1:
        raise ConfigError(f"--max-concurrent-envs must be >= 1, got {max_concurrent_envs}")
    from openenv.core.env_server import create_app  # already imported by .games, without gradio

    env_cls, action_cls, obs_cls = game(name)
    factory = functools.partial(env_cls, step_delay=step_delay)
    app = create_app(factory, action_cls, obs_cls, env_name=name, max_concurrent_envs=max_concurrent_envs)

    if idle_timeout is not None and not idle_timeout > 0:
        raise ConfigError(f"--idle-timeout must be a positive number of seconds, got {idle_timeout}")
    reaper = IdleReaper(app, idle_timeout)

    @app.get("/capacity", tags=["Health"])
    async def capacity() -> dict[str, int]:
        return {"max_sessions": max_concurrent_envs, "active_sessions": int(getattr(env_cls, "live", -1)),
                "reaped_sessions": reaper.reaped}

    return reaper


def serve(
    name: str, *, host: str = DEFAULT_HOST, port: int = 8000, max_concurrent_envs: int = 64,
    step_delay: float = 0.0, log_level: str = "warning", idle_timeout: float | None = IDLE_TIMEOUT,
    ping_interval: float | None = PING_INTERVAL, ping_timeout: float | None = PING_TIMEOUT,
) -> None:
    """Run the server in the foreground until interrupted."""
    import uvicorn

    app = build_app(name, max_concurrent_envs=max_concurrent_envs, step_delay=step_delay, idle_timeout=idle_timeout)
    uvicorn.run(app, host=host, port=port, log_level=log_level, ws_ping_interval=ping_interval, ws_ping_timeout=ping_timeout)


def free_port(host: str = DEFAULT_HOST) -> int:
    """A TCP port nobody listens on right now (for tests and benchmarks)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_until_up(base_url: str, timeout: float = 30.0) -> None:
    """Poll ``/health`` until the server answers; raise ``TimeoutError`` naming the URL otherwise."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(base_url.rstrip("/") + "/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"OpenEnv server at {base_url} did not come up within {timeout:.0f}s")


def active_sessions(url: str) -> int:
    """Sessions the server at ``url`` (this package's) holds open now (``GET /capacity``)."""
    import httpx

    return int(httpx.get(url.rstrip("/") + "/capacity", timeout=5.0).json()["active_sessions"])


async def sessions_settle(url: str, n: int = 0, timeout: float = 5.0) -> int:
    """Sessions close asynchronously on the server: poll until ``url`` holds ``n`` of them (or
    ``timeout`` seconds pass) and return the count then — for tests that check nothing leaks."""
    import asyncio

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and active_sessions(url) != n:
        await asyncio.sleep(0.02)
    return active_sessions(url)


class ServerThread:
    """A real uvicorn server in a background thread of this process: ``with ServerThread(...) as url``.

    Used by tests and the benchmark; ``stop()`` shuts it down (open sockets are closed by the server,
    which is how a server going away looks to clients).
    """

    def __init__(self, name: str = "guess_number", *, port: int | None = None, ping_interval: float | None = PING_INTERVAL,
                 ping_timeout: float | None = PING_TIMEOUT, **app_options: Any) -> None:
        import uvicorn

        self.port = port or free_port()
        self.url = f"http://{DEFAULT_HOST}:{self.port}"
        app = build_app(name, **app_options)
        config = uvicorn.Config(app, host=DEFAULT_HOST, port=self.port, log_level="error",
                                ws_ping_interval=ping_interval, ws_ping_timeout=ping_timeout)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name=f"openenv-{name}-{self.port}", daemon=True)

    def start(self) -> "ServerThread":
        self._thread.start()
        wait_until_up(self.url)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)

    def __enter__(self) -> str:
        self.start()
        return self.url

    def __exit__(self, *exc: Any) -> None:
        self.stop()
