"""An OpenEnv scheduler written in ms-swift 4.x's API, against a real OpenEnv server.

``GuessingScheduler`` is our own code, written the way a 4.x user writes an OpenEnv scheduler
against ms-swift 4.6.0's API (``swift/rollout/multi_turn.py``, ``swift/rollout/openenv_wrapper.py``):
the universal hooks of ``MultiTurnScheduler`` with one *blocking* ``OpenEnvWrapper(env_config)`` per
trajectory (``reset() -> (observation, metadata)``, ``step(action) -> (observation, reward, done,
metadata)``, ``close()``), JSON actions and observations. Only the import lines differ from what one
would write for ms-swift: ``from swift.rollout import MultiTurnScheduler`` becomes
``from rlcore import MultiTurnScheduler``, and the wrapper comes from
``rl_plugin_openenv.swift_compat`` (this package's wrapper with ms-swift's API over rlcore's client).
Like ms-swift 4.6.0's own ``OpenEnvScheduler`` it closes a session when its episode reports done.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any


from rl_plugin_openenv.server import active_sessions, sessions_settle
from rl_plugin_openenv.swift_compat import OpenEnvWrapper
from rlcore import MultiTurnScheduler, SamplingParams
from rlcore.rollout import build_scheduler, run_rollouts
from rlcore.testing import ScriptedSampler, assert_token_exact
from rlcore.types import Prompt


class GuessingScheduler(MultiTurnScheduler):
    """One OpenEnv session per trajectory, opened in ``on_trajectory_start`` (the row's
    ``env_config`` names the server, the first messages and the reset arguments), stepped in
    ``on_turn_end`` with the reply parsed as an action, its observation shown by ``step``. The
    wrapper blocks, so every call runs in a worker thread, off the event loop."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sessions: dict[str, OpenEnvWrapper] = {}
        self.rewards: dict[str, list[float]] = {}
        self.replies: dict[str, str] = {}

    async def on_trajectory_start(self, requests):
        async def open_one(request) -> None:
            config = request.data_dict.get("env_config") or {}
            wrapper = OpenEnvWrapper(config)
            observation, _metadata = await asyncio.to_thread(wrapper.reset)
            self.sessions[request.uuid], self.rewards[request.uuid] = wrapper, []
            opening = [{"role": "system", "content": config["system_message"]}] if config.get("system_message") else []
            request.messages = opening + [{"role": "user", "content": self.format_observation(observation)}]

        await asyncio.gather(*map(open_one, requests))

    async def on_turn_end(self, infer_request, response_choice, current_turn):
        key = infer_request.uuid
        wrapper = self.sessions.get(key)
        if wrapper is None:
            return {"done": True}
        action = self.parse_action(response_choice.message.content)
        observation, reward, done, _metadata = await asyncio.to_thread(wrapper.step, action)
        rewards = self.rewards[key]
        rewards.append(reward)
        infos = {"total_reward": sum(rewards), "step_rewards": list(rewards), "gym_done": done}
        if done:
            await self.end_session(key)
        else:
            self.replies[key] = self.format_observation(observation)
        return {"done": done, "rollout_infos": infos}

    def step(self, infer_request, response_choice, current_turn):
        reply = self.replies.pop(infer_request.uuid, None)
        if reply is not None:
            infer_request.messages.append({"role": "user", "content": reply})
        return {"infer_request": infer_request}

    async def end_session(self, key: str) -> None:
        """Forget the trajectory and close its session (closing never raises)."""
        wrapper = self.sessions.pop(key, None)
        self.rewards.pop(key, None)
        self.replies.pop(key, None)
        if wrapper is not None:
            await asyncio.to_thread(wrapper.close)

    @staticmethod
    def parse_action(text: str) -> dict[str, Any]:
        """A JSON object in the reply is the action; any other reply is sent as ``message``."""
        try:
            value = json.loads(text)
        except ValueError:
            return {"message": text}
        return value if isinstance(value, dict) else {"message": text}

    @staticmethod
    def format_observation(observation: Any) -> str:
        return json.dumps(observation, default=str)


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




async def test_openenv_scheduler_plays_to_the_end(server: str, tokenizer: Any) -> None:
    s = ScriptedSampler(tokenizer=tokenizer, respond=bisect(tokenizer))
    sched = build_scheduler(GuessingScheduler, s, tokenizer, max_turns=10)
    res = await run_rollouts(sched, rows(server, 3), sampling_params=PARAMS, progress=False)
    for t in res.trajectories:
        assert t.messages[0] == {"role": "system", "content": "You play a guessing game."}
        assert json.loads(t.messages[1]["content"])["text"].startswith("I am thinking of a number")
        assert t.step_rewards[-1] == 1.0 and t.infos["total_reward"] == 1.0 and t.infos["gym_done"] is True
        assert t.num_turns == len(t.step_rewards) > 1
    assert_token_exact(res.trajectories, tokenizer)
    assert await sessions_settle(server) == 0  # each episode ended done, which closed its session


async def test_episodes_cut_by_max_turns_keep_their_session_open(server: str, tokenizer: Any) -> None:
    """Like ms-swift 4.6.0's ``OpenEnvScheduler``, a session is closed only when its episode reports
    done; rlcore's ``on_trajectory_end``, which ms-swift has no equivalent of, is where a port closes
    it on every other path."""
    s = ScriptedSampler(['{"guess": 1}'], tokenizer)
    sched = build_scheduler(GuessingScheduler, s, tokenizer, max_turns=2)
    res = await run_rollouts(sched, rows(server, 2), sampling_params=PARAMS, progress=False)
    assert all(t.num_turns == 2 and t.infos["gym_done"] is False for t in res.trajectories)
    assert_token_exact(res.trajectories, tokenizer)
    assert active_sessions(server) == 2
    for t in res.trajectories:
        await sched.end_session(t.uuid)
    assert await sessions_settle(server) == 0

    class ClosesEveryPath(GuessingScheduler):
        async def on_trajectory_end(self, trajectory):
            await self.end_session(trajectory.uuid)

    sched = build_scheduler(ClosesEveryPath, s, tokenizer, max_turns=2)
    await run_rollouts(sched, rows(server, 2), sampling_params=PARAMS, progress=False)
    assert await sessions_settle(server) == 0


async def test_on_the_tiny_model(server: str, tokenizer: Any, tiny_hf_sampler: Any) -> None:
    sched = build_scheduler(GuessingScheduler, tiny_hf_sampler, tokenizer, max_turns=2)
    res = await run_rollouts(sched, rows(server, 2), num_generations=2,
                             sampling_params=SamplingParams(max_tokens=8, temperature=1.0), progress=False)
    assert_token_exact(res.trajectories, tokenizer)
    for t in res.trajectories:
        await sched.end_session(t.uuid)
    assert await sessions_settle(server) == 0
