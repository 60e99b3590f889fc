"""``openenv_scheduler``: multi-turn rollouts against OpenEnv servers, one session per trajectory.

Built on :class:`rlcore.rollout.EnvScheduler` (reset seeds the conversation, each assistant turn is
parsed into an action and stepped, rewards per step are recorded, the env is closed on every path).
What this subclass adds:

* per-row ``env_config`` merged over the scheduler's defaults (``env_url`` / ``--env-url``,
  ``system_message``, ``reset_kwargs``, client timeouts) — see :mod:`rl_plugin_openenv.env`;
* a session cap per server with queueing (``sessions_per_server``; default: what the server's
  ``/capacity`` says, else 8, lowered to the ``max_sessions`` a ``CAPACITY_REACHED`` reports).
  Sessions open in ``run`` (not in the batch-wide ``on_trajectory_start``) so a trajectory waits
  for a slot, then holds it until it ends: never a burst beyond the cap, never a deadlock;
* an action the server rejects (validation error) goes back to the model as an observation
  (``invalid_action="observe"``, default; reward 0, the episode goes on) or fails the trajectory
  (``invalid_action="fail"``);
* client counters (sessions, retries, timeouts, dropped sockets) in :meth:`metrics`.

Subclass and override :meth:`parse_action` / :meth:`format_observation` for another environment's
action and observation format (docs/plugins/openenv.md shows how).
"""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

from rlcore.errors import ConfigError
from rlcore.rollout import EnvScheduler
from rlcore.types import Completion, Trajectory

from . import actions
from .client import ActionRejected, ClientStats
from .env import OpenEnvEnv, merge_env_config
from .limiter import DEFAULT_SESSIONS, SessionLimiter, check_server_url, http_url, server_capacity

INVALID_ACTION_MODES = ("observe", "fail")


class OpenEnvScheduler(EnvScheduler):
    """Rollouts against OpenEnv servers over the WebSocket session endpoint.

    Options (also command-line flags, e.g. ``--env-url``): ``env_url``, ``system_message``,
    ``reset_kwargs`` (dict), ``sessions_per_server`` (sessions this scheduler opens per server at
    once; None = ask the server; rlcore 0.1 called it ``max_concurrent_envs``, still accepted with a
    warning — that is the OpenEnv *server's* cap, ``rlcore openenv serve --max-concurrent-envs``),
    ``call_timeout`` / ``connect_timeout`` (seconds per call / per connect), ``max_retries``
    (extra attempts to open a session), ``invalid_action`` ("observe" or "fail"),
    ``allowed_env_urls`` (comma-separated servers a row's ``env_config.base_url`` may name besides
    ``env_url``; any other fails that trajectory) or ``allow_any_env_url`` (trust every row's URL),
    and the :class:`~rlcore.rollout.EnvScheduler` ones (``max_turns``, ``env_timeout``, ``stop``,
    ``stop_on_truncation``).
    """

    name = "openenv_scheduler"
    reason_names_env_errors = False  # the client's EnvErrors say what broke ("server closed the session …")

    def __init__(
        self,
        sampler: Any = None,
        *,
        env_url: str | None = None,
        system_message: str | None = None,
        reset_kwargs: dict[str, Any] | None = None,
        sessions_per_server: int | None = None,
        max_concurrent_envs: int | None = None,
        call_timeout: float = 30.0,
        connect_timeout: float = 10.0,
        max_retries: int = 5,
        invalid_action: str = "observe",
        env_timeout: float | None = 300.0,
        allowed_env_urls: str | list[str] | None = None,
        allow_any_env_url: bool = False,
        **kwargs: Any,
    ) -> None:
        given = "sessions_per_server"
        if max_concurrent_envs is not None:  # rlcore 0.1's name here: sessions per server
            warnings.warn("openenv_scheduler: max_concurrent_envs is deprecated, use sessions_per_server (sessions "
                          "opened per server at once)", FutureWarning, stacklevel=3)
            sessions_per_server, given = max_concurrent_envs, "max_concurrent_envs"
        kwargs.setdefault("max_env_calls", sessions_per_server or 1024)  # the session cap is what bounds env calls
        super().__init__(sampler, env_timeout=env_timeout, **kwargs)
        if invalid_action not in INVALID_ACTION_MODES:
            raise ConfigError(f"invalid_action must be one of {INVALID_ACTION_MODES}, got {invalid_action!r}")
        if sessions_per_server is not None and int(sessions_per_server) < 1:
            raise ConfigError(f"{given} (sessions per server) must be >= 1, got {sessions_per_server}")
        self.sessions_per_server = int(sessions_per_server) if sessions_per_server else None
        self.invalid_action = invalid_action
        self.defaults: dict[str, Any] = {
            "base_url": env_url,
            "system_message": system_message,
            "reset_kwargs": dict(reset_kwargs or {}),
            "call_timeout": call_timeout,
            "connect_timeout": connect_timeout,
            "max_retries": max_retries,
        }
        # a dataset row may point a trajectory at a server (env_config.base_url): only at one the run
        # configured, unless told otherwise — a row must not make the trainer connect anywhere it likes
        extra = allowed_env_urls.split(",") if isinstance(allowed_env_urls, str) else list(allowed_env_urls or [])
        if env_url:  # file://, gopher://, port 99999: one line now, not retries per trajectory
            check_server_url(env_url, "env_url")
        for u in extra:
            if u and u.strip():
                check_server_url(u.strip(), "allowed_env_urls")
        self.allowed_env_urls = {http_url(u.strip()) for u in [env_url or "", *extra] if u and u.strip()}
        self.allow_any_env_url = bool(allow_any_env_url)
        self.stats = ClientStats()
        self._limiters: dict[str, SessionLimiter] = {}
        self._sizing: dict[str, asyncio.Future[SessionLimiter]] = {}

    @staticmethod
    def default_task() -> Any:
        """The embedded default when no dataset is given (:mod:`rl_plugin_openenv.default_task`)."""
        from .default_task import guess_number_task

        return guess_number_task()

    # --- formats (override for another environment) ---------------------------------------------
    def parse_action(self, text: str) -> Any:
        """Reply text → action dict: JSON object (code fences stripped) or ``{"message": text}``."""
        return actions.parse_action(text)

    def format_observation(self, observation: Any) -> str:
        """Observation dict → the next user message."""
        return actions.format_observation(observation)

    def format_rejection(self, error: ActionRejected) -> str:
        """The user message shown when the server rejects an action (``invalid_action="observe"``)."""
        return f"Invalid action: {error.server_message}{_details(error)}. Reply with a valid action."

    # --- environments ----------------------------------------------------------------------------
    def env_config(self, trajectory: Trajectory) -> dict[str, Any]:
        """This trajectory's config: the row's ``env_config`` over the scheduler defaults."""
        return merge_env_config(self.defaults, trajectory.data_dict.get("env_config"))

    def check_env_url(self, base_url: str) -> None:
        """Refuse a server URL the run did not configure (``env_url`` / ``allowed_env_urls``), and
        one that cannot be a server at all (``check_server_url``). Redirects are never followed
        (:class:`~rl_plugin_openenv.client.OpenEnvSession`), so the check holds for every hop."""
        check_server_url(base_url, "env_config.base_url")
        if self.allow_any_env_url or http_url(str(base_url)) in self.allowed_env_urls:
            return
        allowed = ", ".join(sorted(self.allowed_env_urls)) or "none"
        raise ConfigError(
            f"env_config.base_url {str(base_url)[:120]!r} is not an allowed OpenEnv server (allowed: {allowed}); "
            "add it with --allowed-env-urls, or pass --allow-any-env-url to trust the dataset's URLs"
        )

    async def make_env(self, trajectory: Trajectory) -> OpenEnvEnv:
        config = self.env_config(trajectory)
        self.check_env_url(config["base_url"])
        return OpenEnvEnv(config, limiter=await self.limiter_for(config["base_url"]), stats=self.stats)

    async def limiter_for(self, base_url: str) -> SessionLimiter:
        """The session cap of one server, sized on first use (option, else ``/capacity``, else 8)."""
        key = http_url(base_url)
        limiter = self._limiters.get(key)
        if limiter is not None:
            return limiter
        pending = self._sizing.get(key)
        if pending is None or pending.get_loop() is not asyncio.get_running_loop():
            # one /capacity query per server, however many trajectories arrive at once
            pending = self._sizing[key] = asyncio.ensure_future(self._size_limiter(key))
        return await asyncio.shield(pending)

    async def _size_limiter(self, key: str) -> SessionLimiter:
        try:
            size = self.sessions_per_server or await server_capacity(key) or DEFAULT_SESSIONS
            return self._limiters.setdefault(key, SessionLimiter(size))
        finally:
            self._sizing.pop(key, None)

    # --- lifecycle -------------------------------------------------------------------------------
    async def on_trajectory_start(self, trajectories: list[Trajectory]) -> None:
        """Nothing batch-wide: each trajectory opens its session in :meth:`run`, under the session cap."""
        for t in trajectories:
            try:
                self.env_config(t)  # a missing URL fails fast with one line, before any session opens
            except ConfigError as exc:
                t.fail(str(exc))

    async def run(self, infer_request: Trajectory) -> Trajectory | list[Trajectory]:
        traj = infer_request
        try:
            env = await self.make_env(traj)
            self._envs[traj.uuid] = env
            await env.session.acquire_slot()  # queueing for a slot is not the env's time
        except Exception as exc:  # noqa: BLE001 - fails this trajectory only
            traj.fail(f"env setup failed: {type(exc).__name__}: {exc}".splitlines()[0])
            return traj
        try:
            observation, info, system = await self._env_call("reset", env.reset, traj)
        except Exception as exc:  # noqa: BLE001
            traj.fail(self.failure_reason("reset", exc))
            return traj
        self.seed_conversation(traj, observation, system)
        if info:
            traj.infos["reset_info"] = info
        return await super().run(traj)

    async def on_turn_end(self, infer_request: Trajectory, response_choice: Completion, current_turn: int) -> dict[str, Any] | None:
        env = self._envs.get(infer_request.uuid)
        if env is None:
            return await super().on_turn_end(infer_request, response_choice, current_turn)
        try:
            action = self.parse_action(response_choice.message.content)
            observation, reward, done, info = await self._env_call("step", env.step, action)
        except ActionRejected as exc:
            if self.invalid_action == "fail":
                infer_request.fail(f"env step failed: {exc}")
                return {"done": True}
            infer_request.infos["invalid_actions"] = infer_request.infos.get("invalid_actions", 0) + 1
            self._pending[infer_request.uuid] = self.format_rejection(exc)
            return {"done": False, "reward": 0.0, "infos": {"env_steps": current_turn, "env_done": False}}
        except Exception as exc:  # noqa: BLE001 - fails this trajectory only
            infer_request.fail(self.failure_reason("step", exc))
            return {"done": True}
        self._pending[infer_request.uuid] = self.format_observation(observation)
        infos: dict[str, Any] = {"env_steps": current_turn, "env_done": bool(done)}
        if info:
            infos["env_info"] = info
        return {"done": bool(done), "reward": float(reward), "infos": infos}

    def metrics(self) -> dict[str, float]:
        """Client counters since this scheduler was made (``openenv/sessions_opened`` …)."""
        return self.stats.as_metrics()


def _details(error: ActionRejected) -> str:
    text = str(error)
    cut = text.find("; ")
    return text[cut:] if cut >= 0 else ""
