"""Turn an env name plus options into a live :class:`rlcore.envs.Env`.

A name is looked up among registered envs first (this package's, any third-party package's), then
as a gymnasium id, so ``--env FrozenLake-v1`` works without naming the adapter. Options come from
the scheduler (``env_kwargs``) and are overridden per row by ``env_config`` (everything except
``name`` and ``seed``, plus the keys of an optional ``env_config.kwargs`` dict).
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping

import rlcore
from rlcore.envs import Env
from rlcore.errors import ConfigError, UnknownComponentError

_ROW_ONLY = ("name", "seed", "kwargs")


def env_options(config: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The constructor options for one trajectory's env: defaults < row keys < row ``kwargs``."""
    options = dict(defaults or {})
    options.update({k: v for k, v in config.items() if k not in _ROW_ONLY})
    extra = config.get("kwargs")
    if isinstance(extra, Mapping):
        options.update(extra)
    return options


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
    options = {**implied, **dict(options or {})}
    _check_options(name, factory, options)
    env = factory(**options)
    if not getattr(env, "name", None) or getattr(env, "name", None) == "env":
        env.name = name
    return env


def _check_options(name: str, factory: Any, options: Mapping[str, Any]) -> None:
    """Unknown options are a config mistake worth one clear line, not a TypeError traceback."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return
    params = sig.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    allowed = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ConfigError(
            f"env {name!r} does not take option(s) {', '.join(unknown)}; it takes: {', '.join(sorted(allowed)) or 'none'}"
        )
