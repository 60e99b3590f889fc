"""Fixtures for rl-plugin-judge's tests: a real OpenAI-compatible judge on 127.0.0.1 and trajectories.

The judge is rlcore's own test server (:class:`rlcore.testing.openai_server.OpenAICompatServer`,
FastAPI + uvicorn in a thread) serving ``/v1/chat/completions`` from a scripted sampler: its reply
to a question is decided by a marker in the completion being judged, so a test picks the judge's
answer by what it asks about. Faults are real too: HTTP statuses queued on ``server.faults``, a
reply held past the client's deadline, a reply with no score, a port nobody listens on.
"""

from __future__ import annotations

import asyncio
import re
import socket
from typing import Any, Callable, Iterator

import pytest

from rlcore.errors import SamplerError
from rlcore.testing.openai_server import OpenAICompatServer
from rlcore.testing.scripted import ScriptedSampler
from rlcore.types import Trajectory, Turn


def judge_reply(question: str) -> str:
    """What the scripted judge answers, by the marker in the completion it is shown."""
    if "GARBAGE" in question:
        return "I really cannot say."
    if "FRACTION" in question:
        return "Decent work overall. 7/10"
    if "BOLD" in question:
        return "Verdict: **9**"
    worth = re.search(r"WORTH (\d+)", question)
    if worth:
        return f"The answer is fine, though the 3 steps could be 2.\nScore: {worth.group(1)}"
    return f"Score: {len(question) % 11}"  # anything else: a score that differs from question to question


class JudgeSampler(ScriptedSampler):
    """The scripted judge behind the test server. ``SLOW`` in a question holds the reply
    ``slow_s`` seconds (past a client's deadline); ``BOOM`` makes generation fail (the server
    answers 400, which no client should retry)."""

    def __init__(self, tokenizer: Any, *, delay: float = 0.0, slow_s: float = 5.0) -> None:
        super().__init__(tokenizer=tokenizer, respond=self._respond, delay=delay)
        self.slow_s = slow_s
        self.questions: list[str] = []

    def _respond(self, prompt_ids: list[int], params: Any, index: int) -> str:
        return judge_reply(self.tokenizer.decode(prompt_ids))

    async def generate(self, prompt_ids: list[int], params: Any) -> Any:
        text = self.tokenizer.decode(prompt_ids)
        self.questions.append(text)
        if "BOOM" in text:
            raise SamplerError("the judge model cannot read this")
        if "SLOW" in text:
            await asyncio.sleep(self.slow_s)
        return await super().generate(prompt_ids, params)


@pytest.fixture
def judge_server(tiny_tokenizer: Any) -> Iterator[Callable[..., OpenAICompatServer]]:
    """``judge_server(delay=0.0, slow_s=5.0)``: a started judge server (stopped after the test);
    ``server.url`` is its address, ``server.requests`` what it received, ``server.peak_running``
    the most requests it was answering at once."""
    started: list[OpenAICompatServer] = []

    def start(**options: Any) -> OpenAICompatServer:
        server = OpenAICompatServer(JudgeSampler(tiny_tokenizer, **options), model_name="judge").start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def make_traj() -> Callable[..., Trajectory]:
    """A finished one-turn trajectory: the user asked ``question``, the policy answered ``text``."""

    def make(text: str, question: str = "What is 2 + 2?", **data: Any) -> Trajectory:
        ids = list(range(4))
        return Trajectory(
            prompt_ids=[1, 2, 3],
            messages=[{"role": "user", "content": question}, {"role": "assistant", "content": text}],
            data={"question": question, **data},
            turns=[Turn(token_ids=ids, loss_mask=[1] * 4, logprobs=[-0.5] * 4, text=text)],
            status="ok",
            num_turns=1,
        )

    return make
