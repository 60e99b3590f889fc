"""The child process of :mod:`rlcore.bounded` (``python -m rlcore.bounded.child``): the worker side.

Reads pickled requests from stdin and answers on stdout: first ``("load", "module:attr", warmup,
memory_mb)``, then any number of ``("call", args, kwargs)``. The parent kills this process when a
call passes its deadline, so nothing here needs its own timeout. The address-space limit is set
after loading (imports are not the model's fault), as "what the loaded worker holds + memory_mb".
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any


def _limit_memory(extra_mb: int | None) -> None:
    if not extra_mb:
        return
    try:
        import resource

        with open("/proc/self/statm", encoding="ascii") as f:
            vsize = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = vsize + int(extra_mb) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (OSError, ValueError, ImportError):  # not Linux: run without the cap
        pass


def _load(spec: str) -> Any:
    module, _, attr = spec.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def main() -> None:
    from rlcore.bounded import _read_frame, _write_frame

    inp = sys.stdin.buffer.fileno()
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # a chatty target must not corrupt the reply stream
    fn = None
    while True:
        try:
            req = _read_frame(inp, None)
        except EOFError:
            return
        if req[0] == "load":
            _, spec, warmup, memory_mb = req
            try:
                fn = _load(spec)
                if warmup is not None:
                    fn(*warmup)
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                _write_frame(out, ("error", type(exc).__name__, str(exc)[:500]))
                return
            _limit_memory(memory_mb)
            _write_frame(out, ("ready",))
            continue
        _, args, kwargs = req
        try:
            result = fn(*args, **kwargs)  # type: ignore[misc]
            reply: tuple[Any, ...] = ("ok", result)
        except BaseException as exc:  # noqa: BLE001 - MemoryError, RecursionError … go back as data
            reply = ("error", type(exc).__name__, str(exc)[:500])
        try:
            _write_frame(out, reply)
        except BaseException as exc:  # noqa: BLE001 - an unpicklable or huge result
            _write_frame(out, ("error", type(exc).__name__, f"could not send the result: {str(exc)[:200]}"))


if __name__ == "__main__":
    main()
