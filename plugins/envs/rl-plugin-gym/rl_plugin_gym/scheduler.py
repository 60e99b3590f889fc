"""``gym_scheduler``: multi-turn rollouts where each trajectory plays one episode of a text env.

Everything about the turn loop (reset seeds the messages, each turn steps the env, step rewards
recorded, env closed on every path, env errors fail only their trajectory) is rlcore's
:class:`~rlcore.rollout.EnvScheduler`; this subclass only decides *which* env a trajectory gets:
the row's ``env_config.name`` if present, else the run's ``--env``, with options from
``env_kwargs`` overridden by the row's ``env_config``.
"""

from __future__ import annotations

from typing import Any, Mapping

from rlcore.envs import Env
from rlcore.errors import ConfigError
from rlcore.rollout import EnvScheduler
from rlcore.rollout.options import json_object

from .resolve import env_factory, env_options, make_env
from .seeding import env_config


class GymScheduler(EnvScheduler):
    """One env per trajectory, chosen per row or by ``env``.

    Options (besides EnvScheduler's ``max_turns``, ``max_concurrent_envs``, ``env_timeout``):
    ``env`` — the env name or gymnasium id for rows without ``env_config.name``;
    ``env_kwargs`` — default constructor options for every env of the run.
    """

    name = "gym_scheduler"

    def __init__(
        self,
        sampler: Any = None,
        *,
        env: str | None = None,
        env_kwargs: Mapping[str, Any] | str | None = None,
        **options: Any,
    ) -> None:
        super().__init__(sampler, **options)
        self.env = env
        self.env_kwargs = json_object(env_kwargs, "env_kwargs")  # from the command line: a JSON string
        if env:
            env_factory(env)  # a typo in --env is a one-line error now, not a batch of failed trajectories

    @staticmethod
    def default_task() -> Any:
        """The embedded default when no dataset is given (:mod:`rl_plugin_gym.default_task`)."""
        from .default_task import gym_task

        return gym_task()

    def make_env(self, trajectory: Any) -> Env:
        config = env_config(trajectory)
        name = config.get("name") or self.env
        if not name:
            raise ConfigError(
                "gym_scheduler needs an env: give the run --env NAME (e.g. guess_number, FrozenLake-v1) "
                "or each row an env_config with a name"
            )
        return make_env(str(name), env_options(config, self.env_kwargs))

    async def on_turn_end(self, infer_request: Any, response_choice: Any, current_turn: int) -> dict[str, Any] | None:
        """EnvScheduler's step, plus a per-turn trace (action, reward, invalid?) and the running
        return in ``infos`` so written rollouts show what each turn did, not only the last info."""
        out = await super().on_turn_end(infer_request, response_choice, current_turn)
        if out and "reward" in out and infer_request.status != "failed":
            info = (out.get("infos") or {}).get("env_info") or {}
            trace = infer_request.infos.setdefault("env_trace", [])
            trace.append(
                {
                    "turn": current_turn,
                    "action": info.get("action"),
                    "reward": out["reward"],
                    "invalid": bool(info.get("invalid_action", False)),
                    "done": bool(out.get("done")),
                }
            )
            out.setdefault("infos", {})["env_return"] = infer_request.total_reward + float(out["reward"])
        return out
