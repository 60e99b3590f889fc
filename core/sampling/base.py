"""The sampler protocol every generation backend implements.

Token-in / token-out: prompts are token ids, completions come back as token ids with the logprob
of every sampled token (they feed importance-sampling correction). Everything is ``async`` so many
trajectories can wait on generation at once; backends batch what arrives together.
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterable, Mapping, Union

from ..types import Completion, SamplingParams

#: set on an lm_head cast to float32 (``cast_lm_head_to_fp32``): its logits are computed in float32,
#: by the trainer's logprobs (rlcore.algorithms.logprobs) and by the hf sampler's fused decode alike;
#: defined here, the lowest layer that reads it
FP32_HEAD = "rlcore_fp32_head"

WeightsLike = Union[Mapping[str, Any], Iterable[tuple[str, Any]]]


class Sampler:
    """Base class of generation backends. Subclasses implement :meth:`generate`; the rest has sane
    defaults built on it.

    Attributes: ``tokenizer`` (a transformers tokenizer, used for chat templates and decoding),
    ``policy_version`` (incremented by every :meth:`update_weights`).
    """

    name: str = "sampler"
    tokenizer: Any = None
    policy_version: int = 0

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        """One completion of ``prompt_ids`` (``params.n`` is ignored here; see :meth:`generate_n`)."""
        raise NotImplementedError

    async def generate_n(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        """``params.n`` completions of one prompt."""
        one = params.replace(n=1)
        seeds = [None if params.seed is None else params.seed + i for i in range(params.n)]
        return list(await asyncio.gather(*(self.generate(prompt_ids, one.replace(seed=s)) for s in seeds)))

    async def generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """``params.n`` completions for each prompt, in order."""
        return list(await asyncio.gather(*(self.generate_n(p, params) for p in prompts)))

    def sample(self, prompts: list[list[int]] | list[Any], params: SamplingParams | None = None) -> list[list[Completion]]:
        """Blocking batch sampling for scripts and loops: ``params.n`` completions (token ids and the
        logprob of each sampled token) for every prompt (token ids, or anything with ``prompt_ids``),
        in order. Built on :meth:`generate_batch`, so every backend has it (async code awaits
        :meth:`generate_batch` directly). For trajectories — the conversation, rewards, training —
        use :func:`rlcore.loop.sample` or :class:`rlcore.loop.Rollout`."""
        from ..asyncutil import run_sync

        ids = [list(getattr(p, "prompt_ids", p)) for p in prompts]
        return run_sync(self.generate_batch(ids, params or SamplingParams()))

    #: True when the factory takes the trainer's own module (``model=<nn.Module>``) and generates with
    #: its parameters: nothing to copy or sync. Otherwise it gets the model's path and its own copy.
    shares_trainer_module: bool = False

    def update_weights(
        self, weights: WeightsLike, *, lora: bool = False, version: int | None = None
    ) -> dict[str, float] | None:
        """Load new policy weights (named tensors or a state dict; only adapter weights when ``lora``).

        ``version`` is the policy version the weights are (default: one past the current); a
        backend may return sync metrics (``sync/*`` floats) or ``None``."""
        raise NotImplementedError(f"{type(self).__name__} cannot load weights")

    def _advance_version(self, version: int | None) -> None:
        """``policy_version`` after a sync: the given version, else one more."""
        self.policy_version = self.policy_version + 1 if version is None else int(version)

    def sleep(self, level: int = 1) -> None:
        """Free accelerator memory while the trainer works (no-op where the backend cannot)."""

    def wake_up(self) -> None:
        """Undo :meth:`sleep`."""

    def reset_prefix_cache(self) -> None:
        """Drop cached prefixes (after a weight sync they are stale)."""

    async def close(self) -> None:
        """Release the backend's resources."""

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False) if self.tokenizer is not None else ""


def attributes_of(package: str, module: str) -> Any:
    """A package ``__getattr__`` that answers with ``package.module``'s attributes, importing that
    module on first use: ``rlcore.sampling.hf.HFSampler`` (and ``…vllm.VLLMSampler``) as when each
    backend was one module, while importing the package loads neither torch nor vLLM."""
    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        import importlib

        try:
            return getattr(importlib.import_module(f"{package}.{module}"), name)
        except AttributeError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    return __getattr__
