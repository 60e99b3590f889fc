"""The gymnasium adapter: any ``gymnasium.make`` id whose states and actions fit in text.

Observations are rendered by a formatter (a per-game one from :mod:`rl_plugin_gym.toy_text`, else
the env's ``ansi`` render, else the raw observation), actions are parsed from the model's reply
into the action space (:mod:`rl_plugin_gym.actions`), and invalid replies follow the env's
:class:`~rl_plugin_gym.policy.InvalidActionPolicy`. gymnasium calls run in a worker thread so a
heavy env never blocks generation for other trajectories.
"""

from __future__ import annotations

import asyncio
import warnings
from typing import Any, Mapping, Sequence

from rlcore.envs import Env
from rlcore.errors import ConfigError, EnvError, MissingDependencyError

from .actions import parser_for
from .policy import ActionParseError, InvalidActionPolicy
from .seeding import episode_seed
from .text_format import AnsiFormat, GameFormat, ReprFormat, observation_text
from .toy_text import FORMATS


#: values of the ``reward_shaping`` option
SHAPING = (None, "progress")


def resolve_gym_id(gym_id: str) -> str:
    """``gym_id`` itself, or the newest version of that game when gymnasium retired the asked one
    (``Taxi-v3`` runs ``Taxi-v4`` on gymnasium >= 1.3, whose defaults behave the same)."""
    try:
        import gymnasium
        from gymnasium.envs.registration import find_highest_version, parse_env_id
    except ImportError as exc:  # pragma: no cover - gymnasium is a dependency
        raise MissingDependencyError("the gymnasium adapter needs gymnasium: pip install gymnasium") from exc
    if gym_id in gymnasium.envs.registry:
        return gym_id
    try:
        ns, name, _ = parse_env_id(gym_id)
    except Exception as exc:  # noqa: BLE001 - malformed id
        raise ConfigError(f"{gym_id!r} is not a gymnasium id; use NAME-vN such as FrozenLake-v1") from exc
    newest = find_highest_version(ns, name)
    if newest is None:
        raise ConfigError(f"gymnasium has no environment {gym_id!r}; check the id or import the package that registers it")
    full = f"{ns + '/' if ns else ''}{name}-v{newest}"
    warnings.warn(f"gymnasium retired {gym_id}; running {full} instead", stacklevel=2)
    return full


def is_gym_id(name: str) -> bool:
    """Whether ``name`` is a gymnasium id (registered, or a retired version of a registered game)."""
    try:
        import gymnasium
        from gymnasium.envs.registration import find_highest_version, parse_env_id

        if name in gymnasium.envs.registry:
            return True
        ns, game, version = parse_env_id(name)
        return version is not None and find_highest_version(ns, game) is not None
    except Exception:  # noqa: BLE001
        return False


def game_name(gym_id: str) -> str:
    """``FrozenLake-v1`` -> ``FrozenLake`` (the key of :data:`~rl_plugin_gym.toy_text.FORMATS`)."""
    base = gym_id.split("/")[-1]
    return base.rsplit("-v", 1)[0]


class GymnasiumEnv(Env):
    """One gymnasium episode per trajectory, as text.

    Options: ``gym_id`` (required), ``seed``, ``formatter`` (``"auto"``, ``"ansi"``, ``"repr"`` or a
    :class:`GameFormat`), ``action_names``, ``invalid_action`` (``"retry"``/``"fail"``),
    ``invalid_penalty``, ``max_invalid_actions``, ``system_message`` (replaces the formatter's),
    ``reward_shaping`` (``None`` or ``"progress"``, below) and ``make_kwargs``; any other keyword goes
    to ``gymnasium.make`` too (``is_slippery=False``).

    ``reward_shaping="progress"`` adds potential-based shaping (Ng, Harada & Russell, 1999) to each
    step's reward: ``Φ(s') − Φ(s)`` with ``Φ`` = minus the distance to the goal as a share of the
    largest (the formatter's :meth:`~rl_plugin_gym.text_format.GameFormat.potential`). The shaping
    telescopes, so an episode's shaped return is the env's return plus how much closer to the goal
    it ended than it started — a dense signal that does not change what the best policy is when
    episodes end at the goal. ``info["env_reward"]`` keeps the env's own reward.
    """

    name = "gymnasium"

    def __init__(
        self,
        gym_id: str | None = None,
        *,
        seed: int | None = None,
        formatter: str | GameFormat = "auto",
        action_names: Sequence[str] | None = None,
        invalid_action: str = "retry",
        invalid_penalty: float = -0.1,
        max_invalid_actions: int | None = 3,
        system_message: str | None = None,
        reward_shaping: str | None = None,
        make_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not gym_id:
            raise ConfigError(
                "the gymnasium env needs gym_id, e.g. env_config {'name': 'gymnasium', 'gym_id': 'FrozenLake-v1'} "
                "or --env FrozenLake-v1"
            )
        self.gym_id = resolve_gym_id(gym_id)
        self.name = self.gym_id
        self.seed = seed
        self.make_kwargs = {**dict(make_kwargs or {}), **kwargs}
        self.format = self._pick_format(formatter)
        # a known game keeps its action names even when shown through another formatter
        known = FORMATS.get(game_name(self.gym_id))
        self.action_names = list(action_names or self.format.action_names or (known.action_names if known else ()) or ())
        self.aliases = {} if action_names else dict(self.format.aliases or (known.aliases if known else {}))
        self.policy = InvalidActionPolicy(invalid_action, invalid_penalty, max_invalid_actions)
        self.system_override = system_message
        if reward_shaping not in SHAPING:
            raise ConfigError(f"reward_shaping={reward_shaping!r} is unknown; use one of: {', '.join(map(str, SHAPING))}")
        if reward_shaping and type(self.format).potential is GameFormat.potential:
            raise ConfigError(
                f"reward_shaping={reward_shaping!r} needs a distance to the goal, which the {self.gym_id} formatter "
                "does not define; progress shaping supports FrozenLake and CliffWalking"
            )
        self.reward_shaping = reward_shaping
        self.env: Any = None
        self.parser: Any = None
        self.last_obs: Any = None

    def _pick_format(self, formatter: str | GameFormat) -> GameFormat:
        if isinstance(formatter, GameFormat):
            return formatter
        if formatter == "auto":
            cls = FORMATS.get(game_name(self.gym_id))
            if cls is not None:
                return cls()
            import gymnasium

            modes = gymnasium.envs.registry[self.gym_id].kwargs.get("render_modes") or []
            entry = gymnasium.envs.registry[self.gym_id].entry_point
            if not modes and isinstance(entry, str):
                modes = _metadata_render_modes(entry)
            return AnsiFormat() if "ansi" in modes else ReprFormat()
        if formatter == "ansi":
            return AnsiFormat()
        if formatter == "repr":
            return ReprFormat()
        raise ConfigError(f"formatter={formatter!r} is unknown; use 'auto', 'ansi', 'repr' or a GameFormat instance")

    def _make(self) -> None:
        import gymnasium

        kwargs = dict(self.make_kwargs)
        if self.format.render_mode:
            kwargs.setdefault("render_mode", self.format.render_mode)
        try:
            self.env = gymnasium.make(self.gym_id, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a user-facing make failure
            raise EnvError(f"gymnasium.make({self.gym_id!r}, **{kwargs}) failed: {type(exc).__name__}: {exc}") from exc
        self.parser = parser_for(self.env.action_space, self.action_names or None, self.aliases)
        if self.parser is None:
            raise ConfigError(
                f"{self.gym_id} has action space {self.env.action_space}, which text cannot express; "
                "the adapter supports Discrete and Box"
            )

    def _reset_sync(self, seed: int | None) -> tuple[str, dict[str, Any], str | None]:
        if self.env is None:
            self._make()
        obs, _info = self.env.reset(seed=seed)
        self.last_obs = obs
        system = self.system_override or self.format.system_message(self.env, self.parser.choices())
        info = {"gym_id": self.gym_id, "seed": seed, "state": observation_text(obs)}
        return self.format.describe(obs, self.env), info, system

    async def reset(self, request: Any) -> tuple[str, dict[str, Any], str | None]:
        return await asyncio.to_thread(self._reset_sync, episode_seed(request, self.seed))

    def _step_sync(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self.env is None:
            raise EnvError(f"{self.gym_id}: step() before reset(); the scheduler must reset first")
        try:
            parsed = self.parser(action)
        except ActionParseError as exc:
            obs, reward, done, info = self.policy.handle(self.gym_id, action, exc)
            if not done:
                obs = f"{obs}\n{self.format.describe(self.last_obs, self.env)}"
            return obs, reward, done, info
        self.policy.valid()
        name = self.parser.name_of(parsed)
        before = self.last_obs
        obs, reward, terminated, truncated, _info = self.env.step(parsed)
        self.last_obs = obs
        text = self.format.outcome(name, float(reward), bool(terminated), bool(truncated), obs, self.env)
        info: dict[str, Any] = {
            "action": name,
            "terminated": bool(terminated),
            "truncated": bool(truncated),
            "state": observation_text(obs),
        }
        total = float(reward)
        if self.reward_shaping == "progress":
            shaping = float(self.format.potential(obs, self.env)) - float(self.format.potential(before, self.env))
            info.update(env_reward=float(reward), shaping=shaping)
            total += shaping
        return text, total, bool(terminated or truncated), info

    async def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        return await asyncio.to_thread(self._step_sync, action)

    async def close(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            await asyncio.to_thread(env.close)


def _metadata_render_modes(entry_point: str) -> list[str]:
    """Render modes an env class declares, read without constructing it."""
    import importlib

    modname, _, attr = entry_point.partition(":")
    try:
        cls = getattr(importlib.import_module(modname), attr)
        return list(getattr(cls, "metadata", {}).get("render_modes", []))
    except Exception:  # noqa: BLE001
        return []
