"""The sampler actor: one generation backend (``hf`` by default) living in its own Ray worker.

Why an actor per backend rather than a Ray task per request: the model stays loaded, its prefix /
KV caches stay warm across a trajectory's turns (the pool routes a trajectory back to the same
worker), and concurrent requests are micro-batched by the backend. The actor is ``async`` so many
trajectories wait on it at once.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ..types import Completion, SamplingParams
from ..sampling.weight_export import sampler_accepts_lora


def build_sampler(name: str, model: Any, options: dict[str, Any]) -> Any:
    """Instantiate the registered sampler ``name`` for ``model`` (a path), as the driver would."""
    import rlcore

    factory = rlcore.get("sampler", name)
    return factory(model, **options)


class SamplerWorker:
    """Hosts one sampler. Methods are called by :class:`~rlcore.distributed.pool.RemotePool`."""

    def __init__(
        self,
        rank: int,
        model: str,
        sampler_name: str = "hf",
        options: dict[str, Any] | None = None,
        torch_threads: int = 1,
        seed: int | None = None,
    ) -> None:
        import torch

        torch.set_num_threads(max(1, torch_threads))
        self.rank = rank
        opts = dict(options or {})
        if seed is not None and sampler_name == "hf":
            opts.setdefault("seed", seed + rank)
        self.sampler = build_sampler(sampler_name, model, opts)
        self.requests = 0
        self.tokens = 0
        self.sync_seconds: list[float] = []

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        """One completion; the backend batches concurrent calls. Tags the completion with this worker."""
        self.requests += 1
        completion = await self.sampler.generate(prompt_ids, params)
        self.tokens += len(completion.token_ids)
        completion.meta.setdefault("policy_version", self.sampler.policy_version)
        completion.meta["sampler_worker"] = self.rank
        return completion

    def update_weights(self, weights: Any, lora: bool = False, version: int | None = None) -> dict[str, float]:
        """Load weights (resolved by Ray from the object store) and adopt the trainer's version number.

        Returns the load time, so the driver can report transfer vs. load separately.
        """
        t0 = time.perf_counter()
        self.sampler.update_weights(weights, lora=lora)
        if version is not None:
            self.sampler.policy_version = int(version)
        self.sampler.reset_prefix_cache()
        dt = time.perf_counter() - t0
        self.sync_seconds.append(dt)
        return {"load_s": dt, "policy_version": float(self.sampler.policy_version)}

    def info(self) -> dict[str, Any]:
        """Who and where this worker is, and what it has done (for routing, metrics and tests)."""
        import socket

        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "policy_version": self.sampler.policy_version,
            "accepts_lora": sampler_accepts_lora(self.sampler),
            "requests": self.requests,
            "tokens": self.tokens,
            # the backend's decode batches so far (hf: sequences per batch), for throughput analysis
            "batch_sizes": list(getattr(self.sampler, "batch_sizes", None) or [])[-10_000:],
        }

    def ping(self) -> int:
        return self.rank

    def sleep(self, level: int = 1) -> None:
        self.sampler.sleep(level)

    def wake_up(self) -> None:
        self.sampler.wake_up()

    async def close(self) -> None:
        await self.sampler.close()

    # --- collective weight sync (GPU: NCCL; tests: gloo) --------------------------------------------
    def join_sync_group(self, init_method: str, rank: int, world_size: int, backend: str,
                        bucket_bytes: int | None = None) -> bool:
        """Join the trainer-rank-0 + samplers broadcast group used by :mod:`rlcore.distributed.collective`."""
        from .collective import BUCKET_BYTES, BroadcastGroup

        self._sync_group = BroadcastGroup(init_method, rank, world_size, backend,
                                          bucket_bytes=int(bucket_bytes or BUCKET_BYTES))
        return True

    def receive_broadcast(self, specs: list[tuple[str, list[int], str]], lora: bool = False, version: int | None = None) -> dict[str, float]:
        """Receive every tensor named in ``specs`` from rank 0 of the sync group and load them."""
        t0 = time.perf_counter()
        tensors = self._sync_group.receive(specs, device=getattr(self.sampler, "device", "cpu"))
        out = self.update_weights(tensors, lora=lora, version=version)
        out["recv_s"] = time.perf_counter() - t0
        return out
