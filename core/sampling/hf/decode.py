"""The ``hf`` sampler's decode loop: one left-padded batch over a KV cache that rows join and leave.

Why rows join and leave: in a rollout, trajectories ask for their next turn at different times. A
row that finishes is answered at once (its trajectory goes on to the env step) and dropped from
the cache; requests that arrive while the batch decodes are prefilled and merged into it at the
next step (their cache is left-padded to the batch's length, or the batch's to theirs), instead
of waiting for the longest completion of the batch. Positions come from the attention mask, so
padding never shifts a row, and every row keeps its own sampling parameters and seed.

What a join costs, and why joiners are gathered: admitting is one prefill forward (all joiners
together, as one left-padded batch) plus one concatenation of the cache along the batch axis — the
same order of work as a decode step, whose ``DynamicLayer.update`` already copies the cache. When
requests trickle in (env steps of uneven latency finish a few ms apart), admitting each at the next
step means one extra forward per step; so joiners wait until ``join_window_s`` has passed since the
oldest arrived, or until they fill every free row, and are prefilled together. Columns that became
padding for every row (the rows that owned them left) are trimmed, so a batch that lives for a whole
rollout keeps a cache as long as its longest live row, not as long as the rollout.

Why the cache grows into slack: ``DynamicLayer.update`` concatenates, so every decode step copied
every layer's whole cache once more (on SmolLM2-135M at 64 rows, ~12 % of a CPU step). A plain
full-attention layer of the batch becomes a :class:`SlackLayer` after prefill: its keys and values
are views of buffers with ``SLACK`` spare columns, and a step writes its one column in place. The
buffers are reallocated (one copy, as before) only when the slack runs out or when the decoder
replaced the tensors itself (a join, rows leaving, a trim). The values attended over are the same.
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs
import torch
import torch.nn.functional as F

from ...types import Completion, SamplingParams
from ..batcher import BatchHandle
from ..processing import counter_uniforms, row_tensors, sample_step, seed_words
from ..stops import StopChecker



@attrs.define
class Request:
    """One queued ``generate`` call: the prompt's token ids and its sampling parameters."""

    prompt_ids: list[int]
    params: SamplingParams


class DecodeHost(Protocol):
    """What a decode loop needs from the sampler that owns it (:class:`~rlcore.sampling.hf.sampler.HFSampler`
    is one): the model and its limits, the batch size, and two calls. The loops see nothing else, so
    they import no sampler module and a sampler's internals can change without them."""

    model: Any
    tokenizer: Any
    device: torch.device
    vocab_size: int
    pad_token_id: int
    max_model_len: int
    default_stop_token_ids: list[int]
    cache_kwarg: str  # the forward's KV-cache argument: ``cache`` (transformers 5) or ``past_key_values``
    join_window_s: float
    policy_version: int
    prefill_dedup: bool  # prefill identical prompts once (set False when the model's cache cannot repeat rows)

    @property
    def max_batch_size(self) -> int: ...

    def set_threads_for(self, tokens: int) -> None: ...

    def draw_seed(self) -> int: ...



def prefill(sampler: DecodeHost, reqs: list[Request], dev: torch.device) -> tuple[Any, torch.Tensor, torch.Tensor, list[int]]:
    """One left-padded forward over the prompts of ``reqs`` (both decode paths admit rows with it):
    the model output (cache, last-position logits), the padded ids, the attention mask, the prompt lengths.

    Identical prompts — a GRPO group's generations arrive as ``num_generations`` copies of one
    prompt — are run once and their cache rows and logits repeated (plain full-attention and
    sliding-window layers, whose batch rows are independent; for any other cache the forward runs
    over every row, and the sampler remembers not to try again)."""
    lens = [len(r.prompt_ids) for r in reqs]
    first: dict[tuple[int, ...], int] = {}
    owner = [first.setdefault(tuple(r.prompt_ids), len(first)) for r in reqs]
    if len(first) < len(reqs) and getattr(sampler, "prefill_dedup", True):
        unique = [list(p) for p in first]
        out, ids, attn = _prefill(sampler, unique, dev)
        cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        if _rows_independent(cache):
            idx = torch.tensor(owner, device=dev)
            cache.batch_select_indices(idx)
            out.logits = out.logits[idx]
            return out, ids[idx], attn[idx], lens
        sampler.prefill_dedup = False  # type: ignore[misc]
    out, ids, attn = _prefill(sampler, [r.prompt_ids for r in reqs], dev)
    return out, ids, attn, lens


def _prefill(sampler: DecodeHost, prompts: list[list[int]], dev: torch.device) -> tuple[Any, torch.Tensor, torch.Tensor]:
    lens = [len(p) for p in prompts]
    n, L = len(prompts), max(lens)
    ids = torch.full((n, L), sampler.pad_token_id, dtype=torch.long)
    attn = torch.zeros((n, L), dtype=torch.long)
    for j, p in enumerate(prompts):
        ids[j, L - lens[j]:] = torch.tensor(p, dtype=torch.long)
        attn[j, L - lens[j]:] = 1
    ids, attn = ids.to(dev), attn.to(dev)
    sampler.set_threads_for(int(attn.sum()))
    out = sampler.model(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp_(min=0),
                        use_cache=True, logits_to_keep=1)
    return out, ids, attn


def _rows_independent(cache: Any) -> bool:
    """Whether repeating a cache's batch rows repeats exactly what a forward over the repeated
    prompts would have cached: layers whose state is per-row keys and values only."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) and layer.is_initialized
                                for layer in layers)


def stop_checker(sampler: DecodeHost, params: SamplingParams, prompt_len: int) -> StopChecker:
    """The stop rules of one request, its token budget cut to what the context window leaves."""
    return StopChecker(
        sampler.tokenizer, max_tokens=min(params.max_tokens, sampler.max_model_len - prompt_len),
        stop_token_ids=params.stop_token_ids or sampler.default_stop_token_ids, stop=params.stop, min_tokens=params.min_tokens,
    )

#: spare cache columns a :class:`SlackLayer` reserves each time it (re)allocates
SLACK = 64


def _slack_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class SlackLayer(DynamicLayer):
        """A full-attention ``DynamicLayer`` whose update writes into spare columns instead of
        concatenating (see the module docstring). Anything that replaces ``keys``/``values`` (the
        decoder's merge, drop and trim, ``DynamicLayer``'s own crop or batch selection) is seen at
        the next update, which then copies into fresh buffers."""

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized or self.keys.dim() != key_states.dim():
                return super().update(key_states, value_states, *args, **kwargs)
            n, add = self.keys.shape[-2], key_states.shape[-2]
            slack = getattr(self, "_slack", None)
            if slack is None or slack[2] is not self.keys or slack[3] is not self.values or n + add > slack[0].shape[-2]:
                shape = (*self.keys.shape[:-2], n + add + SLACK, self.keys.shape[-1])
                kbuf, vbuf = self.keys.new_empty(shape), self.values.new_empty(shape[:-1] + self.values.shape[-1:])
                kbuf[..., :n, :] = self.keys
                vbuf[..., :n, :] = self.values
            else:
                kbuf, vbuf = slack[0], slack[1]
            kbuf[..., n:n + add, :] = key_states
            vbuf[..., n:n + add, :] = value_states
            self.keys, self.values = kbuf[..., :n + add, :], vbuf[..., :n + add, :]
            self._slack = (kbuf, vbuf, self.keys, self.values)
            return self.keys, self.values

    return SlackLayer


_SLACK_LAYER: type | None = None


def slack_layer() -> type:
    """The :class:`SlackLayer` class (built on first use: transformers is imported lazily)."""
    global _SLACK_LAYER
    if _SLACK_LAYER is None:
        _SLACK_LAYER = _slack_layer_class()
    return _SLACK_LAYER


def _can_merge(cache: Any) -> bool:
    """Only plain full-attention dynamic layers can be padded and concatenated safely."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    plain = (DynamicLayer, slack_layer())
    return bool(layers) and all(type(layer) in plain and layer.is_initialized for layer in layers)


def _use_slack(cache: Any) -> None:
    """Turn a prefill's plain full-attention layers into :class:`SlackLayer` (same state, in place)."""
    if _can_merge(cache):
        cls = slack_layer()
        for layer in cache.layers:
            layer.__class__ = cls


def _left_pad(t: torch.Tensor, pad: int, dim: int) -> torch.Tensor:
    if pad <= 0:
        return t
    spec = [0, 0] * (t.dim() - 1 - (dim % t.dim())) + [pad, 0]
    return F.pad(t, spec)


class Decoder:
    """Decodes one streaming batch of :class:`~rlcore.sampling.hf.sampler.HFSampler` requests."""

    def __init__(self, sampler: DecodeHost, handle: BatchHandle[Request]) -> None:
        self.s = sampler
        self.handle = handle
        self.dev = sampler.device
        self.vocab = sampler.vocab_size
        self.active: list[int] = []  # handle indices of the rows, in row order
        self.checkers: dict[int, StopChecker] = {}
        self.seeds: dict[int, tuple[int, int]] = {}  # per row: seed words for counter_uniforms
        self.meta: dict[int, dict[str, Any]] = {}
        self.attn: torch.Tensor | None = None
        self.cache: Any = None
        self.logits: torch.Tensor | None = None
        self.rows: dict[str, torch.Tensor] = {}
        self.seen: torch.Tensor | None = None
        self.stop_mask: torch.Tensor | None = None
        self.step = 0
        self.plain_cache = False  # full-attention dynamic layers only: safe to merge and trim

    # --- rows joining ----------------------------------------------------------------------------
    def admit(self, indices: list[int]) -> None:
        """Prefill requests ``indices`` and merge them into the running batch."""
        reqs = [self.handle.items[i][0] for i in indices]
        params = [r.params for r in reqs]
        n = len(reqs)
        out, ids, attn, lens = prefill(self.s, reqs, self.dev)
        cache, logits = _cache_of(out), out.logits[:, -1, :]
        if self.attn is None:  # the batch's own cache (joiners' layers are concatenated into it)
            _use_slack(cache)
        rows = row_tensors(params, self.vocab, self.dev)
        seen = stop_mask = None
        if any(p.repetition_penalty != 1.0 for p in params) or self.seen is not None:
            seen = torch.zeros((n, self.vocab), dtype=torch.bool, device=self.dev)
            seen.scatter_(1, ids, attn.bool())
        for j, (i, r, p) in enumerate(zip(indices, reqs, params)):
            self.checkers[i] = stop_checker(self.s, p, lens[j])
            self.seeds[i] = seed_words(p.seed if p.seed is not None else self.s.draw_seed())
            self.meta[i] = {"prompt_tokens": lens[j], "batch_size": len(self.active) + n, "joined_at_step": self.step}
        if any(p.min_tokens > 0 for p in params) or self.stop_mask is not None:
            stop_mask = torch.zeros((n, self.vocab), dtype=torch.bool, device=self.dev)
            for j, i in enumerate(indices):
                stop_mask[j, [t for t in self.checkers[i].stop_token_ids if 0 <= t < self.vocab]] = True

        if self.attn is None:
            self.attn, self.cache, self.logits, self.rows, self.seen, self.stop_mask = attn, cache, logits, rows, seen, stop_mask
        else:
            self._merge(attn, cache, logits, rows, seen, stop_mask)
        self.active += indices

    def _merge(self, attn: torch.Tensor, cache: Any, logits: torch.Tensor, rows: dict[str, torch.Tensor],
               seen: torch.Tensor | None, stop_mask: torch.Tensor | None) -> None:
        assert self.attn is not None and self.logits is not None
        T = max(self.attn.shape[1], attn.shape[1])
        pad_old, pad_new = T - self.attn.shape[1], T - attn.shape[1]
        self.attn = torch.cat([_left_pad(self.attn, pad_old, 1), _left_pad(attn, pad_new, 1)], 0)
        for old, new in zip(self.cache.layers, cache.layers):
            old.keys = torch.cat([_left_pad(old.keys, pad_old, -2), _left_pad(new.keys, pad_new, -2)], 0)
            old.values = torch.cat([_left_pad(old.values, pad_old, -2), _left_pad(new.values, pad_new, -2)], 0)
        self.logits = torch.cat([self.logits, logits], 0)
        self.rows = {k: torch.cat([v, rows[k]], 0) for k, v in self.rows.items()}
        self.seen = self._cat_optional(self.seen, seen, len(self.active), attn.shape[0])
        self.stop_mask = self._cat_optional(self.stop_mask, stop_mask, len(self.active), attn.shape[0])

    def _cat_optional(self, old: torch.Tensor | None, new: torch.Tensor | None, n_old: int, n_new: int) -> torch.Tensor | None:
        if old is None and new is None:
            return None
        old = old if old is not None else torch.zeros((n_old, self.vocab), dtype=torch.bool, device=self.dev)
        new = new if new is not None else torch.zeros((n_new, self.vocab), dtype=torch.bool, device=self.dev)
        return torch.cat([old, new], 0)

    # --- the loop ----------------------------------------------------------------------------------
    def run(self) -> list[tuple[int, Completion]]:
        """Decode until every row is done. Rows that finish while others still decode are answered
        at once; those of the last step are returned, for the caller to answer after restoring the
        model's mode (a shared trainer module must be back in its own mode when the last waiter wakes)."""
        self.admit(list(range(len(self.handle.items))))
        can_join = self.plain_cache = _can_merge(self.cache)
        limit = self.s.max_batch_size
        while self.active:
            if can_join and len(self.active) < limit:
                self._maybe_admit(limit - len(self.active))
            tokens, lps = self._sample()
            self.step += 1
            tok_list, lp_list = tokens.tolist(), lps.tolist()
            keep, done = [], []
            for j, i in enumerate(self.active):
                (done if self.checkers[i].add(tok_list[j], lp_list[j]) else keep).append(j)
            finished = [(self.active[j], self._completion(self.active[j])) for j in done]
            if not keep:
                return finished
            for i, completion in finished:
                self.handle.finish(i, completion)
            if len(keep) < len(self.active):
                tokens = self._drop(keep, tokens)
            self._forward(tokens)
        return []

    def _maybe_admit(self, free: int) -> None:
        """Admit queued requests as one prefill once they fill the free rows or the oldest has
        waited ``join_window_s`` (see the module docstring for why not one by one)."""
        joined = self.handle.admit_joiners(free, self.s.join_window_s)
        if joined:
            self.admit(joined)

    def _sample(self) -> tuple[torch.Tensor, torch.Tensor]:
        banned = None
        if self.stop_mask is not None:
            below = [len(self.checkers[i].token_ids) < self.checkers[i].min_tokens for i in self.active]
            banned = self.stop_mask & torch.tensor(below, device=self.dev).unsqueeze(1)
        lo, hi = (torch.tensor([self.seeds[i][k] for i in self.active]) for k in (0, 1))
        uniforms = counter_uniforms(lo, hi, torch.tensor([len(self.checkers[i].token_ids) for i in self.active]))
        assert self.logits is not None
        return sample_step(self.logits, self.rows, uniforms, self.seen, banned)

    def _drop(self, keep: list[int], tokens: torch.Tensor) -> torch.Tensor:
        """Remove finished rows from every tensor and the KV cache."""
        idx = torch.tensor(keep, device=self.dev)
        assert self.attn is not None
        self.attn = self.attn[idx]
        self.rows = {k: v[idx] for k, v in self.rows.items()}
        if self.seen is not None:
            self.seen = self.seen[idx]
        if self.stop_mask is not None:
            self.stop_mask = self.stop_mask[idx]
        self.cache.batch_select_indices(idx)
        self.active = [self.active[j] for j in keep]
        self._trim()
        return tokens[idx]

    def _trim(self) -> None:
        """Drop leading columns that are padding in every remaining row."""
        assert self.attn is not None
        if not self.plain_cache:
            return
        first = int(self.attn.any(0).to(torch.int8).argmax())
        if first <= 0:
            return
        self.attn = self.attn[:, first:]
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]

    def _forward(self, tokens: torch.Tensor) -> None:
        assert self.attn is not None
        if self.seen is not None:
            self.seen.scatter_(1, tokens.unsqueeze(1), True)
        position_ids = self.attn.sum(-1, keepdim=True)
        self.attn = torch.cat([self.attn, torch.ones((len(self.active), 1), dtype=self.attn.dtype, device=self.dev)], 1)
        self.s.set_threads_for(len(self.active))
        out = self.s.model(input_ids=tokens.unsqueeze(1), attention_mask=self.attn, position_ids=position_ids,
                           use_cache=True, **{self.s.cache_kwarg: self.cache})
        self.cache, self.logits = _cache_of(out), out.logits[:, -1, :]

    def _completion(self, i: int) -> Completion:
        c = self.checkers[i]
        assert self.attn is not None  # padded_len: the cache columns this row carried at the end
        meta = {"policy_version": self.s.policy_version, "stop": c.matched_stop, "padded_len": int(self.attn.shape[1]),
                **self.meta[i]}
        return Completion(token_ids=c.token_ids, logprobs=c.logprobs, finish_reason=c.finish_reason or "length",
                          text=c.text(), meta=meta)


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)
