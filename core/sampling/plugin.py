"""Built-in sampler backends, registered like any third-party plugin's."""

from __future__ import annotations

from typing import Callable

from ..hookspecs import hookimpl


@hookimpl
def register_samplers(register: Callable[..., None]) -> None:
    pass  # filled by the samplers work
