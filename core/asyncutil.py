"""Helpers that let hooks and components be sync or ``async def`` interchangeably."""

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
