"""The one error a distributed run adds (a worker died or stopped answering), and how its message
quotes the worker's own error."""

from __future__ import annotations

from ..errors import RlcoreError


class WorkerFailedError(RlcoreError):
    """A Ray trainer or sampler worker died, was killed, or timed out. The message names the worker
    and says what to do (usually: resume from the last checkpoint)."""


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message that is not Ray's traceback framing (at most 300 characters),
    else the exception's type name: what a one-line worker failure quotes."""
    text = str(exc).strip()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("Traceback", "File ", "ray::")):
            return line[:300]
    return type(exc).__name__
