"""Cutting a sampled completion before a marker, in token space.

Why not cut the text and re-tokenise it: the trainer scores exactly the tokens the sampler
produced, with the logprobs it reported for them. Re-encoding the kept text can give different
tokens (BPE merges differ at the new boundary), whose logprobs nobody has. So the cut keeps a
prefix of the *sampled token ids* — the longest one whose text ends at or before the marker — and
whatever text sits between that prefix and the marker (a token straddling the boundary) is added
back as unsampled bridge text together with the tip.
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs


@attrs.define
class Cut:
    """A token-exact cut: ``kept_ids`` is a prefix of the sampled ids; ``bridge`` is the text from
    the end of the kept tokens up to the marker (usually empty)."""

    kept_ids: list[int]
    kept_logprobs: list[float | None]
    kept_text: str
    bridge: str
    marker: str | None  # the marker cut at, None when no marker was found


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False) if ids else ""


def find_marker(text: str, markers: Sequence[str]) -> tuple[int, str | None]:
    """Position of the earliest of ``markers`` in ``text`` (``len(text)``, None when none occurs)."""
    best, which = len(text), None
    for m in markers:
        i = text.find(m)
        if 0 <= i < best:
            best, which = i, m
    return best, which


def cut_before_marker(
    tokenizer: Any, ids: Sequence[int], logprobs: Sequence[float | None] | None, markers: Sequence[str]
) -> Cut:
    """Keep the longest prefix of ``ids`` whose decoded text is a prefix of the text before the
    first marker. Binary search on the prefix length (decoding is the cost), then a step back if
    a split multi-byte character makes the decoded prefix disagree with the full text."""
    ids = list(ids)
    lps = list(logprobs) if logprobs is not None and len(logprobs) == len(ids) else [None] * len(ids)
    text = _decode(tokenizer, ids)
    pos, marker = find_marker(text, markers)
    if marker is None:
        return Cut(ids, lps, text, "", None)
    target = text[:pos]
    lo, hi = 0, len(ids)  # invariant: prefix lo fits; find the largest k with len(decode(ids[:k])) <= pos
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(_decode(tokenizer, ids[:mid])) <= pos:
            lo = mid
        else:
            hi = mid - 1
    k = lo
    kept_text = _decode(tokenizer, ids[:k])
    while k > 0 and not target.startswith(kept_text):
        k -= 1
        kept_text = _decode(tokenizer, ids[:k])
    return Cut(ids[:k], lps[:k], kept_text, target[len(kept_text) :], marker)
