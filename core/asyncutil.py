"""Helpers that let hooks and components be sync or ``async def`` interchangeably, and an ASGI app
served from a thread of this process (rlcore's local HTTP endpoints)."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Awaitable, Callable, TypeVar

T = TypeVar("T")


async def await_me_maybe(value: Any) -> Any:
    """Return ``value``, awaiting it first if it is awaitable (a hook implemented as ``async def``)."""
    if inspect.isawaitable(value):
        return await value
    return value


async def gather_maybe(values: list[Any]) -> list[Any]:
    """Await every awaitable in ``values`` concurrently, keeping order and plain values as they are."""
    pending = [(i, v) for i, v in enumerate(values) if inspect.isawaitable(v)]
    out = list(values)
    if pending:
        results = await asyncio.gather(*(v for _, v in pending))
        for (i, _), r in zip(pending, results):
            out[i] = r
    return out


async def to_thread_if_sync(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call an ``async def`` directly, run a blocking sync function in a worker thread.

    Used for user-supplied environment and reward code that may block on I/O: it must never stall
    the event loop on which every other trajectory's generation is waiting.
    """
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
        return await fn(*args, **kwargs)
    result = await asyncio.to_thread(fn, *args, **kwargs)
    return await await_me_maybe(result)


def run_sync(coro: Awaitable[T]) -> T:
    """Run a coroutine from synchronous code, also when called inside a running loop (in a thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()  # type: ignore[arg-type]


def serve_in_thread(app: Any, host: str, port: int = 0, *, what: str, thread_name: str | None = None,
                    timeout: float = 30.0, **config: Any) -> tuple[Any, Any, int]:
    """Serve ``app`` with uvicorn in a daemon thread, on a socket bound here to ``host``:``port``
    (0: a free port), and wait until it accepts: ``(server, thread, port)``; the thread is named
    ``thread_name:port`` (default ``what``). ``config`` are more
    ``uvicorn.Config`` keywords. One line naming ``what`` when it does not start within ``timeout``."""
    import socket
    import threading
    import time

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, **{"log_level": "warning", "access_log": False, "lifespan": "off", **config}))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name=f"{thread_name or what}:{port}")
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"{what} on http://{host}:{port} did not start")
        time.sleep(0.01)
    return server, thread, port


def stop_served(server: Any, thread: Any, timeout: float = 10.0) -> None:
    """Stop what :func:`serve_in_thread` started (either may be None: nothing to stop)."""
    if server is not None:
        server.should_exit = True
    if thread is not None:
        thread.join(timeout=timeout)
