from __future__ import annotations

from collections import deque
from typing import Any, Callable

import pytest


def shortest_plan(unwrapped: Any, start: int, win: Callable[[float], bool] = lambda r: r > 0) -> list[int]:
    """Breadth-first search over a deterministic toy-text env's transition table ``P`` to the first
    terminal transition whose reward ``win`` accepts: the action indices of a shortest winning episode."""
    seen = {start}
    queue: deque[tuple[int, list[int]]] = deque([(start, [])])
    while queue:
        state, path = queue.popleft()
        for action, outcomes in unwrapped.P[state].items():
            (_prob, nxt, reward, done), *rest = outcomes
            assert not rest, "shortest_plan needs a deterministic env"
            if done and win(reward):
                return path + [action]
            if not done and nxt not in seen:
                seen.add(nxt)
                queue.append((nxt, path + [action]))
    raise AssertionError("no winning plan")


@pytest.fixture
def plan() -> Callable[..., list[int]]:
    return shortest_plan
