"""Weight sync into vLLM workers: safetensors files in shared memory, loaded by a worker extension.

vLLM runs its model in worker processes; the documented way to run our code there is a worker
extension class (``worker_extension_cls="rlcore.sampling.vllm.worker.WeightSyncExtension"`` for the
in-process engine, ``--worker-extension-cls`` for ``vllm serve``) whose methods are invoked through
``collective_rpc`` (``LLM.collective_rpc`` in process; ``POST /collective_rpc`` on a server started
with ``VLLM_SERVER_DEV_MODE=1``, vLLM >= 0.10.2).

**Why a file path and not tensors.** With vLLM's default ``VLLM_ENABLE_V1_MULTIPROCESSING=1`` the
engine core runs in another process and ``LLM.collective_rpc`` msgpack-encodes its arguments
(``vllm/v1/serial_utils.py``): on 0.10.0 ``.numpy()`` on a CUDA tensor raises, and on every version
up to 0.33 a tensor inside an untyped utility call reaches the worker as a ``[dtype, shape, data]``
list. A path is a string: it crosses msgpack, HTTP/JSON and Ray alike, so the in-process engine
and a ``vllm serve`` server share one code path, on every supported version, with no process group
to set up (NCCL would need one per trainer/engine pair, CUDA IPC needs pickled handles that vLLM
refuses without ``VLLM_ALLOW_INSECURE_SERIALIZATION``, and vLLM's own weight-transfer API only
exists from 0.17).

**Memory.** The trainer writes the weights in buckets of ``bucket_bytes`` (default 1 GiB) into
``/dev/shm`` (RAM, no disk) when the directory is local, so at most one bucket sits in shared
memory at a time; each worker opens the bucket with ``safe_open`` (a memory map) and hands the
model's ``load_weights`` one tensor at a time, so with tensor parallelism no rank reads the whole
file into its own host memory: the ranks share the page cache and each keeps only the tensor in
hand.

The file format and the RPC name (what a client writes, what this extension reads) live in
:mod:`rlcore.sampling.weights`, which the HTTP client imports without this module.

This module imports neither vLLM nor torch at import time.
"""

from __future__ import annotations

from typing import Any, Iterator

from ...errors import SamplerError
from ..weights import (
    DEFAULT_BUCKET_BYTES,
    RPC_LOAD_FROM_PATH,
    WEIGHTS_FILE,
    default_sync_dir,
    iter_buckets,
    iter_weights,
    read_weights,
    sync_in_buckets,
    write_bucket,
    write_weights,
)


def load_into_vllm_model(model: Any, weights: Any) -> int:
    """Feed ``(name, tensor)`` pairs to a vLLM model's own ``load_weights`` (it knows its fused
    layouts: q/k/v and gate/up are packed there, and it slices each tensor for its TP rank).
    ``weights`` may be a lazy iterator: it is consumed one tensor at a time."""
    count = 0

    def counted() -> Iterator[tuple[str, Any]]:
        nonlocal count
        items = weights.items() if hasattr(weights, "items") else weights
        for item in items:
            count += 1
            yield item

    model.load_weights(weights=counted())
    return count


class WeightSyncExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); ``self`` is the worker."""

    def rlcore_load_weights_from_path(self, path: str) -> int:
        """Load one bucket written by :func:`write_bucket`; returns how many tensors it held."""
        if not isinstance(path, str):
            raise SamplerError(f"rlcore_load_weights_from_path takes a file path, got {type(path).__name__}")
        return load_into_vllm_model(self.model_runner.model, iter_weights(path))  # type: ignore[attr-defined]
