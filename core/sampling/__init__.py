"""Token-in / token-out generation backends. See :class:`rlcore.sampling.base.Sampler`."""

from .base import Sampler, WeightsLike

__all__ = ["Sampler", "WeightsLike"]
