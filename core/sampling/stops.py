"""When a sequence stops, and what its text is — the same rules for every backend that decodes itself.

Rules (vLLM's defaults, so backends agree): a stop token id ends the completion and *is kept* in
``token_ids`` (with its logprob — the trainer must learn to emit it) but not in ``text``. A stop
string ends the completion at the token that completed it; ``token_ids`` keep every sampled token
(token-in/token-out: the trainer scores exactly what was sampled) and ``text`` is cut before the
stop string. Reaching ``max_tokens`` finishes with ``"length"``.
"""

from __future__ import annotations

from typing import Any, Iterable

from ..chat_template import decoder


class StopChecker:
    """Tracks one request's generated tokens and decides when it is finished."""

    def __init__(
        self,
        tokenizer: Any,
        max_tokens: int,
        stop_token_ids: Iterable[int] = (),
        stop: Iterable[str] = (),
        min_tokens: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.stop_token_ids = frozenset(int(t) for t in stop_token_ids)
        self.stop = [s for s in stop if s]
        self.min_tokens = min_tokens
        # a stop string of L characters is spanned by at most L (+ a few partial-byte) tokens
        self._window = max((len(s) for s in self.stop), default=0) + 4
        self._decode = decoder(tokenizer) if self.stop and tokenizer is not None else None
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.finish_reason: str | None = None
        self.matched_stop: str | int | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def add(self, token_id: int, logprob: float) -> bool:
        """Record one sampled token; returns True when the sequence is now finished."""
        self.token_ids.append(int(token_id))
        self.logprobs.append(float(logprob))
        n = len(self.token_ids)
        if n > self.min_tokens:
            if token_id in self.stop_token_ids:
                self.finish_reason, self.matched_stop = "stop", int(token_id)
                return True
            if self._decode is not None:
                tail = self._decode(self.token_ids[-self._window:])
                for s in self.stop:
                    if s in tail:
                        self.finish_reason, self.matched_stop = "stop", s
                        return True
        if n >= self.max_tokens:
            self.finish_reason = "length"
            return True
        return False

    def text(self) -> str:
        """The completion's text: without a final stop token, cut before a matched stop string."""
        if self.tokenizer is None:
            return ""
        ids = self.token_ids
        if isinstance(self.matched_stop, int) and ids and ids[-1] == self.matched_stop:
            ids = ids[:-1]
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        if isinstance(self.matched_stop, str):
            cut = text.find(self.matched_stop)
            if cut >= 0:
                text = text[:cut]
        return text


def default_stop_ids(tokenizer: Any, model: Any = None) -> list[int]:
    """The tokenizer's eos plus the model's generation-config eos ids: what ends a turn by default."""
    ids: list[int] = []
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if isinstance(eos, int):
        ids.append(eos)
    gen = getattr(model, "generation_config", None)
    g_eos = getattr(gen, "eos_token_id", None)
    if isinstance(g_eos, int):
        g_eos = [g_eos]
    for t in g_eos or []:
        if isinstance(t, int) and t not in ids:
            ids.append(t)
    return ids
