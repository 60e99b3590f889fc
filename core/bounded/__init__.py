"""Run work on untrusted input (model output) in a worker process that is killed at a deadline.

Why a process and not a thread: a Python thread cannot be stopped. ``asyncio.wait_for`` around
``asyncio.to_thread`` only stops *waiting*; a sympy simplification of ``9^{9^{9^9}}`` keeps a core
busy (and memory growing) until the process exits. A worker process can be killed, so a deadline
here really ends the work. The worker also runs the function on its main thread, where libraries
that time themselves out with ``signal.alarm`` (math-verify) work, and it runs under an address
space limit, so a memory bomb raises ``MemoryError`` in the worker instead of swapping the host.

Usage::

    worker = BoundedWorker("rl_plugin_math.accuracy:math_verify_direct", timeout=5.0)
    try:
        verdict = worker.call(completion, reference)
    except CallTimedOut:
        verdict = False          # the worker was killed; the next call starts a fresh one

The target is named as ``"module:attr"`` so the worker imports it itself (closures and lambdas
cannot cross a process boundary). Arguments and results travel pickled; keep them small.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from ..errors import RlcoreError

#: Default per-call deadline (seconds) for work on model output: tool calls and reward samples.
DEFAULT_TIMEOUT = 5.0
#: Default extra address space a worker may allocate beyond what it holds after loading (MiB).
DEFAULT_MEMORY_MB = 1024
#: Largest message either side accepts (bytes); a bigger one is a broken or hostile worker.
MAX_FRAME = 64 * 1024 * 1024
_HEADER = struct.Struct("<Q")


class CallTimedOut(RlcoreError, TimeoutError):
    """The call did not finish within its deadline; its worker was killed."""


class CallFailed(RlcoreError):
    """The function raised in the worker (``kind`` is the exception type name, e.g. ``MemoryError``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


def _write_frame(fd: Any, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    fd.write(_HEADER.pack(len(data)) + data)
    fd.flush()


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise CallTimedOut("deadline passed")
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("worker closed its output")
        buf += chunk
    return bytes(buf)


def _read_frame(fd: int, deadline: float | None) -> Any:
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    if size > MAX_FRAME:
        raise EOFError(f"worker sent a {size}-byte message (limit {MAX_FRAME})")
    return pickle.loads(_read_exact(fd, size, deadline))


class BoundedWorker:
    """One worker process running one target function, with a per-call deadline.

    Thread-safe: calls are serialised (one worker runs one call at a time). The process starts on
    the first call and restarts after a timeout or a crash, each time importing the target and
    running ``warmup`` (args of one call, so lazy imports are not charged to a real call's deadline).
    """

    def __init__(
        self,
        target: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        memory_mb: int | None = DEFAULT_MEMORY_MB,
        warmup: tuple[Any, ...] | None = None,
        startup_timeout: float = 300.0,
    ) -> None:
        if ":" not in target:
            raise ValueError(f"target must be 'module:attr', got {target!r}")
        self.target = target
        self.timeout = float(timeout)
        self.memory_mb = memory_mb
        self.warmup = warmup
        self.startup_timeout = startup_timeout
        self.timeouts = 0  # calls that hit the deadline (their worker was killed)
        self.restarts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner = os.getpid()  # a forked copy of this object must not kill its parent's worker
        self._lock = threading.Lock()

    # --- process lifecycle --------------------------------------------------------------------------
    def _start(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlcore.bounded.child"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=dict(os.environ), close_fds=True,
        )
        assert proc.stdin is not None and proc.stdout is not None
        try:
            _write_frame(proc.stdin, ("load", self.target, self.warmup, self.memory_mb))
            reply = _read_frame(proc.stdout.fileno(), time.monotonic() + self.startup_timeout)
        except (CallTimedOut, EOFError, OSError) as exc:
            self._kill(proc)
            raise CallFailed("WorkerStartError", f"worker for {self.target} did not start: {exc}") from None
        if reply[0] != "ready":
            self._kill(proc)
            raise CallFailed(reply[1], f"worker for {self.target} could not load it: {reply[2]}")
        return proc

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes]) -> None:
        try:
            proc.kill()
        except OSError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignorable
            pass
        for f in (proc.stdin, proc.stdout):
            try:
                f.close()  # type: ignore[union-attr]
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                self._kill(self._proc)
                self._proc = None

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            if self._proc is not None and os.getpid() == self._owner:
                self._kill(self._proc)
        except Exception:
            pass

    # --- calls -------------------------------------------------------------------------------------
    def call(self, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        """``target(*args, **kwargs)`` in the worker. Raises :class:`CallTimedOut` after ``timeout``
        seconds (default: the worker's) and :class:`CallFailed` when the function raised."""
        limit = self.timeout if timeout is None else float(timeout)
        with self._lock:
            if os.getpid() != self._owner:  # forked: the worker and its pipes belong to the parent
                self._owner, self._proc = os.getpid(), None
            if self._proc is None or self._proc.poll() is not None:
                if self._proc is not None:
                    self.restarts += 1
                self._proc = self._start()
            proc = self._proc
            assert proc.stdin is not None and proc.stdout is not None
            try:
                _write_frame(proc.stdin, ("call", args, kwargs))
                reply = _read_frame(proc.stdout.fileno(), time.monotonic() + limit)
            except CallTimedOut:
                self.timeouts += 1
                self._kill(proc)
                self._proc = None
                raise CallTimedOut(f"{self.target} did not finish within {limit:g} s (worker killed)") from None
            except (EOFError, OSError, pickle.UnpicklingError) as exc:
                self._kill(proc)
                self._proc = None  # e.g. killed by the OOM killer: the next call starts a fresh one
                raise CallFailed("WorkerDied", f"worker for {self.target} died: {exc}") from None
        if reply[0] == "ok":
            return reply[1]
        raise CallFailed(reply[1], reply[2])
