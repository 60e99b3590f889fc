"""Built-in schedulers, registered like any third-party plugin's."""

from __future__ import annotations

from typing import Callable

from ..hookspecs import hookimpl


@hookimpl
def register_schedulers(register: Callable[..., None]) -> None:
    pass  # filled by the rollout work
