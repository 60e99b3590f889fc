"""``sync_weights(policy, sampler)``: make a sampler generate with the policy's current weights.

One call for every placement: a colocated ``hf`` sampler that shares the policy's module has
nothing to copy (its version is bumped); a separate in-process sampler (``hf`` on its own copy,
``vllm``) loads the exported tensors in place; the HTTP sampler (``openai`` against a vLLM server)
gets them as weight files; a Ray sampler pool gets them through the object store or a broadcast
group; and a policy living in a Ray actor (:func:`rlcore.loop.initialize`) exports and sends from
its own process. A LoRA policy sends adapters when the sampler can load them, else merged
``W + ΔW`` under the base model's names (the seed's ``merge_and_sync``), never merging in place.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

import torch

from ..sampling.weight_export import export_weights, sampler_accepts_lora, shares_module


def sync_weights(policy: Any, sampler: Any, *, version: int | None = None) -> dict[str, float]:
    """Send ``policy``'s weights (a :class:`~rlcore.loop.Policy`, a remote one, or a bare module) to
    ``sampler``; afterwards ``sampler.policy_version`` is ``version`` (default: the policy's step,
    or one more than before). Returns ``sync/*`` metrics."""
    remote_sync = getattr(policy, "sync_to", None)
    if remote_sync is not None and getattr(policy, "is_remote", False):
        return remote_sync(sampler, version=version)
    # a Policy holds its module in ``.model``; a bare module is the model itself (a causal LM's own
    # ``.model`` is its decoder stack: exporting that would drop the ``model.`` prefix and lm_head)
    model = policy if isinstance(policy, torch.nn.Module) else getattr(policy, "model", policy)
    if version is None:
        step = getattr(policy, "step", None)
        version = int(step) if isinstance(step, int) else int(getattr(sampler, "policy_version", 0)) + 1
    t0 = time.perf_counter()
    if shares_module(sampler, model):
        sampler.policy_version = int(version)
        return {"sync/seconds": 0.0, "sync/shared": 1.0}
    # the Ray pool ships CPU copies through the object store (device tensors over a broadcast group);
    # in-process samplers copy the live tensors in right away, so no copy is made here
    remote = hasattr(sampler, "sync_mode")
    if remote and hasattr(sampler, "prepare_sync"):  # a Ray pool: its broadcast group, formed once when asked for
        sampler.prepare_sync(str(next(model.parameters()).device))
    to_cpu = remote and sampler.sync_mode != "broadcast"
    weights, lora = export_weights(model, sampler_accepts_lora=sampler_accepts_lora(sampler), to_cpu=to_cpu,
                                   copy=remote)
    update = sampler.update_weights
    if "version" in inspect.signature(update).parameters:
        metrics = update(weights, lora=lora, version=int(version)) or {}
    else:
        metrics = {}
        update(weights, lora=lora)
    reset = getattr(sampler, "reset_prefix_cache", None)
    if reset is not None:
        reset()
    sampler.policy_version = int(version)
    out = {k: float(v) for k, v in dict(metrics).items() if isinstance(v, (int, float))}
    out.setdefault("sync/seconds", time.perf_counter() - t0)
    return out
