"""The environment interface shared by every env plugin (gymnasium adapter, OpenEnv client, text games).

Environments are registered by name with ``register_envs`` and created one per trajectory. Methods
may be sync or ``async def``; sync ones are run in a worker thread by the schedulers so a slow
environment never blocks generation for other trajectories.
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.define
class EnvStep:
    """What ``Env.step`` returns, also accepted as a plain ``(observation, reward, done, info)`` tuple."""

    observation: str
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = attrs.field(factory=dict)


class Env:
    """A text environment: observations are strings shown to the model, actions are the model's text.

    ``reset(request)`` receives the trajectory (``request.data_dict`` holds the dataset row, incl.
    ``env_config``) and returns ``(observation, info, system_message)``; ``system_message`` may be
    ``None``. ``step(action)`` returns ``(observation, reward, done, info)``. ``close()`` releases
    whatever the env holds and is called on every path, success or failure.
    """

    #: the name it is registered under (set by the registry user, informative only)
    name: str = "env"

    def __init__(self, env_config: dict[str, Any] | None = None, **options: Any) -> None:
        """ms-swift's ``Env(env_config)`` shape and rlcore's keyword options both land in ``env_config``."""
        self.env_config = {**(env_config or {}), **options}

    async def reset(self, request: Any) -> tuple[str, dict[str, Any], str | None]:
        raise NotImplementedError

    async def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        raise NotImplementedError

    async def close(self) -> None:
        return None
