"""Built-in losses and advantage estimators, registered like any third-party plugin's."""

from __future__ import annotations

from typing import Callable

from ..hookspecs import hookimpl


@hookimpl
def register_losses(register: Callable[..., None]) -> None:
    pass  # filled by the trainer work


@hookimpl
def register_advantages(register: Callable[..., None]) -> None:
    pass  # filled by the trainer work
