"""Weight loading on vLLM workers, and the file format used to hand weights to a vLLM server.

vLLM runs its model in worker processes; the documented way to run our code there is a worker
extension class (``worker_extension_cls="rlcore.sampling.vllm_worker.WeightSyncExtension"`` for the
in-process engine, ``--worker-extension-cls`` for ``vllm serve``) whose methods are invoked through
``collective_rpc`` (``LLM.collective_rpc`` in process; ``POST /collective_rpc`` on a server started
with ``VLLM_SERVER_DEV_MODE=1``). Tensors cross to a server as a safetensors file on a filesystem
both sides see (the trainer writes, the workers read) — no extra transport to set up.

This module imports neither vLLM nor torch at import time.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import SamplerError
from .base import WeightsLike

WEIGHTS_FILE = "rlcore-weights.safetensors"


def write_weights(weights: WeightsLike, directory: str) -> str:
    """Write named tensors to ``directory/rlcore-weights.safetensors`` (atomically); returns the file path."""
    from safetensors.torch import save_file

    items = weights.items() if hasattr(weights, "items") else weights
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in items}
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, WEIGHTS_FILE)
    tmp = path + f".tmp{os.getpid()}"
    save_file(tensors, tmp)
    os.replace(tmp, path)
    return path


def read_weights(path: str) -> dict[str, Any]:
    """Read what :func:`write_weights` wrote (``path`` is the file or its directory)."""
    from safetensors.torch import load_file

    if os.path.isdir(path):
        path = os.path.join(path, WEIGHTS_FILE)
    if not os.path.exists(path):
        raise SamplerError(f"weights file {path} does not exist; is the sync directory shared with the server?")
    return load_file(path)


def load_into_vllm_model(model: Any, weights: WeightsLike) -> int:
    """Feed ``(name, tensor)`` pairs to a vLLM model's own ``load_weights`` (it knows its fused
    layouts: q/k/v and gate/up are packed there, so a plain ``copy_`` would be wrong)."""
    items = list(weights.items()) if hasattr(weights, "items") else list(weights)
    model.load_weights(weights=iter(items))
    return len(items)


class WeightSyncExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); ``self`` is the worker."""

    def rlcore_load_weights_from_path(self, path: str) -> int:
        return load_into_vllm_model(self.model_runner.model, read_weights(path))  # type: ignore[attr-defined]

    def rlcore_load_weights(self, weights: list[tuple[str, Any]]) -> int:
        device = getattr(self, "device", None)
        moved = [(n, t.to(device) if device is not None else t) for n, t in weights]
        return load_into_vllm_model(self.model_runner.model, moved)  # type: ignore[attr-defined]
