"""ms-swift 4.6.0's ``OpenEnvScheduler``, its class body unchanged, against a real OpenEnv server.

``GYMScheduler`` and ``OpenEnvScheduler`` below are ms-swift 4.6.0's (``swift/rollout/multi_turn.py``
lines 838-939 and 941-1071; Copyright (c) ModelScope Contributors, Apache License 2.0,
https://github.com/modelscope/ms-swift/blob/main/LICENSE), kept verbatim as compatibility fixtures
(``OpenEnvScheduler`` subclasses ``GYMScheduler``). Only import lines differ: the module's imports
above them, and the one inside ``OpenEnvScheduler._create_env`` (``from .openenv_wrapper import
OpenEnvWrapper`` became ``from rl_plugin_openenv.swift_compat import OpenEnvWrapper``, this
package's wrapper with ms-swift's API over rlcore's client). The rest of this module is rlcore's.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx
import pytest

from rlcore import SamplingParams
from rlcore.rollout import build_scheduler, check_batch, run_rollouts
from rlcore.testing import ScriptedSampler
from rlcore.types import Prompt

# --- the import lines: ms-swift 4.6.0's, changed to rlcore's -----------------------------------------
# ms-swift: import asyncio / import json / from copy import deepcopy / from typing import Any, Dict, List, Optional
# ms-swift: from swift.rollout import Env, MultiTurnScheduler, envs   (swift/rollout/gym_env.py, multi_turn.py)
# ms-swift: from swift.template import Messages
from copy import deepcopy  # noqa: E402,F401
from typing import Dict, List, Optional  # noqa: E402,F401

from rlcore import Env, Messages, MultiTurnScheduler  # noqa: E402,F401

envs: dict = {}  # ms-swift's gym_env.envs registry (OpenEnvScheduler does not use it)


# ====== ms-swift 4.6.0 (Apache-2.0), swift/rollout/multi_turn.py lines 838-939, verbatim =====================
class GYMScheduler(MultiTurnScheduler):
    """Gym environment-driven scheduler using universal hooks.

    Implements ``on_trajectory_start`` (env.reset) and ``on_turn_end`` (env.step)
    to integrate gym environments into the multi-turn protocol. Works in both
    server mode (``run()``) and colocate mode (``run_multi_turn()``).
    """

    def __init__(self, infer_engine: Optional['GRPOVllmEngine'] = None, max_turns: Optional[int] = None, **kwargs):
        super().__init__(infer_engine, max_turns, **kwargs)
        self.gym_env_name = kwargs.get('gym_env', None)
        # Per-trajectory state (keyed by uuid)
        self._envs: Dict[str, Env] = {}
        self._total_rewards: Dict[str, float] = {}
        self._step_rewards: Dict[str, List[float]] = {}
        self._pending_obs: Dict[str, Optional[str]] = {}

    async def _close_and_remove(self, uuid: str) -> None:
        """Close env for a given uuid and remove all associated state."""
        env = self._envs.pop(uuid, None)
        if env is not None:
            try:
                await env.close()
            except Exception:
                pass
        self._total_rewards.pop(uuid, None)
        self._step_rewards.pop(uuid, None)
        self._pending_obs.pop(uuid, None)

    # ------------------------------------------------------------------
    # Universal async hooks (called by both run() and run_multi_turn())
    # ------------------------------------------------------------------
    async def on_trajectory_start(self, requests: List['RolloutInferRequest']) -> None:
        """Create one env per request and seed messages with initial observation."""

        async def _init_single(req: 'RolloutInferRequest') -> None:
            uuid = req.uuid
            if uuid in self._envs:
                await self._close_and_remove(uuid)

            env_config = (req.data_dict or {}).get('env_config', {}) if hasattr(req, 'data_dict') else {}
            env = self._create_env(env_config)
            observation, info, system_message = await env.reset(req)

            messages: Messages = []
            if system_message:
                messages.append({'role': 'system', 'content': system_message})
            messages.append({'role': 'user', 'content': observation})
            req.messages = messages

            self._envs[uuid] = env
            self._total_rewards[uuid] = 0.0
            self._step_rewards[uuid] = []
            self._pending_obs[uuid] = None

        await asyncio.gather(*[_init_single(req) for req in requests])

    async def on_turn_end(self, infer_request: 'RolloutInferRequest', response_choice: 'ChatCompletionResponseChoice',
                          current_turn: int) -> Dict[str, Any]:
        """Advance the gym env, accumulate reward, and return done + rollout_infos."""
        uuid = infer_request.uuid
        env = self._envs.get(uuid)
        if env is None:
            return {'done': True, 'rollout_infos': {}}

        next_obs, reward, done, info = await env.step(deepcopy(infer_request.messages))
        self._total_rewards[uuid] = self._total_rewards.get(uuid, 0.0) + float(reward)
        self._step_rewards.setdefault(uuid, []).append(float(reward))

        self._pending_obs[uuid] = None if done else next_obs

        rollout_infos: Dict[str, Any] = {
            'total_reward': self._total_rewards[uuid],
            'step_rewards': list(self._step_rewards.get(uuid, [])),
            'gym_done': done,
        }
        if done:
            await self._close_and_remove(uuid)

        return {'done': done, 'rollout_infos': rollout_infos}

    # ------------------------------------------------------------------
    # Step hook (injects next observation for the next turn)
    # ------------------------------------------------------------------
    def step(self, infer_request: 'RolloutInferRequest', response_choice: 'ChatCompletionResponseChoice',
             current_turn: int) -> Dict[str, Any]:
        uuid = infer_request.uuid
        next_obs = self._pending_obs.get(uuid)
        if next_obs is not None:
            infer_request.messages.append({'role': 'user', 'content': next_obs})
            self._pending_obs[uuid] = None
        return {'infer_request': infer_request}

    # ------------------------------------------------------------------
    # Env helpers
    # ------------------------------------------------------------------
    def _create_env(self, env_config: Dict) -> Env:
        env_name = env_config.get('name', self.gym_env_name)
        if env_name not in envs:
            raise ValueError(f"Environment '{env_name}' not found. Available: {list(envs.keys())}")
        return envs[env_name](env_config)



# ====== end of ms-swift 4.6.0's GYMScheduler ===============================================================


# ====== ms-swift 4.6.0 (Apache-2.0), swift/rollout/multi_turn.py lines 941-1071, verbatim but for one import ==
class OpenEnvScheduler(GYMScheduler):
    """GYMScheduler specialised for OpenEnv environments.

    Unlike GYMScheduler which uses async ``Env`` instances, OpenEnvScheduler
    uses :class:`OpenEnvWrapper` whose ``reset()`` / ``step()`` / ``close()``
    are **synchronous** (blocking WebSocket I/O).  Subclasses that override
    ``on_trajectory_start`` / ``on_turn_end`` should wrap sync wrapper calls
    with ``asyncio.to_thread()`` to avoid blocking the event loop.

    Action parsing (LLM text → dict) and observation formatting (dict → str)
    are handled by overridable :meth:`parse_action` and :meth:`format_observation`
    methods, eliminating the need for ``openenv_*`` command-line parameters.

    All OpenEnv configuration (``base_url``, ``system_message``, ``reset_kwargs`` …)
    comes from the dataset's per-row ``env_config``.
    """

    def _create_env(self, env_config: Dict) -> Any:
        """Create an :class:`OpenEnvWrapper` (not an ``Env`` subclass)."""
        from rl_plugin_openenv.swift_compat import OpenEnvWrapper
        return OpenEnvWrapper(env_config)

    async def _close_and_remove(self, uuid: str) -> None:
        """Close wrapper for a given uuid and remove all associated state.

        Wrapper.close() is synchronous; use ``asyncio.to_thread`` to avoid
        blocking the event loop.
        """
        import asyncio
        wrapper = self._envs.pop(uuid, None)
        if wrapper is not None:
            try:
                await asyncio.to_thread(wrapper.close)
            except Exception:
                pass
        self._total_rewards.pop(uuid, None)
        self._step_rewards.pop(uuid, None)
        self._pending_obs.pop(uuid, None)

    async def on_trajectory_start(self, requests: List['RolloutInferRequest']) -> None:
        """Create one wrapper per request, call ``reset()``, seed messages.

        Uses a semaphore to limit concurrent environment creations (default 4)
        to avoid overwhelming the OpenEnv server with simultaneous WebSocket connections.
        """
        semaphore = asyncio.Semaphore(getattr(self, 'max_concurrent_envs', 4))

        async def _init_single(req: 'RolloutInferRequest') -> None:
            async with semaphore:
                uuid = req.uuid
                if uuid in self._envs:
                    await self._close_and_remove(uuid)

                row_env_config = (req.data_dict or {}).get('env_config', {}) if hasattr(req, 'data_dict') else {}
                env_config = {**getattr(self, 'env_config_defaults', {}), **row_env_config}
                wrapper = self._create_env(env_config)

                obs, metadata = wrapper.reset()
                system_message = env_config.get('system_message', '')

                messages: Messages = []
                if system_message:
                    messages.append({'role': 'system', 'content': system_message})
                messages.append({'role': 'user', 'content': self.format_observation(obs)})
                req.messages = messages

                self._envs[uuid] = wrapper
                self._total_rewards[uuid] = 0.0
                self._step_rewards[uuid] = []
                self._pending_obs[uuid] = None

        await asyncio.gather(*[_init_single(req) for req in requests])

    async def on_turn_end(self, infer_request: 'RolloutInferRequest', response_choice: 'ChatCompletionResponseChoice',
                          current_turn: int) -> Dict[str, Any]:
        """Parse LLM response, call ``wrapper.step()``, accumulate reward."""
        uuid = infer_request.uuid
        wrapper = self._envs.get(uuid)
        if wrapper is None:
            return {'done': True, 'rollout_infos': {}}

        action_text = response_choice.message.content
        action_dict = self.parse_action(action_text)
        obs, reward, done, metadata = wrapper.step(action_dict)

        self._total_rewards[uuid] = self._total_rewards.get(uuid, 0.0) + float(reward)
        self._step_rewards.setdefault(uuid, []).append(float(reward))

        next_obs = None if done else self.format_observation(obs)
        self._pending_obs[uuid] = next_obs

        rollout_infos: Dict[str, Any] = {
            'total_reward': self._total_rewards[uuid],
            'step_rewards': list(self._step_rewards.get(uuid, [])),
            'gym_done': done,
        }
        if done:
            await self._close_and_remove(uuid)

        return {'done': done, 'rollout_infos': rollout_infos}

    def parse_action(self, text: str) -> Dict[str, Any]:
        """Parse LLM response text into an OpenEnv action dict.

        Default: try ``json.loads``, fall back to ``{"message": text}``.
        """
        text = text.strip()
        # Strip markdown code blocks (e.g. ```json ... ```)
        if text.startswith('```'):
            lines = text.splitlines()
            if len(lines) >= 2 and lines[0].startswith('```') and lines[-1].strip().startswith('```'):
                text = '\n'.join(lines[1:-1]).strip()
        try:
            parsed = json.loads(text)
            if isinstance(parsed, dict):
                return parsed
            return {'message': str(parsed)}
        except (json.JSONDecodeError, ValueError):
            return {'message': text}

    def format_observation(self, observation: Any) -> str:
        """Format OpenEnv observation into a string for the LLM.

        Default: ``json.dumps``.  Override in subclasses for environment-specific
        formatting (e.g. extract a ``"question"`` field).
        """
        try:
            return json.dumps(observation, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            return str(observation)



# ====== end of ms-swift 4.6.0's OpenEnvScheduler ===========================================================


# --- rlcore's code from here ------------------------------------------------------------------------------

PARAMS = SamplingParams(max_tokens=24)


def rows(url: str, n: int) -> list[Prompt]:
    return [Prompt(messages=[], prompt_ids=[], data={"env_config": {
        "base_url": url, "system_message": "You play a guessing game.", "reset_kwargs": {"target": 40 + i}}}) for i in range(n)]


def bisect(tok: Any):
    """A player that binary-searches using the feedback in the conversation so far."""

    def respond(prompt_ids: list[int], params: Any, index: int) -> str:
        text = tok.decode(prompt_ids)
        low, high = 1, 100
        for g, word in re.findall(r"(\d+) is too (low|high)", text):
            if word == "low":
                low = max(low, int(g) + 1)
            else:
                high = min(high, int(g) - 1)
        return json.dumps({"guess": (low + high) // 2})

    return respond


def active(url: str) -> int:
    return int(httpx.get(url + "/capacity").json()["active_sessions"])


async def settled(url: str) -> int:
    for _ in range(100):
        if active(url) == 0:
            return 0
        await asyncio.sleep(0.02)
    return active(url)


def sound(trajs: list[Any], tok: Any) -> None:
    assert trajs and not check_batch(trajs, tok), check_batch(trajs, tok)
    for t in trajs:
        assert t.status in ("ok", "truncated"), t.reason
        text = tok.decode(t.input_ids, skip_special_tokens=False)
        want = tok.apply_chat_template(t.messages, tokenize=False)
        assert want.startswith(text) and want[len(text):] in ("\n", "<|im_end|>\n"), (text, want)


async def test_openenv_scheduler_plays_to_the_end(server: str, tokenizer: Any) -> None:
    s = ScriptedSampler(tokenizer=tokenizer, respond=bisect(tokenizer))
    sched = build_scheduler(OpenEnvScheduler, s, tokenizer, max_turns=10)
    res = await run_rollouts(sched, rows(server, 3), sampling_params=PARAMS, progress=False)
    for t in res.trajectories:
        assert t.messages[0] == {"role": "system", "content": "You play a guessing game."}
        assert json.loads(t.messages[1]["content"])["text"].startswith("I am thinking of a number")
        assert t.step_rewards[-1] == 1.0 and t.infos["total_reward"] == 1.0 and t.infos["gym_done"] is True
        assert t.num_turns == len(t.step_rewards) > 1
    sound(res.trajectories, tokenizer)
    assert await settled(server) == 0  # each episode ended done: ms-swift's scheduler closed its session


async def test_episodes_cut_by_max_turns_keep_their_session_open(server: str, tokenizer: Any) -> None:
    """ms-swift 4.6.0 closes an env only when it reports done; rlcore's ``on_trajectory_end``, which
    ms-swift has no equivalent of, is where a port closes it on every other path."""
    s = ScriptedSampler(['{"guess": 1}'], tokenizer)
    sched = build_scheduler(OpenEnvScheduler, s, tokenizer, max_turns=2)
    res = await run_rollouts(sched, rows(server, 2), sampling_params=PARAMS, progress=False)
    assert all(t.num_turns == 2 and t.infos["gym_done"] is False for t in res.trajectories)
    sound(res.trajectories, tokenizer)
    assert active(server) == 2
    for t in res.trajectories:
        await sched._close_and_remove(t.uuid)
    assert await settled(server) == 0

    class ClosesEveryPath(OpenEnvScheduler):
        async def on_trajectory_end(self, trajectory):
            await self._close_and_remove(trajectory.uuid)

    sched = build_scheduler(ClosesEveryPath, s, tokenizer, max_turns=2)
    await run_rollouts(sched, rows(server, 2), sampling_params=PARAMS, progress=False)
    assert await settled(server) == 0


async def test_on_the_tiny_model(server: str, tokenizer: Any, tiny_model_dir: str) -> None:
    from rlcore.sampling.hf import HFSampler

    sampler = HFSampler(tiny_model_dir, batch_window_ms=5, seed=0)
    try:
        sched = build_scheduler(OpenEnvScheduler, sampler, tokenizer, max_turns=2)
        res = await run_rollouts(sched, rows(server, 2), num_generations=2,
                                 sampling_params=SamplingParams(max_tokens=8, temperature=1.0), progress=False)
        sound(res.trajectories, tokenizer)
        for t in res.trajectories:
            await sched._close_and_remove(t.uuid)
    finally:
        await sampler.close()
    assert await settled(server) == 0
