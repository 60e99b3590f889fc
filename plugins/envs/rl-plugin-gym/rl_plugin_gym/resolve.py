"""Turn an env name plus options into a live :class:`rlcore.envs.Env`.

A name is looked up among registered envs first (this package's, any third-party package's), then
as a gymnasium id, so ``--env FrozenLake-v1`` works without naming the adapter. The registry lookup,
the options (``env_kwargs`` overridden per row by ``env_config``) and their check are rlcore's
(:mod:`rlcore.rollout.env_scheduler`): every env scheduler resolves registered envs the same way;
this module only adds the gymnasium-id fallback.
"""

from __future__ import annotations

from typing import Any, Mapping

import rlcore
from rlcore.envs import Env
from rlcore.errors import UnknownComponentError
from rlcore.rollout.env_scheduler import build_env, env_options

__all__ = ["env_factory", "env_options", "make_env"]


def env_factory(name: str) -> tuple[Any, dict[str, Any]]:
    """The factory for ``name`` and the options it implies (``gym_id`` for a bare gymnasium id).

    Raises :class:`UnknownComponentError` naming what is available when ``name`` is neither."""
    try:
        return rlcore.get("env", name), {}
    except UnknownComponentError as exc:
        from .gymnasium_env import GymnasiumEnv, is_gym_id

        if not is_gym_id(name):
            raise UnknownComponentError(f"{exc}; {name!r} is not a gymnasium id either") from None
        return GymnasiumEnv, {"gym_id": name}


def make_env(name: str, options: Mapping[str, Any] | None = None) -> Env:
    """A new env instance for ``name`` (registered name or gymnasium id)."""
    factory, implied = env_factory(name)
    return build_env(name, factory, {**implied, **dict(options or {})})
