"""ms-swift 4.x's ``OpenEnvWrapper`` shape over rlcore's OpenEnv client, for ms-swift scheduler code.

ms-swift 4.6.0's ``OpenEnvScheduler`` (``swift/rollout/multi_turn.py``) makes one
``OpenEnvWrapper(env_config)`` (``swift/rollout/openenv_wrapper.py``) per trajectory and calls it
*synchronously*: ``reset() -> (observation, metadata)``, ``step(action) -> (observation, reward,
done, metadata)``, ``close()``; ``env_config`` gives ``base_url`` and ``reset_kwargs``. This class
has that shape, so a 4.x ``OpenEnvScheduler`` (or a subclass of it) runs with the import of the
wrapper changed. Underneath is rl-plugin-openenv's own session client
(:class:`~rl_plugin_openenv.client.OpenEnvSession`: timeouts, retries, a closed session on every
path), run on a private event loop in a background thread because the caller blocks.

rl-plugin-openenv's ``openenv_scheduler`` is the rlcore-native scheduler (same customisation
points, ``parse_action`` / ``format_observation``, and non-blocking I/O); use this only to run
ms-swift code as it is.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from rlcore.errors import EnvError

from .client import ClientOptions, OpenEnvSession

#: ms-swift 4.6.0's default when ``env_config`` names no server
DEFAULT_BASE_URL = "http://localhost:8000"


class OpenEnvWrapper:
    """One OpenEnv episode with ms-swift 4.x's blocking wrapper API."""

    def __init__(self, env_config: dict[str, Any] | None = None) -> None:
        cfg = dict(env_config or {})
        self.base_url = str(cfg.get("base_url") or DEFAULT_BASE_URL)
        self.reset_kwargs = dict(cfg.get("reset_kwargs") or {})
        opts = {k: cfg[k] for k in ("connect_timeout", "call_timeout", "max_retries") if cfg.get(k) is not None}
        self.options = ClientOptions(**opts)
        self._session: OpenEnvSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # --- ms-swift's API ----------------------------------------------------------------------------
    def reset(self) -> tuple[Any, Any]:
        """Open a fresh episode: ``(observation, metadata)`` as the server sent them."""
        if self._session is None:
            self._session = OpenEnvSession(self.base_url, self.options)
        result = self._call(self._session.reset(**self.reset_kwargs))
        return result.observation, result.metadata

    def step(self, action_dict: dict[str, Any]) -> tuple[Any, float, bool, Any]:
        """Send one action: ``(observation, reward, done, metadata)`` (a missing reward is 0.0)."""
        if self._session is None:
            raise EnvError(f"OpenEnv session to {self.base_url} is not open; reset() first")
        result = self._call(self._session.step(dict(action_dict)))
        return result.observation, float(result.reward or 0.0), bool(result.done), result.metadata

    def close(self) -> None:
        """End the episode and stop the wrapper's event loop (never raises; safe to call twice)."""
        session, self._session = self._session, None
        loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            if session is not None:
                asyncio.run_coroutine_threadsafe(session.close(), loop).result(self.options.close_timeout + 5.0)
        except Exception:  # noqa: BLE001 - closing is best effort; the server reaps idle sessions
            pass
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=5.0)
                self._thread = None

    # --- the private loop ----------------------------------------------------------------------------
    def _call(self, coro: Any) -> Any:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=self._serve, args=(loop,), name="openenv-wrapper", daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            loop.close()

    def __del__(self) -> None:  # a wrapper dropped without close() must not leave a thread behind
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass
