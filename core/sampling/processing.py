"""Per-row logits processing and sampling for a batch of requests with different parameters.

Why our own and not ``model.generate``: requests gathered into one batch each bring their own
temperature / top-k / top-p / seed, and we need the exact logprob of every sampled token under a
documented definition. Everything here is vectorised over the batch and free of host syncs once the
caller says which features the batch needs (so a decode step can be captured as a CUDA graph).

Randomness: every row carries a 64-bit seed (the request's, or one drawn for it) and draws its
``n``-th token with the uniform :func:`counter_uniforms` hashes from ``(seed, n)`` — a counter-based
generator, so a seed gives the same draw whatever batch or step it lands in, on any device, with no
generator state to carry or advance per row.

Logprob semantics (shared by every rlcore backend): the returned logprob of a sampled token is
``log_softmax(logits / temperature)[token]`` of the *model's* logits — after temperature, before
top-k / top-p / min-p truncation and without repetition penalty. That is what a trainer recomputes
with one forward pass (dividing by the same temperature), which makes importance-sampling
correction meaningful. With ``temperature == 0`` (greedy) the logprob is ``log_softmax(logits)``.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..types import SamplingParams

NEG_INF = float("-inf")


def row_tensors(params: Sequence[SamplingParams], vocab_size: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The batch's sampling parameters as column tensors ``[B, 1]`` on ``device``."""
    temps = [p.temperature for p in params]
    return {
        "temperature": torch.tensor([t if t > 0 else 1.0 for t in temps], device=device).unsqueeze(1),
        "greedy": torch.tensor([t <= 0 for t in temps], device=device),
        "top_k": torch.tensor([p.top_k if p.top_k and p.top_k > 0 else vocab_size for p in params], device=device).unsqueeze(1),
        "top_p": torch.tensor([p.top_p if 0 < p.top_p <= 1 else 1.0 for p in params], device=device).unsqueeze(1),
        "min_p": torch.tensor([max(p.min_p, 0.0) for p in params], device=device).unsqueeze(1),
        "rep": torch.tensor([p.repetition_penalty if p.repetition_penalty > 0 else 1.0 for p in params], device=device).unsqueeze(1),
    }


_M32 = 0xFFFFFFFF


def seed_words(seed: int) -> tuple[int, int]:
    """A Python int seed as the two 32-bit words :func:`counter_uniforms` takes (low, high)."""
    s = int(seed) & 0xFFFFFFFFFFFFFFFF
    return s & _M32, s >> 32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (xorshift-multiply, multipliers below 2**31 so int64 never overflows)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x6B43A9B5) & _M32
    return x ^ (x >> 16)


def counter_uniforms(seed_lo: torch.Tensor, seed_hi: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """One uniform in [0, 1) per row from its seed words and counter (int64 tensors ``[B]``), float32.

    Pure elementwise integer arithmetic: the same on every device and batch composition, and
    capturable in a CUDA graph (the counter is a tensor the graph advances)."""
    h = _mix32(seed_lo ^ 0x9E3779B9)
    h = _mix32(h ^ seed_hi)
    h = _mix32(h ^ (counter & _M32))
    h = _mix32(h ^ 0x2545F491)
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, rep: torch.Tensor) -> torch.Tensor:
    """CTRL-style penalty on tokens already in the sequence: ``seen`` is a ``[B, V]`` bool mask.
    Rows with ``rep == 1`` come out unchanged (x / 1 and x * 1 are exact)."""
    penalised = torch.where(logits > 0, logits / rep, logits * rep)
    return torch.where(seen, penalised, logits)


def needs_truncation(rows: dict[str, torch.Tensor], vocab: int) -> bool:
    """Whether any row uses top-k, top-p or min-p (a host-side check: it reads the tensors)."""
    return bool((rows["top_k"] < vocab).any() | (rows["top_p"] < 1.0).any() | (rows["min_p"] > 0).any())


def truncate(logits: torch.Tensor, rows: dict[str, torch.Tensor]) -> torch.Tensor:
    """Apply top-k, top-p (nucleus) and min-p to temperature-scaled logits; masked entries become -inf.

    Row-wise and sync-free: a row whose top_k is the vocabulary, top_p 1 and min_p 0 keeps every
    token (its top-p test is switched off rather than left to the rounding of a cumulative sum)."""
    vocab = logits.shape[-1]
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
    drop = ranks >= rows["top_k"]
    probs = torch.softmax(sorted_logits, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # mass strictly before this token
    drop |= (before >= rows["top_p"]) & (rows["top_p"] < 1.0)
    drop |= probs < rows["min_p"] * probs[:, :1]
    drop[:, 0] = False  # the most likely token always survives
    mask = torch.zeros_like(drop).scatter(1, order, drop)
    return logits.masked_fill(mask, NEG_INF)


def draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: one token per row from ``probs`` ``[B, V]`` given uniforms ``[B]`` in [0, 1)."""
    cdf = torch.cumsum(probs, dim=-1)
    u = (uniforms.to(cdf.dtype) * cdf[:, -1]).unsqueeze(1)
    idx = torch.searchsorted(cdf, u, right=True).squeeze(1)
    return idx.clamp_(max=probs.shape[-1] - 1)


def sample_step(
    logits: torch.Tensor,
    rows: dict[str, torch.Tensor],
    uniforms: torch.Tensor,
    seen: torch.Tensor | None = None,
    banned: torch.Tensor | None = None,
    *,
    truncation: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step for the whole batch: returns ``(tokens [B], logprobs [B])``.

    ``logits`` are the model's last-position logits ``[B, V]`` (any dtype; computed in float32).
    ``uniforms`` ``[B]`` drive the draws (see :func:`counter_uniforms`). ``seen`` ``[B, V]`` turns
    the repetition penalty on (rows with ``rep == 1`` are unaffected); ``banned`` ``[B, V]`` masks
    tokens that may not be sampled yet (stop tokens before ``min_tokens``). ``truncation`` says
    whether any row uses top-k/top-p/min-p; ``None`` checks (a host sync — pass it in a CUDA graph).
    """
    logits = logits.float()
    scaled = logits / rows["temperature"]
    logprobs_all = torch.log_softmax(scaled, dim=-1)
    work = scaled
    if seen is not None:
        work = apply_repetition_penalty(work, seen, rows["rep"])
    if banned is not None:
        work = work.masked_fill(banned, NEG_INF)
    if truncation is None:
        truncation = needs_truncation(rows, logits.shape[-1])
    if truncation:
        work = truncate(work, rows)
    probs = torch.softmax(work, dim=-1)
    sampled = draw(probs, uniforms.to(probs.device))
    greedy = torch.argmax(work, dim=-1)
    tokens = torch.where(rows["greedy"], greedy, sampled)
    return tokens, logprobs_all.gather(1, tokens.unsqueeze(1)).squeeze(1)
