"""Fixtures for rl-plugin-agents' tests (rlcore's pytest plugin loads only this package's plugin in
each test and provides the tiny model, the scripted sampler and SmolLM2).

``rollout(scheduler, prompts=…, n=…)`` runs the real driver (which holds every trajectory to the
invariants) and returns the trajectories; ``recorded(sampler)`` wraps a sampler so a test can hold
the rows the trainer would pack to the sampler calls that were made."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest

from rlcore.rollout.driver import run_rollouts
from rlcore.testing.multi_turn import RecordingSampler
from rlcore.types import Prompt, SamplingParams

from rl_plugin_agents.scheduler import AgentProxyScheduler
from rl_plugin_agents.testing import prompt


@pytest.fixture
def make_proxy() -> Callable[..., AgentProxyScheduler]:
    """``make_proxy(sampler, agent=…, **options)``: an ``agent_proxy`` scheduler on ``sampler``
    (closed, with its server, after the test)."""
    made: list[AgentProxyScheduler] = []

    def make(sampler: Any, max_tokens: int = 64, **options: Any) -> AgentProxyScheduler:
        sched = AgentProxyScheduler(sampler, tokenizer=sampler.tokenizer,
                                    sampling_params=SamplingParams(max_tokens=max_tokens), **options)
        made.append(sched)
        return sched

    yield make
    for sched in made:
        asyncio.run(sched.close())


@pytest.fixture
def rollout(tiny_tokenizer: Any) -> Callable[..., list[Any]]:
    def run(scheduler: Any, prompts: list[Prompt] | None = None, n: int = 1, **kwargs: Any) -> list[Any]:
        prompts = prompts or [prompt(scheduler.tokenizer or tiny_tokenizer)]
        result = asyncio.run(run_rollouts(scheduler, prompts, num_generations=n, progress=False, **kwargs))
        return result.trajectories

    return run


@pytest.fixture
def recorded() -> Callable[[Any], RecordingSampler]:
    return RecordingSampler
