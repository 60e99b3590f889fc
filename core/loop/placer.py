"""Where a :class:`~rlcore.loop.Policy` built with ``remote_group=`` goes: the placer protocol.

The loop layer only defines the hook; a placement backend one layer up sets it —
``rlcore.distributed.initialize(mode="ray", groups=[...])`` installs the Ray placer, which builds
the policy in an actor on the named group and hands back a proxy with the same methods. With no
placer (``mode="local"``, the default) ``remote_group`` is ignored and the policy is built here.
"""

from __future__ import annotations

from typing import Any, Protocol


class Placer(Protocol):
    def place_policy(self, remote_group: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A policy built on ``remote_group`` from ``Policy(*args, **kwargs)``, or ``None`` to build it locally."""


_PLACER: Placer | None = None


def set_placer(placer: Placer | None) -> None:
    """Install (or, with ``None``, remove) the placement backend :class:`Policy` consults."""
    global _PLACER
    _PLACER = placer


def get_placer() -> Placer | None:
    return _PLACER
