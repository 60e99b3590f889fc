"""``OpenEnvEnv``: an :class:`rlcore.envs.Env` backed by one OpenEnv session (one per trajectory).

The row's ``env_config`` (merged over the scheduler's defaults) says which server to use and how to
reset it. Keys: ``base_url`` (or ``env_url``), ``system_message``, ``reset_kwargs`` (dict), the
client's ``call_timeout`` / ``connect_timeout`` / ``max_retries``; every other key is passed to the
server's ``reset`` as well (so a row can say ``{"seed": 3, "target": 42}``).
"""

from __future__ import annotations

from typing import Any

from rlcore.envs import Env
from rlcore.errors import ConfigError

from .client import ClientOptions, ClientStats, OpenEnvSession, StepResult
from .limiter import SessionLimiter

#: env_config keys the client/scheduler consume (everything else goes to the server's reset)
CONFIG_KEYS = frozenset(
    {"base_url", "env_url", "system_message", "reset_kwargs", "call_timeout", "connect_timeout", "max_retries"}
)


def merge_env_config(defaults: dict[str, Any], row_config: Any) -> dict[str, Any]:
    """Row ``env_config`` over scheduler defaults; ``reset_kwargs`` dicts are merged key by key."""
    if row_config is None:
        row_config = {}
    if isinstance(row_config, str):
        import json

        try:
            row_config = json.loads(row_config)
        except ValueError:
            raise ConfigError(f"env_config must be a dict or JSON object, got {row_config[:60]!r}") from None
    if not isinstance(row_config, dict):
        raise ConfigError(f"env_config must be a dict, got {type(row_config).__name__}")
    merged = {**defaults, **row_config}
    merged["reset_kwargs"] = {**(defaults.get("reset_kwargs") or {}), **(row_config.get("reset_kwargs") or {})}
    if row_config.get("env_url") and not row_config.get("base_url"):
        merged["base_url"] = row_config["env_url"]
    merged.setdefault("base_url", merged.get("env_url"))
    if not merged.get("base_url"):
        raise ConfigError(
            "no OpenEnv server URL: pass --env-url http://127.0.0.1:8000 (option env_url) "
            "or put base_url in the row's env_config"
        )
    return merged


class OpenEnvEnv(Env):
    """One trajectory's OpenEnv episode. Observations are returned raw (dicts); the scheduler formats them."""

    name = "openenv"

    def __init__(
        self,
        config: dict[str, Any],
        *,
        limiter: SessionLimiter | None = None,
        stats: ClientStats | None = None,
    ) -> None:
        self.config = config
        options = ClientOptions()
        for key in ("call_timeout", "connect_timeout", "max_retries"):
            if config.get(key) is not None:
                setattr(options, key, type(getattr(options, key))(config[key]))
        self.session = OpenEnvSession(str(config["base_url"]), options, limiter=limiter, stats=stats)
        self.last: StepResult | None = None

    def reset_kwargs(self) -> dict[str, Any]:
        extra = {k: v for k, v in self.config.items() if k not in CONFIG_KEYS}
        return {**extra, **(self.config.get("reset_kwargs") or {})}

    async def reset(self, request: Any = None) -> tuple[dict[str, Any], dict[str, Any], str | None]:
        self.last = await self.session.reset(**self.reset_kwargs())
        info = {"openenv_metadata": self.last.metadata} if self.last.metadata else {}
        return self.last.observation, info, self.config.get("system_message")

    async def step(self, action: Any) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        self.last = await self.session.step(action)
        info = {"openenv_metadata": self.last.metadata} if self.last.metadata else {}
        return self.last.observation, float(self.last.reward or 0.0), self.last.done, info

    async def close(self) -> None:
        await self.session.close()
