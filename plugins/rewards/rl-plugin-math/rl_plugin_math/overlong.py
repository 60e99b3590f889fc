"""``soft_overlong``: DAPO's soft overlong punishment (Yu et al. 2025, eq. 13).

Why: a completion cut at the length limit has no answer, and punishing it with the accuracy of 0
alone is noisy; a penalty that ramps up over the last ``cache_len`` tokens before the limit tells
the policy to finish earlier without a cliff.
"""

from __future__ import annotations

from rlcore.errors import ConfigError
from rlcore.rewards import Reward


class SoftOverlong(Reward):
    """``r = 0`` when ``L <= max_len - cache_len``; ``r = (max_len - cache_len - L) / cache_len`` up to
    ``L = max_len`` (reaching -1); ``r = -1`` beyond. ``L`` is the completion length in tokens."""

    name = "soft_overlong"

    def __init__(self, max_len: int = 1024, cache_len: int = 256) -> None:
        if not 0 < cache_len <= max_len:
            raise ConfigError(
                f"soft_overlong: need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}"
            )
        self.max_len = max_len
        self.cache_len = cache_len

    def value(self, length: int) -> float:
        expected = self.max_len - self.cache_len
        if length <= expected:
            return 0.0
        return max(-1.0, (expected - length) / self.cache_len)

    def score(self, completion_ids: list[list[int]]) -> list[float]:
        return [self.value(len(ids)) for ids in completion_ids]
