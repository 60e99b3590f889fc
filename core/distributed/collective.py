"""A broadcast group from the weight owner (rank 0) to every sampler worker: NCCL on GPU, gloo on CPU.

Why not ``torch.distributed.init_process_group``: trainer rank 0 already belongs to the trainers'
data-parallel default group; this second, independent group (its own TCP store) adds the
samplers without disturbing it. Tensors travel in buckets: flat buffers of one dtype of at most
``bucket_bytes`` each (a larger tensor alone) — a handful of broadcasts per sync instead of one per
parameter, and neither side ever holds a second copy of the whole model in flight.
"""

from __future__ import annotations

import datetime
from typing import Any, Iterable

#: (name, shape, dtype name) of every tensor in a sync, in broadcast order
TensorSpec = tuple[str, list[int], str]

#: the default size of one broadcast bucket
BUCKET_BYTES = 256 * 1024 * 1024


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def node_ip() -> str:
    """This node's address as other Ray nodes see it (falls back to loopback outside Ray)."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address())
    except Exception:  # noqa: BLE001
        pass
    return "127.0.0.1"


class BroadcastGroup:
    """Rank 0 hosts the store; ``init_method`` is ``tcp://host:port``. Constructing blocks until every
    rank has joined, so callers start the other ranks' joins first (asynchronously)."""

    def __init__(self, init_method: str, rank: int, world_size: int, backend: str = "gloo", timeout_s: float = 120.0,
                 bucket_bytes: int = BUCKET_BYTES) -> None:
        import torch.distributed as dist

        host, port = init_method.removeprefix("tcp://").rsplit(":", 1)
        timeout = datetime.timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(host, int(port), world_size, rank == 0, timeout=timeout, wait_for_workers=False)
        prefixed = dist.PrefixStore("rlcore-weight-sync", self.store)
        self.backend = backend
        self.rank = rank
        self.world_size = world_size
        self.bucket_bytes = int(bucket_bytes)
        self.last_buckets = 0
        if backend == "nccl":
            self.pg = dist.ProcessGroupNCCL(prefixed, rank, world_size)
        elif backend == "gloo":
            self.pg = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
        else:
            raise ValueError(f"unknown weight-sync backend {backend!r}")

    def _broadcast(self, tensor: Any) -> None:
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([tensor], opts).wait()

    def send(self, named: Iterable[tuple[str, Any]], device: Any = None) -> list[TensorSpec]:
        """Rank 0: broadcast the tensors; returns their specs (send these to receivers *first*)."""
        import torch

        items = [(n, t.detach()) for n, t in named]
        dev = device or ("cuda" if self.backend == "nccl" else "cpu")
        by_name = dict(items)
        plan = bucket_plan(specs_of(items), self.bucket_bytes)
        for _, group in plan:
            flat = torch.cat([by_name[name].reshape(-1).to(dev) for name, _, _ in group])
            self._broadcast(flat)
        self.last_buckets = len(plan)
        return specs_of(items)

    def receive(self, specs: list[TensorSpec], device: Any = "cpu") -> dict[str, Any]:
        """Ranks > 0: receive the tensors described by ``specs`` (same order as the sender's)."""
        import torch

        dev = torch.device("cuda" if self.backend == "nccl" else device)
        out: dict[str, Any] = {}
        plan = bucket_plan(specs, self.bucket_bytes)
        for dtype_name, group in plan:
            dtype = getattr(torch, dtype_name)
            numel = sum(_numel(shape) for _, shape, _ in group)
            flat = torch.empty(numel, dtype=dtype, device=dev)
            self._broadcast(flat)
            offset = 0
            for name, shape, _ in group:
                n = _numel(shape)
                out[name] = flat[offset:offset + n].view(shape)
                offset += n
        self.last_buckets = len(plan)
        return out


def specs_of(items: list[tuple[str, Any]]) -> list[TensorSpec]:
    return [(n, list(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in items]


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _itemsize(dtype_name: str) -> int:
    import torch

    return int(torch.empty((), dtype=getattr(torch, dtype_name)).element_size())


def bucket_plan(specs: list[TensorSpec], bucket_bytes: int = BUCKET_BYTES) -> list[tuple[str, list[TensorSpec]]]:
    """The broadcast order both sides derive from the specs: tensors grouped by dtype (in order of
    first appearance), each dtype cut into buckets of at most ``bucket_bytes`` (a tensor larger
    than that is a bucket of its own)."""
    order: dict[str, list[TensorSpec]] = {}
    for s in specs:
        order.setdefault(s[2], []).append(s)
    plan: list[tuple[str, list[TensorSpec]]] = []
    for dtype_name, group in order.items():
        size = _itemsize(dtype_name)
        current: list[TensorSpec] = []
        used = 0
        for spec in group:
            n = _numel(spec[1]) * size
            if current and used + n > bucket_bytes:
                plan.append((dtype_name, current))
                current, used = [], 0
            current.append(spec)
            used += n
        if current:
            plan.append((dtype_name, current))
    return plan
