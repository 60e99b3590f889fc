"""Micro-batching by arrival: requests that arrive close together run as one batch.

The window restarts on every arrival (a batch closes after ``window_s`` with no new request),
capped by ``max_wait_s`` from the first arrival and by ``max_batch_size``. Why not a window fixed
from the first arrival: under load, requests trickle in (64 trajectories finishing their env
steps a few ms apart); a fixed window closes on the first one or few, which then decode alone
while the rest queue behind them — a rollout turn split into batches of [1, 63].

Why a worker thread and not an asyncio task: the model's forward loop is blocking work that must
not stall the event loop every trajectory runs on, and a thread-owned queue works from whichever
event loop (or plain thread) submits — samplers outlive the ``asyncio.run`` calls that use them.
While one batch runs, new arrivals queue up and form the next batch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from typing import Any, Callable, Generic, TypeVar

from ..errors import SamplerError

Req = TypeVar("Req")

_STOP = object()


class BatchHandle(Generic[Req]):
    """A running batch, for backends that decode step by step (``streaming=True``).

    ``finish(i, result)`` answers request ``i`` as soon as its row is done (its trajectory moves on
    while the rest of the batch decodes); ``admit(limit)`` takes requests that arrived since the
    batch started, so they join at the next step instead of waiting for the whole batch.
    """

    def __init__(self, batcher: "MicroBatcher[Req]", items: list[tuple[Req, concurrent.futures.Future]]) -> None:
        self._batcher = batcher
        self.items = items

    @property
    def requests(self) -> list[Req]:
        return [r for r, _ in self.items]

    def finish(self, index: int, result: Any) -> None:
        fut = self.items[index][1]
        if not fut.done():
            fut.set_result(result)

    def waiting(self) -> tuple[int, float | None]:
        """How many requests are queued behind this batch, and when the oldest arrived
        (``time.monotonic()``); never blocks. Lets the backend gather joiners before admitting."""
        q = self._batcher._queue
        with q.mutex:
            n = len(q.queue)
            head = q.queue[0] if n else None
        if head is None or head is _STOP:
            return 0, None
        return n, head[2]

    def admit_joiners(self, free: int, join_window_s: float) -> list[int]:
        """Indices of the queued requests admitted as one group, once they fill the ``free`` rows or
        the oldest has waited ``join_window_s`` (one prefill for many joiners beats one each); else []."""
        waiting, oldest = self.waiting()
        if not waiting or oldest is None:
            return []
        if waiting < free and time.monotonic() - oldest < join_window_s:
            return []
        start = len(self.items)
        return list(range(start, start + len(self.admit(free))))

    def admit(self, limit: int) -> list[Req]:
        """Up to ``limit`` queued requests (never blocks); they get the next indices."""
        taken: list[Req] = []
        while len(taken) < limit:
            try:
                item = self._batcher._queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                self._batcher._queue.put(_STOP)
                break
            req, fut, _ = item
            if fut.set_running_or_notify_cancel():
                self.items.append((req, fut))
                taken.append(req)
        if taken:
            self._batcher.batch_sizes[-1] += len(taken)
        return taken


class MicroBatcher(Generic[Req]):
    """Collects requests until none arrives for ``window_s`` (at most ``max_wait_s`` after the first,
    default four windows; at most ``max_batch_size`` of them) and hands each batch to
    ``run_batch(requests) -> results`` on one worker thread — or, with ``streaming=True``, to
    ``run_batch(handle)`` which answers through a :class:`BatchHandle`."""

    def __init__(
        self,
        run_batch: Callable[[list[Req]], list[Any]],
        *,
        window_s: float = 0.005,
        max_wait_s: float | None = None,
        max_batch_size: int = 64,
        name: str = "rlcore-sampler",
        streaming: bool = False,
    ) -> None:
        self.run_batch = run_batch
        self.streaming = streaming
        self.window_s = max(0.0, window_s)
        self.max_wait_s = max(self.window_s, 4 * self.window_s if max_wait_s is None else max_wait_s)
        self.max_batch_size = max(1, max_batch_size)
        self.name = name
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        #: sizes of the batches run so far (for tests and benchmarks)
        self.batch_sizes: list[int] = []

    def submit(self, request: Req) -> concurrent.futures.Future:
        """Queue a request; the future resolves to its result (or a :class:`SamplerError`)."""
        if self._closed:
            raise SamplerError(f"{self.name} is closed; create a new sampler")
        self._ensure_thread()
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((request, fut, time.monotonic()))
        return fut

    async def submit_async(self, request: Req) -> Any:
        return await asyncio.wrap_future(self.submit(request))

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()

    def _collect(self) -> list[tuple[Req, concurrent.futures.Future]] | None:
        first = self._queue.get()
        if first is _STOP:
            return None
        batch = [first[:2]]
        now = time.monotonic()
        cap, deadline = now + self.max_wait_s, now + self.window_s
        while len(batch) < self.max_batch_size:
            remaining = min(deadline, cap) - time.monotonic()
            try:
                item = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                self._queue.put(_STOP)  # finish this batch, then stop
                break
            batch.append(item[:2])
            deadline = time.monotonic() + self.window_s  # restart: more may be on their way
        return batch

    def _loop(self) -> None:
        while True:
            batch = self._collect()
            if batch is None:
                return
            live = [(r, f) for r, f in batch if f.set_running_or_notify_cancel()]
            if not live:
                continue
            self.batch_sizes.append(len(live))
            handle = BatchHandle(self, live)
            try:
                if self.streaming:
                    self.run_batch(handle)
                else:
                    for i, res in enumerate(self.run_batch(handle.requests)):
                        if isinstance(res, BaseException):
                            if not live[i][1].done():
                                live[i][1].set_exception(res)
                        else:
                            handle.finish(i, res)
            except BaseException as exc:  # noqa: BLE001 - every waiter learns why
                err = exc if isinstance(exc, SamplerError) else SamplerError(
                    f"{self.name}: generation failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                )
                self._fail_unanswered(handle, err)
                continue
            self._fail_unanswered(handle, SamplerError(f"{self.name}: the backend returned no result for a request"))

    @staticmethod
    def _fail_unanswered(handle: "BatchHandle[Any]", err: BaseException) -> None:
        for _, f in handle.items:
            if not f.done():
                f.set_exception(err)

    def close(self) -> None:
        """Stop the worker after the current batch; queued requests fail with a SamplerError."""
        self._closed = True
        pending = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                pending.append(item)
        for _, f, _t in pending:
            if f.set_running_or_notify_cancel():
                f.set_exception(SamplerError(f"{self.name} was closed before this request ran"))
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._queue.put(_STOP)
            thread.join(timeout=30)
