"""``ScriptedSampler``: a sampler test double that answers with given texts / token ids.

Scheduler, env and trainer tests need turns whose content they control (an action the env
understands, a tool call, a wrong answer) without depending on what a random tiny model emits.
This sampler implements the full :class:`rlcore.sampling.Sampler` protocol and applies the same
stop rules as the real backends (:class:`rlcore.sampling.stops.StopChecker`: ``max_tokens`` →
"length", stop token ids kept in ``token_ids``, stop strings cut from ``text``), so what a test
sees is what a real backend would have returned for those tokens. Logprobs are fake but
consistent: negative, deterministic in (prompt, position, token), one per token.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any, Callable, Iterable, Sequence, Union

from ..errors import SamplerError
from ..sampling.base import Sampler, WeightsLike
from ..sampling.stops import StopChecker, default_stop_ids
from ..types import Completion, SamplingParams

Response = Union[str, Sequence[int], Completion]
Responder = Callable[[list[int], SamplingParams, int], Response]


def fake_logprob(prompt_ids: Sequence[int], position: int, token_id: int) -> float:
    """A deterministic stand-in logprob in [-3.0, -0.01]: same inputs, same value."""
    h = hashlib.blake2b(f"{len(prompt_ids)}:{prompt_ids[-1] if prompt_ids else -1}:{position}:{token_id}".encode(), digest_size=4)
    return -0.01 - (int.from_bytes(h.digest(), "little") % 10_000) / 10_000 * 2.99


class ScriptedSampler(Sampler):
    """Returns scripted completions in call order (cycling), or whatever ``respond`` computes.

    Args:
        responses: texts (encoded with ``tokenizer``), token-id lists, or ready ``Completion``\\ s.
        tokenizer: needed for text responses and for ``text`` of token responses.
        respond: ``respond(prompt_ids, params, call_index) -> response`` instead of ``responses``.
        append_eos: end text responses with the tokenizer's eos (a finished turn, "stop").
        delay: seconds each call waits (lets concurrency and timeout tests overlap calls).
        fail_on: call indices (0-based) that raise a SamplerError (fault injection).
        logprobs: False to return ``logprobs=None`` (a backend that lacks them).

    Records ``calls`` (``(prompt_ids, params)``), ``weight_updates``, ``asleep`` and ``closed``.
    """

    name = "scripted"

    def __init__(
        self,
        responses: Iterable[Response] | None = None,
        tokenizer: Any = None,
        *,
        respond: Responder | None = None,
        append_eos: bool = True,
        delay: float = 0.0,
        fail_on: Iterable[int] = (),
        logprobs: bool = True,
    ) -> None:
        self.responses = list(responses or [])
        if not self.responses and respond is None:
            raise ValueError("ScriptedSampler needs responses or a respond function")
        self.respond = respond
        self.tokenizer = tokenizer
        self.append_eos = append_eos
        self.delay = delay
        self.fail_on = set(fail_on)
        self.with_logprobs = logprobs
        self.calls: list[tuple[list[int], SamplingParams]] = []
        self.weight_updates: list[Any] = []
        self.asleep = False
        self.closed = False
        self.stop_token_ids = default_stop_ids(tokenizer)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        if self.closed:
            raise SamplerError("scripted sampler is closed")
        index = len(self.calls)
        self.calls.append((list(prompt_ids), params))
        if self.delay:
            await asyncio.sleep(self.delay)
        if index in self.fail_on:
            raise SamplerError(f"scripted sampler: injected failure on call {index}")
        response = self.respond(list(prompt_ids), params, index) if self.respond else self.responses[index % len(self.responses)]
        if isinstance(response, Completion):
            return response
        return self._complete(list(prompt_ids), self._tokens(response), params)

    def _tokens(self, response: Response) -> list[int]:
        if isinstance(response, str):
            if self.tokenizer is None:
                raise SamplerError("scripted sampler got a text response but has no tokenizer")
            ids = list(self.tokenizer.encode(response, add_special_tokens=False))
            if self.append_eos and self.stop_token_ids:
                ids.append(self.stop_token_ids[0])
            return ids
        return [int(t) for t in response]

    def _complete(self, prompt_ids: list[int], tokens: list[int], params: SamplingParams) -> Completion:
        checker = StopChecker(
            self.tokenizer,
            max_tokens=params.max_tokens,
            stop_token_ids=params.stop_token_ids or self.stop_token_ids,
            stop=params.stop,
        )
        for pos, tok in enumerate(tokens):
            if checker.add(tok, fake_logprob(prompt_ids, pos, tok)):
                break
        finish = checker.finish_reason or "stop"  # the script ran out: a finished turn
        return Completion(
            token_ids=checker.token_ids,
            logprobs=checker.logprobs if self.with_logprobs else None,
            finish_reason=finish,
            text=checker.text(),
            meta={"policy_version": self.policy_version, "scripted": True},
        )

    def update_weights(self, weights: WeightsLike, *, lora: bool = False, version: int | None = None) -> None:
        self.weight_updates.append(weights)
        self._advance_version(version)

    def sleep(self, level: int = 1) -> None:
        self.asleep = True

    def wake_up(self) -> None:
        self.asleep = False

    async def close(self) -> None:
        self.closed = True
