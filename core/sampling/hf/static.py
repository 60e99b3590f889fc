"""The ``hf`` sampler's static decode path: a KV cache allocated once, decode steps as CUDA graphs.

Why: the dynamic loop (:mod:`rlcore.sampling.hf.decode`) grows its cache by concatenation and runs
every step through Python — on a GPU that is tens of milliseconds of launch overhead per step for a
model whose weights are read in a fraction of a millisecond. Here every shape is fixed, so a whole
step (sampling the next token of every row, then the forward over those tokens) is captured once as
a CUDA graph per batch-size bucket and replayed with one launch.

Layout. Every row owns a *slot* of a static cache ``[slots, kv_heads, max_len, head_dim]`` per
layer: its prompt fills columns ``0..L-1`` (no padding), and the token decoded next is written at
column ``pos[slot]``. A decode step attends over the slots' first columns with each row's own mask
(columns up to its position), so rows of any length share one step of one shape. Live rows are kept
in the lowest slots — a finished row's slot is refilled by moving the last live row into it — and a
step runs over the smallest bucket of slots covering them, and over the smallest bucket of columns
(128, 256, 512 …) covering its longest row: attention reads what the rows hold, not the whole
cache (at 256 rows of a Qwen2-0.5B shape, every 256 columns are ~400 MB of keys and values a step).

Sampling runs inside the graph from per-row tensors (temperature, top-k/p, min-p, repetition
penalty, min_tokens bans, seeds), with the same :func:`~rlcore.sampling.processing.sample_step` as the
dynamic loop; randomness is counter-based (row seed, tokens so far), so a seeded row draws the same
tokens whatever its batch, slot or bucket, and the same as on the dynamic path up to the float
rounding of the logits. The logprob of each token comes from the logits that drew it.

Host syncs. Each step's tokens and logprobs are copied to pinned host memory; the host handles
step ``t`` (the same :class:`~rlcore.sampling.stops.StopChecker` rules: stop tokens, stop strings,
max_tokens) while the GPU runs step ``t+1``. A row's finish is therefore seen one step late, and
that one extra token is discarded. Rows join between steps (prefilled together with the model's own
attention, their keys/values gathered into free slots) and leave as soon as they are seen finished.

On the CPU the same path runs eagerly (no graphs): slower there than the dynamic loop, so ``auto``
keeps the dynamic loop on CPU; it exists on CPU so that its exactness is tested everywhere.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F

from ...types import Completion
from ..batcher import BatchHandle
from .fused import FusedDecode, adapter_state, unsupported
from .decode import DecodeHost, Request, prefill, stop_checker
from ..processing import counter_uniforms, needs_truncation, row_tensors, sample_step, seed_words


log = logging.getLogger(__name__)

ATTN_NAME = "rlcore_static_decode"
_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
LEN_ALIGN = 256  # the cache length grows in steps of this many columns
COL_MIN = 128  # a step attends over the first 128, 256, 512 … columns: enough for its longest row


class NotStatic(Exception):
    """The model cannot use the static path (its cache is not plain full attention): use the dynamic one."""


def bucket(n: int) -> int:
    """The slot count a step over ``n`` live rows runs with (few distinct shapes: few graphs)."""
    for b in _BUCKETS:
        if n <= b:
            return b
    return -(-n // 64) * 64


def static_eligible(model: Any) -> str | None:
    """Why ``model`` cannot decode on the static path, or None when it can (full attention only:
    a sliding window or a recurrent layer does not fit one mask over one cache of fixed length)."""
    config = getattr(model, "config", None)
    if config is None:
        return "the model has no config"
    types = getattr(config, "layer_types", None)
    if types and any(t != "full_attention" for t in types):
        return f"layer types {sorted(set(types))} are not all full attention"
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return "the model uses sliding-window attention"
    return None


def _decode_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Attention for one new token per row against the static cache, without repeating KV heads:
    the query heads that share a KV head become that head's query rows (GQA as a batched query)."""
    b, hq, q_len, d = query.shape
    hkv = key.shape[1]
    if q_len == 1 and hq % hkv == 0:
        q = query.reshape(b, hkv, hq // hkv, d)
        out = F.scaled_dot_product_attention(q, key, value, attn_mask=attention_mask, scale=scaling)
        return out.reshape(b, hq, 1, d).transpose(1, 2).contiguous(), None
    if hq != hkv:
        key = key.repeat_interleave(hq // hkv, dim=1)
        value = value.repeat_interleave(hq // hkv, dim=1)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, _decode_attention)


class SlotCache:
    """A transformers-compatible KV cache over the static slots: each row's new key/value is written
    at that row's own column ``pos`` and attention sees the whole (masked) slot."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], rows: torch.Tensor, pos: torch.Tensor) -> None:
        self.keys, self.values, self.rows, self.pos = keys, values, rows, pos

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k[self.rows, :, self.pos] = key_states[:, :, 0].to(k.dtype)
        v[self.rows, :, self.pos] = value_states[:, :, 0].to(v.dtype)
        return k, v

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def __len__(self) -> int:
        return len(self.keys)


def _layer_kv(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer of a prefill's DynamicCache; NotStatic for anything else."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if not layers or not all(type(layer) is DynamicLayer and layer.is_initialized for layer in layers):
        raise NotStatic("the model's cache is not plain full-attention layers")
    return [(layer.keys, layer.values) for layer in layers]


class StaticEngine:
    """The static cache, the per-slot sampling state and the captured graphs. Owned by the sampler
    and kept across batches (graphs are captured once per bucket and sampling features)."""

    def __init__(self, sampler: DecodeHost, use_graphs: bool, fused: bool = True, pack: bool | None = None) -> None:
        self.s = sampler
        self.want_fused = fused
        self.pack = pack  # FusedDecode's packed projections (None: when the memory allows)
        self.fused: FusedDecode | None = None  # the few-kernel forward, when the model is one it knows
        self.fused_why: str | None = "not checked yet"
        self.fused_state: tuple = ()
        self.dev = sampler.device
        self.vocab = sampler.vocab_size
        self.use_graphs = use_graphs and self.dev.type == "cuda"
        self.cap = 0
        self.max_len = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.state: dict[str, torch.Tensor] = {}
        self.graphs: dict[tuple, Any] = {}
        self.pool: Any = None
        self.fingerprint: tuple = ()
        self.kv_shape: tuple[int, int, int, torch.dtype] | None = None
        self.captures = 0
        self.replays = 0
        self.steps_by_cols: dict[int, int] = {}  # how many steps ran over each column bucket
        # bytes of keys and values the steps' attention read, and what reading whole slots would
        # have cost (benchmarks report the ratio)
        self.kv_read_bytes = 0
        self.kv_full_bytes = 0
        _register_attention()

    # --- memory ------------------------------------------------------------------------------------
    def check_model(self) -> None:
        """Drop graphs captured against other parameter tensors (a moved, re-loaded or wrapped model)."""
        fp = tuple((p.data_ptr(), p.dtype) for p in self.s.model.parameters())
        if fp != self.fingerprint:
            self._drop_graphs()
            self.fingerprint = fp
        # the module tree (hooks, adapters, their scalings) and the forward (accelerate's autocast
        # wrapper) can change under the same tensors: decided per batch
        why = unsupported(self.s.model) if self.want_fused else "fused_decode=False"
        state = (why, vars(self.s.model).get("forward"), adapter_state(self.s.model) if why is None else ())
        if state != self.fused_state:
            if why is not None and self.want_fused:
                log.info("hf sampler: static decode runs the model's own forward (%s)", why)
            self._drop_graphs()
            self.fused_state, self.fused_why = state, why
            self.fused = FusedDecode(self.s.model, self.dev, pack=self.pack) if why is None else None
            failed = self._verify_fused() if self.fused is not None else None
            if failed is not None:
                log.warning("hf sampler: the fused decode forward is off for this model (%s); decoding with the "
                            "model's own forward", failed)
                self.fused, self.fused_why = None, f"self-check: {failed}"
        elif self.fused is not None:
            self.fused.refresh()  # the packed projections: this batch decodes with today's weights

    def _verify_fused(self) -> str | None:
        """Why the fused forward cannot be trusted with this model on this device, or None.

        One fused step over a two-row cache of real prefills, against the model's own forward of the
        same tokens: run once per model state, before any step, so a torch/transformers version whose
        kernels or module internals differ from what the fused forward assumes costs speed, never
        correctness."""
        model, dev, fused = self.s.model, self.dev, self.fused
        assert fused is not None
        seqs = [[(7 * i + 3) % self.vocab for i in range(n)] for n in (3, 6)]
        try:
            ref, kvs = [], []
            for seq in seqs:
                ref.append(model(input_ids=torch.tensor([seq], device=dev), use_cache=False).logits[0, -1].float())
                out = model(input_ids=torch.tensor([seq[:-1]], device=dev), use_cache=True)
                kvs.append(_layer_kv(getattr(out, "cache", None) or getattr(out, "past_key_values", None)))
            cols = 8
            _, hkv, _, d = kvs[0][0][0].shape
            dtype = kvs[0][0][0].dtype
            keys = [torch.zeros((2, hkv, cols, d), dtype=dtype, device=dev) for _ in kvs[0]]
            values = [torch.zeros_like(k) for k in keys]
            for j, (seq, kv) in enumerate(zip(seqs, kvs)):
                for (k, v), (kc, vc) in zip(kv, zip(keys, values)):
                    kc[j, :, : len(seq) - 1] = k[0].to(dtype)
                    vc[j, :, : len(seq) - 1] = v[0].to(dtype)
            pos = torch.tensor([len(seq) - 1 for seq in seqs], device=dev)
            mask = torch.where(torch.arange(cols, device=dev)[None] <= pos[:, None], 0.0, torch.finfo(dtype).min).to(dtype)
            tok = torch.tensor([seq[-1] for seq in seqs], device=dev)
            got = fused(tok, pos, mask[:, None, None, :], keys, values, torch.arange(2, device=dev)).float()
        except Exception as exc:  # noqa: BLE001 - a fused step that cannot run here falls back, it does not fail
            return f"its check step raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        want = torch.stack(ref)
        err, scale = (got - want).abs().max().item(), max(want.abs().max().item(), 1.0)
        half = dtype in (torch.float16, torch.bfloat16) or fused.autocast is not None
        limit = (0.05 if half else 1e-3) * scale
        if not err <= limit:  # NaN fails too
            return f"its logits differ from the model's forward by {err:.3g} (limit {limit:.3g})"
        return None

    def _drop_graphs(self) -> None:
        """Forget every captured graph, and their memory pool: a pool whose graphs are gone may still
        hold blocks (cuBLAS workspaces), and capturing into it again trips the allocator."""
        self.graphs.clear()
        self.pool = None

    def ensure(self, rows: int, length: int, kv: list[tuple[torch.Tensor, torch.Tensor]], live: int) -> None:
        """Room for ``rows`` slots of ``length`` columns with the layout of ``kv``; the first ``live``
        slots are carried over when the buffers grow (graphs over the old buffers are dropped)."""
        n_layers, (_, hkv, _, d), dtype = len(kv), kv[0][0].shape, kv[0][0].dtype
        shape = (n_layers, hkv, d, dtype)
        limit = max(rows, bucket(self.s.max_batch_size))
        if self.kv_shape == shape and rows <= self.cap and length <= self.max_len:
            return
        new_cap = max(bucket(rows), min(limit, 2 * self.cap)) if self.kv_shape == shape else bucket(rows)
        new_len = max(self.max_len if self.kv_shape == shape else 0, -(-length // LEN_ALIGN) * LEN_ALIGN)
        new_len = min(new_len, max(length, self.s.max_model_len))
        old_k, old_v, old_state = self.k, self.v, self.state
        self.k = [torch.zeros((new_cap, hkv, new_len, d), dtype=dtype, device=self.dev) for _ in range(n_layers)]
        self.v = [torch.zeros((new_cap, hkv, new_len, d), dtype=dtype, device=self.dev) for _ in range(n_layers)]
        V, dev = self.vocab, self.dev
        st = {
            "logits": torch.zeros((new_cap, V), dtype=torch.float32, device=dev),
            "temperature": torch.ones((new_cap, 1), device=dev), "greedy": torch.zeros(new_cap, dtype=torch.bool, device=dev),
            "top_k": torch.full((new_cap, 1), V, dtype=torch.long, device=dev), "top_p": torch.ones((new_cap, 1), device=dev),
            "min_p": torch.zeros((new_cap, 1), device=dev), "rep": torch.ones((new_cap, 1), device=dev),
            "seed_lo": torch.zeros(new_cap, dtype=torch.long, device=dev), "seed_hi": torch.zeros(new_cap, dtype=torch.long, device=dev),
            "n_gen": torch.zeros(new_cap, dtype=torch.long, device=dev), "pos": torch.zeros(new_cap, dtype=torch.long, device=dev),
            "min_tokens": torch.zeros(new_cap, dtype=torch.long, device=dev),
            "seen": torch.zeros((new_cap, V), dtype=torch.bool, device=dev),
            "stop_mask": torch.zeros((new_cap, V), dtype=torch.bool, device=dev),
            "out_tok": torch.zeros(new_cap, dtype=torch.long, device=dev), "out_lp": torch.zeros(new_cap, device=dev),
            # the uniform of each row's every draw, from its seed: a step gathers one instead of hashing
            "uniforms": torch.zeros((new_cap, new_len), dtype=torch.float32, device=dev),
        }
        self.cols = torch.arange(new_len, device=dev)
        if live and self.kv_shape == shape:
            old_len = self.max_len
            for new, old in zip(self.k + self.v, old_k + old_v):
                new[:live, :, :old_len] = old[:live]
            for name, t in st.items():
                if name != "uniforms":
                    t[:live] = old_state[name][:live]
            st["uniforms"][:live] = self._uniforms(st["seed_lo"][:live], st["seed_hi"][:live])
        self.state = st
        self.slot_ids = torch.arange(new_cap, device=dev)
        self.neg = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=dev)
        self.cap, self.max_len, self.kv_shape = new_cap, new_len, shape
        self._drop_graphs()
        if self.dev.type == "cuda":
            self.h_tok = [torch.zeros(new_cap, dtype=torch.long, pin_memory=True) for _ in range(2)]
            self.h_lp = [torch.zeros(new_cap, dtype=torch.float32, pin_memory=True) for _ in range(2)]
            self.events = [torch.cuda.Event() for _ in range(2)]

    def fill(self, slots: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]], lens: list[int],
             logits: torch.Tensor, rows: dict[str, torch.Tensor], seeds: list[tuple[int, int]],
             min_tokens: list[int], seen: torch.Tensor | None, stop_ids: list[list[int]]) -> None:
        """Write a prefilled group (left-padded to a common length) into ``slots``."""
        idx = torch.tensor(slots, device=self.dev)
        n, L = len(slots), kv[0][0].shape[2]
        # column c of row j comes from padded column c + (L - len_j): the real tokens, left-aligned
        shift = torch.tensor([L - x for x in lens], device=self.dev)
        src = (torch.arange(L, device=self.dev).unsqueeze(0) + shift.unsqueeze(1)).clamp_(max=L - 1)
        for (k, v), (ks, vs) in zip(zip(self.k, self.v), kv):
            gidx = src[:, None, :, None].expand(n, ks.shape[1], L, ks.shape[3])
            k[idx, :, :L] = torch.gather(ks, 2, gidx).to(k.dtype)
            v[idx, :, :L] = torch.gather(vs, 2, gidx).to(v.dtype)
        st = self.state
        st["logits"][idx] = logits.float()
        for name in ("temperature", "greedy", "top_k", "top_p", "min_p", "rep"):
            st[name][idx] = rows[name].to(st[name].dtype)
        lo = torch.tensor([s[0] for s in seeds], device=self.dev)
        hi = torch.tensor([s[1] for s in seeds], device=self.dev)
        st["seed_lo"][idx], st["seed_hi"][idx] = lo, hi
        st["uniforms"][idx] = self._uniforms(lo, hi)
        st["n_gen"][idx] = 0
        st["pos"][idx] = torch.tensor(lens, device=self.dev)
        st["min_tokens"][idx] = torch.tensor(min_tokens, device=self.dev)
        st["seen"][idx] = seen if seen is not None else False
        mask = torch.zeros((n, self.vocab), dtype=torch.bool)
        for j, ids in enumerate(stop_ids):
            ids = [t for t in ids if 0 <= t < self.vocab]
            if ids:
                mask[j, ids] = True
        st["stop_mask"][idx] = mask.to(self.dev)

    def move(self, src: list[int], dst: list[int]) -> None:
        """Copy whole slots ``src`` into ``dst`` (compaction after rows leave)."""
        s, d = torch.tensor(src, device=self.dev), torch.tensor(dst, device=self.dev)
        for t in self.k + self.v + list(self.state.values()):
            t[d] = t[s]

    def col_bucket(self, need: int) -> int:
        """The columns a step attends over when its longest row needs ``need``: ``COL_MIN`` doubled
        until it covers them, at most the cache length (few distinct shapes: few graphs)."""
        c = COL_MIN
        while c < need:
            c *= 2
        return min(c, self.max_len)

    def _uniforms(self, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        """``[n, max_len]``: draw ``t`` of each row (seed words ``lo``/``hi`` ``[n]``) at column ``t``,
        the same :func:`counter_uniforms` the dynamic loop hashes step by step."""
        return counter_uniforms(lo.unsqueeze(1), hi.unsqueeze(1), self.cols.unsqueeze(0))

    # --- one step ----------------------------------------------------------------------------------
    def _step(self, b: int, cols: int, flags: tuple[bool, bool, bool]) -> None:
        """Sample the next token of slots ``[:b]`` from their logits, then run the forward over it,
        attending over the first ``cols`` columns. Sync-free (captured as a graph on CUDA)."""
        rep, ban, trunc = flags
        st = self.state
        rows = {k: st[k][:b] for k in ("temperature", "greedy", "top_k", "top_p", "min_p", "rep")}
        n_gen = st["n_gen"][:b]
        # junk slots inside the bucket may count past the table: clamped (their draws are discarded)
        u = st["uniforms"][:b].gather(1, n_gen.clamp(max=self.max_len - 1).unsqueeze(1)).squeeze(1)
        banned = st["stop_mask"][:b] & (n_gen < st["min_tokens"][:b]).unsqueeze(1) if ban else None
        seen = st["seen"][:b] if rep else None
        tok, lp = sample_step(st["logits"][:b], rows, u, seen, banned, truncation=trunc)
        st["out_tok"][:b].copy_(tok)
        st["out_lp"][:b].copy_(lp)
        n_gen.add_(1)
        if rep:
            st["seen"][:b].scatter_(1, tok.unsqueeze(1), True)
        # free slots inside the bucket decode junk; clamp keeps their writes inside their own slot and
        # inside the columns attended (a live row's position is always below ``cols``)
        pos = st["pos"][:b].clamp(max=cols - 1)
        mask = torch.where(self.cols[:cols].unsqueeze(0) <= pos.unsqueeze(1), 0.0, self.neg).to(self.neg.dtype)
        keys, values = [k[:b, :, :cols] for k in self.k], [v[:b, :, :cols] for v in self.v]
        if self.fused is not None:
            logits = self.fused(tok, pos, mask[:, None, None, :], keys, values, self.slot_ids[:b])
        else:
            cache = SlotCache(keys, values, self.slot_ids[:b], pos)
            logits = self.s.model(input_ids=tok.unsqueeze(1), attention_mask=mask[:, None, None, :],
                                  position_ids=pos.unsqueeze(1), use_cache=True, **{self.s.cache_kwarg: cache}).logits[:, -1]
        st["logits"][:b].copy_(logits)
        st["pos"][:b].add_(1)

    def step(self, b: int, cols: int, flags: tuple[bool, bool, bool]) -> None:
        """One step over slots ``[:b]`` and columns ``[:cols]``: a graph replay when captured, else
        eager (and capture it)."""
        self.steps_by_cols[cols] = self.steps_by_cols.get(cols, 0) + 1
        per_col = 2 * len(self.k) * b * self.k[0].shape[1] * self.k[0].shape[3] * self.k[0].element_size()
        self.kv_read_bytes += per_col * cols
        self.kv_full_bytes += per_col * self.max_len
        key = (b, cols, flags)
        graph = self.graphs.get(key)
        if graph is not None:
            graph.replay()
            self.replays += 1
            return
        with self._attention(), _no_autocast_cache():
            if not self.use_graphs:
                self._step(b, cols, flags)
                return
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._step(b, cols, flags)  # the real step, and the warm-up the capture needs
            torch.cuda.current_stream().wait_stream(side)
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                    self._step(b, cols, flags)  # recorded, not run
            except Exception as exc:  # noqa: BLE001 - an uncapturable model still decodes, eagerly
                log.warning("hf sampler: decode step could not be captured as a CUDA graph (%s: %s); decoding eagerly",
                            type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
                self.use_graphs = False  # one failed capture is enough: the rest of this sampler runs eagerly
                return
            self.graphs[key] = graph
            self.captures += 1

    def _attention(self) -> Any:
        """Route the model's attention to :func:`_decode_attention` while a step is traced or run."""
        import contextlib

        config = self.s.model.config

        @contextlib.contextmanager
        def ctx() -> Any:
            old = config._attn_implementation
            config._attn_implementation = ATTN_NAME
            try:
                yield
            finally:
                config._attn_implementation = old

        return ctx()


def _no_autocast_cache() -> Any:
    """Autocast's weight-cast cache would keep casts made outside the graph (stale after an optimizer
    step, freed after the region): casts must happen inside every step."""
    import contextlib

    @contextlib.contextmanager
    def ctx() -> Any:
        prev = torch.is_autocast_cache_enabled()
        torch.set_autocast_cache_enabled(False)
        try:
            yield
        finally:
            torch.set_autocast_cache_enabled(prev)

    return ctx()


class StaticDecoder:
    """Decodes one streaming batch of :class:`~rlcore.sampling.hf.sampler.HFSampler` requests on the static path."""

    def __init__(self, sampler: DecodeHost, handle: BatchHandle[Request], engine: StaticEngine) -> None:
        self.s = sampler
        self.handle = handle
        self.e = engine
        self.dev = sampler.device
        self.live: list[int] = []  # handle index of the row in each slot, slots 0..n-1
        self.checkers: dict[int, StopChecker] = {}
        self.params: dict[int, Any] = {}
        self.issued: dict[int, int] = {}  # steps launched with the row in them
        self.lens: dict[int, int] = {}  # prompt length: a row's next column is lens + issued
        self.meta: dict[int, dict[str, Any]] = {}
        self.step = 0
        self.flags: tuple[bool, bool, bool] = (False, False, False)
        self.k = 0  # which pinned buffer the next step's tokens go to

    # --- rows joining ----------------------------------------------------------------------------
    def admit(self, indices: list[int]) -> None:
        """Prefill requests ``indices`` with the model's own attention and put them in free slots."""
        reqs = [self.handle.items[i][0] for i in indices]
        params = [r.params for r in reqs]
        n = len(reqs)
        out, ids, attn, lens = prefill(self.s, reqs, self.dev)
        kv = _layer_kv(getattr(out, "cache", None) or getattr(out, "past_key_values", None))
        checkers = []
        for j, (i, p) in enumerate(zip(indices, params)):
            c = stop_checker(self.s, p, lens[j])
            checkers.append(c)
        need = max(lens[j] + checkers[j].max_tokens for j in range(n))
        first = len(self.live)
        self.e.ensure(first + n, need, kv, first)
        seen = None
        if any(p.repetition_penalty != 1.0 for p in params):
            seen = torch.zeros((n, self.s.vocab_size), dtype=torch.bool, device=self.dev)
            seen.scatter_(1, ids, attn.bool())
        self.e.fill(
            list(range(first, first + n)), kv, lens, out.logits[:, -1, :], row_tensors(params, self.s.vocab_size, self.dev),
            [seed_words(p.seed if p.seed is not None else self.s.draw_seed()) for p in params],
            [p.min_tokens for p in params], seen, [sorted(c.stop_token_ids) for c in checkers],
        )
        for j, (i, p) in enumerate(zip(indices, params)):
            self.checkers[i], self.params[i], self.issued[i], self.lens[i] = checkers[j], p, 0, lens[j]
            self.meta[i] = {"prompt_tokens": lens[j], "batch_size": first + n, "joined_at_step": self.step,
                            "decode": "cuda_graph" if self.e.use_graphs else "static",
                            "forward": "fused" if self.e.fused is not None else "model"}
        self.live += indices
        self._set_flags()

    def _set_flags(self) -> None:
        ps = [self.params[i] for i in self.live]
        rows = row_tensors(ps, self.s.vocab_size, torch.device("cpu")) if ps else None
        self.flags = (
            any(p.repetition_penalty != 1.0 for p in ps),
            any(p.min_tokens > 0 for p in ps),
            bool(rows is not None and needs_truncation(rows, self.s.vocab_size)),
        )

    def _maybe_admit(self, free: int) -> None:
        """As the dynamic loop: gather joiners until they fill the free rows or the oldest waited."""
        joined = self.handle.admit_joiners(free, self.s.join_window_s)
        if joined:
            self.admit(joined)

    # --- the loop ----------------------------------------------------------------------------------
    def run(self) -> list[tuple[int, Completion]]:
        """Decode until every row is done; returns the completions of the last rows to finish (the
        caller answers them after restoring the model's mode, as the dynamic loop does)."""
        self.e.check_model()
        self.admit(list(range(len(self.handle.items))))
        limit = self.s.max_batch_size
        pending: tuple | None = None
        while True:
            launched = self._launch()
            if pending is not None:
                finished = self._process(pending)
                if finished:
                    self._leave({i for i, _ in finished})
                    if not self.live:
                        return finished  # a step still in flight holds only discarded extra tokens
                    for i, completion in finished:
                        self.handle.finish(i, completion)
            pending = launched
            if pending is None and not self.live:
                return []
            if len(self.live) < limit:
                self._maybe_admit(limit - len(self.live))

    def _launch(self) -> tuple | None:
        """Enqueue one step over the live rows (unless every one already has all its tokens in flight)."""
        if not self.live or all(self.issued[i] >= self.checkers[i].max_tokens for i in self.live):
            return None
        n = len(self.live)
        need = 0  # the longest row writes at column lens + issued and attends up to it
        for i in self.live:
            need = max(need, self.lens[i] + self.issued[i] + 1)
            self.issued[i] += 1
        self.e.step(bucket(n), self.e.col_bucket(need), self.flags)
        self.step += 1
        st = self.e.state
        if self.dev.type == "cuda":
            k, self.k = self.k, 1 - self.k
            # the buffers themselves travel with the step: a growing engine replaces its own
            h_tok, h_lp, event = self.e.h_tok[k], self.e.h_lp[k], self.e.events[k]
            h_tok[:n].copy_(st["out_tok"][:n], non_blocking=True)
            h_lp[:n].copy_(st["out_lp"][:n], non_blocking=True)
            event.record()
            return (h_tok, h_lp, event, list(self.live))
        return (st["out_tok"][:n].tolist(), st["out_lp"][:n].tolist(), list(self.live))

    def _process(self, pending: tuple) -> list[tuple[int, Completion]]:
        """Hand one finished step's tokens to the rows' stop checkers; the rows now done."""
        if len(pending) == 4:
            h_tok, h_lp, event, rows = pending
            event.synchronize()
            toks, lps = h_tok[: len(rows)].tolist(), h_lp[: len(rows)].tolist()
        else:
            toks, lps, rows = pending
        done = []
        for j, i in enumerate(rows):
            c = self.checkers[i]
            if c.done:  # finished at an earlier step: this token is the discarded extra one
                continue
            if c.add(toks[j], lps[j]):
                done.append((i, self._completion(i)))
        return done

    def _leave(self, gone: set[int]) -> None:
        """Drop finished rows, moving the last live rows into their slots (live rows stay lowest)."""
        n_new = len(self.live) - len(gone)
        holes = [s for s in range(n_new) if self.live[s] in gone]
        srcs = [s for s in range(n_new, len(self.live)) if self.live[s] not in gone]
        if holes:
            self.e.move(srcs, holes)
            for h, s in zip(holes, srcs):
                self.live[h] = self.live[s]
        self.live = self.live[:n_new]
        self._set_flags()

    def _completion(self, i: int) -> Completion:
        c = self.checkers[i]
        meta = {"policy_version": self.s.policy_version, "stop": c.matched_stop, **self.meta[i]}
        return Completion(token_ids=c.token_ids, logprobs=c.logprobs, finish_reason=c.finish_reason or "length",
                          text=c.text(), meta=meta)
