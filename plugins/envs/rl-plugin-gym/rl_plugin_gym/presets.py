"""Named presets of real gymnasium environments, tuned to teach rather than to stump.

``frozen_lake``: gymnasium's ``FrozenLake-v1`` 4×4 map on firm ice (``is_slippery=False``: a move goes
where it was chosen) with progress shaping (``reward_shaping="progress"``: every step earns how much
closer to the goal it got, as a share of the start's distance; reaching the goal adds the env's own
1). Each state is told without the map (position, goal, what lies in each direction: a third of
the tokens). An invalid reply costs nothing but the turn it wastes (``invalid_penalty=0``), and three in a
row end the episode. The shortest path is 6 moves, each a single word (DOWN, RIGHT …), so the
shaped return of an episode runs from 0 (no progress) to 2 (the goal). It is the embedded default of
``gym_scheduler``; every option can be overridden (``--env-kwargs '{"is_slippery": true}'``).
"""

from __future__ import annotations

from typing import Any

from .gymnasium_env import GymnasiumEnv
from .toy_text import FrozenLakeFormat

FROZEN_LAKE = {"gym_id": "FrozenLake-v1", "is_slippery": False, "reward_shaping": "progress", "invalid_penalty": 0.0}


def frozen_lake(**options: Any) -> GymnasiumEnv:
    """``FrozenLake-v1`` on firm ice with progress shaping; ``options`` override the preset."""
    env = GymnasiumEnv(**{**FROZEN_LAKE, "formatter": FrozenLakeFormat(show_map=False), **options})
    env.name = "frozen_lake"
    return env
