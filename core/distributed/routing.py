"""Which sampler worker serves a request: sticky per trajectory, else the least-loaded one.

Why sticky: a multi-turn trajectory re-sends its whole growing prefix every turn; sending it back
to the worker that served the previous turn lets that worker's prefix/KV cache help. Why
least-loaded for a new trajectory: workers finish at different speeds, and in-flight request
counts are the cheapest honest signal of who is free.

The trajectory is identified by :func:`bind_trajectory` (a context variable the rollout driver or a
scheduler may set) and otherwise by the current asyncio task — the rollout driver runs one task
per trajectory, so that is the trajectory.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import weakref
from collections import OrderedDict
from typing import Any, Hashable, Iterator

_trajectory_key: contextvars.ContextVar[str | None] = contextvars.ContextVar("rlcore_trajectory_key", default=None)


@contextlib.contextmanager
def bind_trajectory(uuid: str) -> Iterator[None]:
    """Route every ``generate`` inside this block as trajectory ``uuid`` (sticky to one worker)."""
    token = _trajectory_key.set(uuid)
    try:
        yield
    finally:
        _trajectory_key.reset(token)


def current_key() -> Hashable | None:
    """The routing key of the caller: the bound trajectory uuid, else the running asyncio task."""
    key = _trajectory_key.get()
    if key is not None:
        return key
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


class Router:
    """Assigns keys to worker indices. Not thread-safe: used from one event loop."""

    def __init__(self, num_workers: int, max_keys: int = 100_000) -> None:
        self.inflight = [0] * num_workers
        self.assigned = [0] * num_workers
        self.alive = set(range(num_workers))
        self._by_uuid: OrderedDict[str, int] = OrderedDict()
        self._by_task: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._max_keys = max_keys
        self._lost_by_uuid: OrderedDict[str, list[int]] = OrderedDict()
        self._lost_by_task: weakref.WeakKeyDictionary[Any, list[int]] = weakref.WeakKeyDictionary()

    def pick(self, key: Hashable | None) -> int:
        """The worker for ``key``: its previous worker while alive, else the least-loaded live one."""
        if not self.alive:
            raise LookupError("no live workers")
        prev = self._get(key)
        if prev is not None and prev in self.alive:
            return prev
        idx = min(self.alive, key=lambda i: (self.inflight[i], self.assigned[i], i))
        self.assigned[idx] += 1
        self._set(key, idx)
        return idx

    def mark_dead(self, idx: int) -> None:
        self.alive.discard(idx)

    def lost(self, key: Hashable | None, idx: int) -> list[int]:
        """Note that worker ``idx`` died under ``key``'s request; the workers ``key`` has lost so far,
        in order (a trajectory is retried on another worker once: a second loss ends it)."""
        history = list(self._get_lost(key) or []) + [idx]
        self._set_lost(key, history)
        return history

    def _get_lost(self, key: Hashable | None) -> list[int] | None:
        if key is None:
            return None
        if isinstance(key, str):
            return self._lost_by_uuid.get(key)
        try:
            return self._lost_by_task.get(key)
        except TypeError:
            return None

    def _set_lost(self, key: Hashable | None, history: list[int]) -> None:
        if key is None:
            return
        if isinstance(key, str):
            self._lost_by_uuid[key] = history
            while len(self._lost_by_uuid) > self._max_keys:
                self._lost_by_uuid.popitem(last=False)
            return
        try:
            self._lost_by_task[key] = history
        except TypeError:
            pass

    def worker_of(self, key: Hashable) -> int | None:
        return self._get(key)

    def _get(self, key: Hashable | None) -> int | None:
        if key is None:
            return None
        if isinstance(key, str):
            idx = self._by_uuid.get(key)
            if idx is not None:
                self._by_uuid.move_to_end(key)
            return idx
        try:
            return self._by_task.get(key)
        except TypeError:
            return None

    def _set(self, key: Hashable | None, idx: int) -> None:
        if key is None:
            return
        if isinstance(key, str):
            self._by_uuid[key] = idx
            while len(self._by_uuid) > self._max_keys:
                self._by_uuid.popitem(last=False)
            return
        try:
            self._by_task[key] = idx
        except TypeError:
            pass
