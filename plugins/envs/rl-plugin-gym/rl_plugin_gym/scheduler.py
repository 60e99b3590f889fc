"""``gym_scheduler``: multi-turn rollouts where each trajectory plays one episode of a text env.

Everything about the turn loop (reset seeds the messages, each turn steps the env, step rewards
recorded, env closed on every path, env errors fail only their trajectory) is rlcore's
:class:`~rlcore.rollout.EnvScheduler`; this subclass only decides *which* env a trajectory gets:
the row's ``env_config.name`` if present, else the run's ``--env``, with options from
``env_kwargs`` overridden by the row's ``env_config``.
"""

from __future__ import annotations

from typing import Any

from rlcore.rollout import EnvScheduler

from .resolve import env_factory


class GymScheduler(EnvScheduler):
    """One env per trajectory, chosen per row or by ``env``: rlcore's :class:`EnvScheduler`, which
    resolves registered envs (this package's and any other's), plus gymnasium ids as env names.

    Options (besides EnvScheduler's ``env``, ``env_kwargs``, ``max_turns``, ``max_env_calls``,
    ``env_timeout``): none of its own — ``env`` may also be a gymnasium id (``FrozenLake-v1``).
    """

    name = "gym_scheduler"

    @staticmethod
    def default_task() -> Any:
        """The embedded default when no dataset is given (:mod:`rl_plugin_gym.default_task`)."""
        from .default_task import gym_task

        return gym_task()

    @staticmethod
    def env_factory(name: str) -> tuple[Any, dict[str, Any]]:  # type: ignore[override]
        """A registered env, else a gymnasium id (through :class:`~rl_plugin_gym.gymnasium_env.GymnasiumEnv`)."""
        return env_factory(name)

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
