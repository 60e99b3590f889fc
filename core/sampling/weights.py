"""Weights into a sampler: in-place loading into a live module, and the weight-file format.

**In-place loading** (:func:`load_weights_into`) is how a colocated sampler follows the trainer.

Names are matched tolerantly (a trainer's names may carry ``module.`` from DDP, ``_orig_mod.``
from ``torch.compile`` or ``base_model.model.`` from PEFT), tensors are copied into the existing
parameters (no reallocation, so CUDA graphs / caches holding them stay valid), and a tensor that
already *is* the parameter (the sampler shares the trainer's module) is skipped: no copy at all.

**The weight-file format** is what a trainer writes and a vLLM engine reads, in process or behind
``vllm serve``: named tensors as safetensors buckets of at most ``bucket_bytes`` in a sync
directory (``/dev/shm`` when local), loaded by the worker extension's ``RPC_LOAD_FROM_PATH`` method
(:mod:`rlcore.sampling.vllm.worker` explains why a path and not tensors). Both the in-process
client (:mod:`~rlcore.sampling.vllm.engine`) and the HTTP one (:mod:`~rlcore.sampling.openai`) write it.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import Any, Callable, Iterable, Iterator, Mapping

from ..errors import SamplerError
from .base import WeightsLike

_PREFIXES = ("module.", "_orig_mod.", "base_model.model.", "model.")


def _candidates(name: str) -> list[str]:
    out = [name]
    changed = True
    while changed:
        changed = False
        for p in _PREFIXES:
            if out[-1].startswith(p):
                out.append(out[-1][len(p):])
                changed = True
    return out


def _iter_weights(weights: WeightsLike) -> Iterable[tuple[str, Any]]:
    if isinstance(weights, Mapping):
        return weights.items()
    return weights


def load_weights_into(module: Any, weights: WeightsLike, *, lora: bool = False) -> int:
    """Copy ``weights`` (a state dict or ``(name, tensor)`` pairs) into ``module`` in place.

    With ``lora=True`` only adapter tensors (names containing ``lora_``) are expected and every
    other parameter is left alone; the module must carry the adapters (a PEFT model).
    Returns how many tensors were copied. Unknown names or shape mismatches raise a SamplerError.
    """
    import torch

    # keep_vars: the live Parameters, including tied aliases (lm_head.weight ↔ embed_tokens.weight)
    params: dict[str, Any] = dict(module.state_dict(keep_vars=True))
    # index the module's names by every prefix-stripped form, so either side may carry prefixes
    index: dict[str, str] = {}
    for full in params:
        for c in _candidates(full):
            index.setdefault(c, full)
        index.setdefault(full.replace(".default.", "."), full)  # PEFT adapter name "default"
    copied = 0
    with torch.no_grad():
        for name, tensor in _iter_weights(weights):
            if lora and "lora_" not in name:
                continue
            target_name = next((index[c] for c in _candidates(name) if c in index), None)
            if target_name is None:
                target_name = next((index[c.replace(".default.", ".")] for c in _candidates(name)
                                    if c.replace(".default.", ".") in index), None)
            if target_name is None:
                raise SamplerError(
                    f"update_weights: the sampler's model has no parameter named {name!r}; "
                    "pass the trainer model's state_dict / named_parameters()"
                )
            target = params[target_name]
            if tensor is target or (
                hasattr(tensor, "data_ptr") and tensor.data_ptr() == target.data_ptr() and tensor.device == target.device
            ):
                continue  # shared module: the sampler already sees these weights
            if tuple(tensor.shape) != tuple(target.shape):
                raise SamplerError(
                    f"update_weights: {name!r} has shape {tuple(tensor.shape)} but the sampler's "
                    f"{target_name!r} has {tuple(target.shape)}; the models differ"
                )
            target.copy_(tensor.detach().to(device=target.device, dtype=target.dtype))
            copied += 1
    return copied


# --- the weight-file format ------------------------------------------------------------------------
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
