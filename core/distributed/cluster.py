"""Bring a distributed layout up and down: Ray, the sampler group behind a RemoteSampler, and the
trainer group. The driver of ``rlcore train --distributed ray`` and the tests use these."""

from __future__ import annotations

from typing import Any

from .layout import DistributedConfig
from .placement_groups import PlacedGroup, place_actors
from .pool import RemoteSampler
from .runtime import ensure_ray, require_ray


def connect(config: DistributedConfig) -> Any:
    """Join ``config.address`` or start a local Ray big enough for both groups."""
    import os

    need = max(config.total_cpus, float(os.cpu_count() or 1))
    gpus = config.total_gpus or None
    return ensure_ray(config.address, num_cpus=need, num_gpus=gpus)


def start_samplers(
    config: DistributedConfig,
    model: str,
    *,
    tokenizer: Any = None,
    seed: int | None = None,
) -> tuple[PlacedGroup, RemoteSampler]:
    """Place ``config.sampler.num_workers`` sampler actors hosting ``model`` and wrap them in a pool.

    Blocks until every worker has loaded its model, so failures surface here with the worker named.
    """
    from .failures import WorkerFailedError
    from .sampler_worker import SamplerWorker

    ray = require_ray()
    connect(config)
    grp = config.sampler
    placed = place_actors(
        "sampler",
        SamplerWorker,
        grp,
        lambda rank: ((rank, str(model), config.sampler_name, dict(config.sampler_options), grp.torch_threads, seed), {}),
        strategy=config.placement_strategy,
    )
    try:
        ray.get([a.ping.remote() for a in placed.actors], timeout=config.worker_timeout_s)
    except Exception as exc:  # noqa: BLE001 - report which step failed, then clean up
        placed.remove()
        cause = getattr(exc, "cause", None) or exc
        if isinstance(cause, Exception) and cause.__class__.__module__.startswith("rlcore"):
            raise cause from None
        raise WorkerFailedError(f"sampler workers failed to start: {str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__}") from None
    if tokenizer is None:
        from transformers import AutoTokenizer

        from ..gguf import resolve_model

        tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(str(model))))
    pool = RemoteSampler(placed.actors, tokenizer, timeout_s=config.worker_timeout_s)
    return placed, pool
