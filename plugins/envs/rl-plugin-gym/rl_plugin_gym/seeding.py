"""Where an episode's seed comes from: the row's ``env_config.seed``, the env's ``seed`` option, or
the trajectory's group.

GRPO compares the ``num_generations`` samples of one prompt, so they should face the same start
state: without an explicit seed, every trajectory of a group gets the same seed derived from its
``group_id`` (different groups get different, stable seeds).
"""

from __future__ import annotations

import hashlib
from typing import Any


def env_config(request: Any) -> dict[str, Any]:
    """The row's ``env_config`` dict (empty when the row has none)."""
    data = getattr(request, "data", None) or getattr(request, "data_dict", None) or {}
    cfg = data.get("env_config") if isinstance(data, dict) else None
    return dict(cfg) if isinstance(cfg, dict) else {}


def episode_seed(request: Any, default: int | None = None) -> int | None:
    """``env_config.seed`` > the env's own ``seed`` option > a stable hash of the group id > ``None``."""
    seed = env_config(request).get("seed")
    if seed is not None:
        return int(seed)
    if default is not None:
        return int(default)
    group = getattr(request, "group_id", "") or ""
    if group:
        return int.from_bytes(hashlib.sha256(group.encode()).digest()[:4], "big")
    return None
