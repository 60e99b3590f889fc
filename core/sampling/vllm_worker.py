"""Weight sync into vLLM workers: safetensors files in shared memory, loaded by a worker extension.

vLLM runs its model in worker processes; the documented way to run our code there is a worker
extension class (``worker_extension_cls="rlcore.sampling.vllm_worker.WeightSyncExtension"`` for the
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

This module imports neither vLLM nor torch at import time.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import Any, Callable, Iterator

from ..errors import SamplerError
from .base import WeightsLike

WEIGHTS_FILE = "rlcore-weights.safetensors"
DEFAULT_BUCKET_BYTES = 1 << 30
RPC_LOAD_FROM_PATH = "rlcore_load_weights_from_path"


def default_sync_dir() -> str:
    """A fresh directory in ``/dev/shm`` (RAM-backed) when there is one, else the temp dir."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    return tempfile.mkdtemp(prefix="rlcore-sync-", dir=base)


def _nbytes(t: Any) -> int:
    return int(t.numel()) * int(t.element_size())


def iter_buckets(weights: WeightsLike, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Iterator[dict[str, Any]]:
    """Split named tensors into dicts of at most ``bucket_bytes`` (a larger tensor gets its own)."""
    items = weights.items() if hasattr(weights, "items") else weights
    bucket: dict[str, Any] = {}
    size = 0
    for name, t in items:
        n = _nbytes(t)
        if bucket and size + n > bucket_bytes:
            yield bucket
            bucket, size = {}, 0
        bucket[name] = t
        size += n
    if bucket:
        yield bucket


def write_weights(weights: WeightsLike, directory: str, name: str | None = None) -> str:
    """Write named tensors as one safetensors file in ``directory`` (atomically); returns its path.

    ``name`` defaults to ``rlcore-weights.safetensors``; buckets get unique names.
    """
    from safetensors.torch import save_file

    items = weights.items() if hasattr(weights, "items") else weights
    tensors: dict[str, Any] = {}
    seen: set[int] = set()
    for n, t in items:
        t = t.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:  # tied weights (embeddings / lm_head) share storage; safetensors refuses that
            t = t.clone()
        seen.add(ptr)
        tensors[n] = t
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name or WEIGHTS_FILE)
    tmp = path + f".tmp{os.getpid()}"
    save_file(tensors, tmp)
    os.replace(tmp, path)
    return path


def write_bucket(bucket: dict[str, Any], directory: str) -> str:
    return write_weights(bucket, directory, name=f"rlcore-weights-{uuid.uuid4().hex[:12]}.safetensors")


def sync_in_buckets(
    weights: WeightsLike, *, directory: str, bucket_bytes: int, load: Callable[[str], Any], who: str, hint: str
) -> int:
    """Hand ``weights`` to an engine bucket by bucket, whatever carries the call (in-process
    ``collective_rpc`` or the server's HTTP route): each bucket is written as one file under
    ``directory``, ``load(path)`` makes the engine's workers read it and returns what each loaded
    (a tensor count per worker, or None where the engine does not say), and the file is removed.
    A worker that loaded another count than the bucket holds is an error ending in ``hint``; no
    tensor at all is an error too (an empty sync would silently keep the old policy). Returns the
    number of tensors sent."""
    total = 0
    for bucket in iter_buckets(weights, bucket_bytes):
        path = write_bucket(bucket, directory)
        try:
            results = load(path)
        finally:
            os.remove(path)
        if results is not None and any(str(r) != str(len(bucket)) for r in results):
            raise SamplerError(f"{who}: the workers loaded {results} tensors of a {len(bucket)}-tensor bucket; {hint}")
        total += len(bucket)
    if total == 0:
        raise SamplerError(f"{who}: update_weights got no tensors")
    return total


def _resolve(path: str) -> str:
    if os.path.isdir(path):
        path = os.path.join(path, WEIGHTS_FILE)
    if not os.path.exists(path):
        raise SamplerError(f"weights file {path} does not exist; is the sync directory shared with the server?")
    return path


def iter_weights(path: str) -> Iterator[tuple[str, Any]]:
    """Yield ``(name, tensor)`` from a safetensors file one tensor at a time (memory-mapped)."""
    from safetensors import safe_open

    with safe_open(_resolve(path), framework="pt", device="cpu") as f:
        for name in f.keys():
            yield name, f.get_tensor(name)


def read_weights(path: str) -> dict[str, Any]:
    """Read a whole weights file (``path`` is the file or its directory) — for tests and small models."""
    return dict(iter_weights(path))


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
