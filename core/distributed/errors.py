"""The one error a distributed run adds: a worker died or stopped answering."""

from __future__ import annotations

from ..errors import RlcoreError


class WorkerFailedError(RlcoreError):
    """A Ray trainer or sampler worker died, was killed, or timed out. The message names the worker
    and says what to do (usually: resume from the last checkpoint)."""
