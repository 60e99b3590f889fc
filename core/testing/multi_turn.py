"""Checks for multi-turn rollouts with a real model, independent of the rollout engine's own code.

:func:`rlcore.testing.assert_token_exact` holds a trajectory to the invariant checker and to the
template's rendering of its final messages. These checks look at the pieces instead, each computed
here from the tokenizer and its chat template alone:

* :func:`assert_observations_are_template_deltas`: every loss-mask-0 turn after an assistant turn
  is exactly the chat template's delta for the message(s) it introduces (render the conversation
  with and without them, take the suffix), preceded only by the closing of the assistant message
  the model did not sample (``<|im_end|>\\n`` after a stop string, ``\\n`` after the eos), encoded
  as is, with loss mask 0 and no logprobs;
* :class:`RecordingSampler` + :func:`assert_sampled_tokens_kept`: every trained turn holds exactly
  the token ids and logprobs the sampler returned for exactly the tokens that precede it.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..chat_template import decode, generic_assistant_closing, render
from ..envs import Env
from ..rollout.scheduler import MultiTurnScheduler
from ..sampling.base import Sampler
from ..types import Completion, SamplingParams


class AskAgain(MultiTurnScheduler):
    """Asks again (``again N``) until ``max_turns``, whatever the reply (one cut at the token cap
    included): a multi-turn conversation whose every turn is a sampled reply."""

    def check_finished(self, infer_request: Any, response_choice: Any, current_turn: int) -> bool:
        return current_turn >= self.max_turns

    def step(self, infer_request: Any, response_choice: Any, current_turn: int) -> dict[str, Any]:
        infer_request.messages.append({"role": "user", "content": f"again {current_turn}"})
        return {"infer_request": infer_request}


class RecordingSampler(Sampler):
    """Passes every call to ``inner`` and records ``(prompt_ids, completion)``: what the model was
    given and what it returned, to compare with what a trajectory trains on. Not a mock: the
    completions are ``inner``'s own."""

    name = "recording"

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.tokenizer = getattr(inner, "tokenizer", None)
        self.records: list[tuple[list[int], Completion]] = []

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        completion = await self.inner.generate(list(prompt_ids), params)
        self.records.append((list(prompt_ids), Completion(list(completion.token_ids),
                                                          None if completion.logprobs is None else list(completion.logprobs),
                                                          completion.finish_reason, completion.text)))
        return completion

    async def close(self) -> None:  # the caller owns ``inner``
        pass


def assert_sampled_tokens_kept(trajectory: Any, records: Sequence[tuple[list[int], Completion]]) -> int:
    """Every trained (mask 1) turn of ``trajectory`` is a completion of ``records`` verbatim — ids,
    logprobs, finish reason — sampled from exactly the tokens before that turn. Returns how many."""
    by_prompt: dict[tuple[int, ...], list[Completion]] = {}
    for prompt, completion in records:
        by_prompt.setdefault(tuple(prompt), []).append(completion)
    ids = list(trajectory.prompt_ids)
    n = 0
    for i, turn in enumerate(trajectory.turns):
        if any(turn.loss_mask):
            assert set(turn.loss_mask) == {1}, f"turn {i} mixes trained and untrained tokens: {turn.loss_mask}"
            given = by_prompt.get(tuple(ids))
            assert given, f"turn {i}: the sampler was never called with the {len(ids)} tokens that precede it"
            assert any(c.token_ids == turn.token_ids for c in given), (
                f"turn {i} trains on {turn.token_ids}, the sampler returned {[c.token_ids for c in given]}")
            done = next(c for c in given if c.token_ids == turn.token_ids)
            if done.logprobs is not None:
                assert turn.logprobs == done.logprobs, f"turn {i}: logprobs differ from the sampler's"
                assert all(lp is not None and math.isfinite(lp) for lp in turn.logprobs)
            assert turn.finish_reason == done.finish_reason
            n += 1
        ids += list(turn.token_ids)
    return n


def assert_observations_are_template_deltas(trajectory: Any, tokenizer: Any, tools: list[dict[str, Any]] | None = None,
                                            roles: Sequence[str] = ("user", "tool")) -> int:
    """Every loss-mask-0 turn that follows an assistant turn is the template's delta for the new
    message(s) it stands for, after the closing the sampled tokens lack. Returns how many were checked.

    The messages an observation introduces are found from the text alone: the first ``k`` messages
    after the assistant message that the tokens have closed (``render(messages[:j+k], gen=True)``
    equals the decoded tokens through the observation)."""
    messages = trajectory.messages
    ids = list(trajectory.prompt_ids)
    checked = 0
    # the assistant message the tokens are in: the prompt renders messages[:n_prompt]
    n_prompt = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    seen = n_prompt  # messages already represented by the tokens (the open assistant one counts once sampled)
    for i, turn in enumerate(trajectory.turns):
        if any(turn.loss_mask):
            ids += list(turn.token_ids)
            if seen < len(messages) and messages[seen].get("role") == "assistant":
                seen += 1
            continue
        before = decode(tokenizer, ids)
        assert seen >= 1 and messages[seen - 1].get("role") == "assistant", (
            f"turn {i} (mask 0) does not follow an assistant message")
        without = render(tokenizer, messages[:seen], tools=tools)
        assert without.startswith(before), (f"turn {i}: the tokens before it do not spell messages[:{seen}] "
                                            f"up to the assistant closing: {before[-80:]!r} vs {without[-80:]!r}")
        closing = without[len(before):]
        assert generic_assistant_closing(tokenizer, tools=tools).endswith(closing), (
            f"turn {i}: the tokens lack {closing!r}, which is not (a tail of) the template's closing of an assistant message")
        text = decode(tokenizer, turn.token_ids)
        k = 0
        while True:
            k += 1
            assert seen + k <= len(messages), f"turn {i}: no run of messages after message {seen - 1} renders as {text!r}"
            with_new = render(tokenizer, messages[:seen + k], tools=tools, add_generation_prompt=True)
            assert with_new.startswith(without), f"turn {i}: the template is not prefix-preserving here"
            delta = with_new[len(without):]
            if closing + delta == text:
                break
            assert messages[seen + k - 1].get("role") in roles and len(closing + delta) < len(text), (
                f"turn {i}: its text {text!r} is not the template's delta {closing + delta!r}")
        assert list(turn.token_ids) == list(tokenizer.encode(closing + delta, add_special_tokens=False)), (
            f"turn {i}: its tokens are not the encoding of the template's delta")
        assert set(turn.loss_mask) == {0} and all(lp is None for lp in turn.logprobs), f"turn {i}: an observation is trained"
        assert all(m.get("role") in roles for m in messages[seen:seen + k])
        ids += list(turn.token_ids)
        seen += k
        checked += 1
    return checked


def trainer_logprobs(trajectories: Sequence[Any], model: Any, pad_token_id: int) -> list[list[float | None]]:
    """Per trajectory, the logprob of each completion token (``None`` where the loss mask is 0) as
    the trainer computes it: the trajectories packed into one :class:`~rlcore.Batch` (right padding,
    observation tokens inside the completion) and scored by
    :func:`rlcore.algorithms.logprobs.completion_logprobs`, the function the losses use."""
    import torch

    from ..algorithms.logprobs import completion_logprobs
    from ..types import Batch

    batch = Batch.from_trajectories(list(trajectories), [0.0] * len(trajectories), pad_token_id=pad_token_id)
    with torch.no_grad():
        logps, _ = completion_logprobs(model, batch.input_ids, batch.attention_mask, batch.completion_mask)
    out = []
    for i, t in enumerate(trajectories):
        p = len(t.prompt_ids)
        row = logps[i, p:p + len(t.loss_mask)].tolist()
        out.append([lp if m else None for lp, m in zip(row, t.loss_mask)])
    return out


def assert_rows_are_sampler_calls(trajectories: Sequence[Any], records: Sequence[tuple[list[int], Completion]],
                                  tokenizer: Any, tools: list[dict[str, Any]] | None = None, *, every_call: bool = True) -> int:
    """The rule "the trainer scores exactly the tokens that were sampled", checked on the rows the
    trainer really packs (:func:`rlcore.loop.loss.pack`, append and per-turn samples alike): in
    every row, each run of trained (mask 1) tokens is one recorded completion verbatim, with its
    logprobs, and the tokens before it are exactly the prompt the sampler was given for it; every
    row's prompt (the tokens before its first trained token) is the template's rendering, with the
    generation prompt, of the messages before one of the episode's assistant messages (in the
    conversation of that row's sample, with the trajectory's own tools where it names them). Returns the
    number of rows. ``every_call``: also assert every record is trained (pass the records of these
    episodes only, none failed); a record is never trained twice."""
    from ..loop.loss import pack

    trajs = [t for t in trajectories if t.status != "failed"]
    batch = pack(trajs, [0.0] * len(trajs), int(getattr(tokenizer, "pad_token_id", None) or 0))
    calls = {}
    for n, (prompt, completion) in enumerate(records):
        calls.setdefault(tuple(prompt), []).append((n, completion))
    used: set[int] = set()
    renders: dict[str, set[str]] = {}
    for t in trajs:  # each sample's own conversation and the trajectory's own tools, where it has them
        own = t.infos.get("template_tools")
        tools_of = own if isinstance(own, list) else tools
        renders[t.uuid] = {render(tokenizer, s.messages[:i], tools=tools_of, add_generation_prompt=True)
                           for s in t.turn_samples() for i, m in enumerate(s.messages) if m.get("role") == "assistant"}
    rows = batch.input_ids.shape[0]
    row_owner = [t for t in trajs for _ in t.turn_samples()]
    assert len(row_owner) == rows, f"{rows} rows packed for {len(row_owner)} samples"
    for r in range(rows):
        n = int(batch.attention_mask[r].sum())
        ids = batch.input_ids[r, :n].tolist()
        mask = batch.completion_mask[r, :n].tolist()
        lps = batch.sampler_logps[r, :n].tolist()
        first = mask.index(1.0) if 1.0 in mask else n
        prompt_text = decode(tokenizer, ids[:first])
        assert prompt_text in renders[row_owner[r].uuid], (
            f"row {r}: its prompt is not the template's rendering of the messages before any assistant message: "
            f"{prompt_text[-120:]!r}")
        p = 0
        while p < n:
            if mask[p] != 1.0:
                p += 1
                continue
            q = p
            while q < n and mask[q] == 1.0:
                q += 1
            given = calls.get(tuple(ids[:p]))
            assert given, f"row {r}: the sampler was never given the {p} tokens before its trained tokens at {p}"
            match = [(k, c) for k, c in given if list(c.token_ids) == ids[p:q] and k not in used]
            assert match, f"row {r}: trains on {ids[p:q]} after a prompt the sampler answered with {[c.token_ids for _, c in given]}"
            k, c = match[0]
            used.add(k)
            if c.logprobs is not None:
                assert all(abs(a - b) < 1e-6 for a, b in zip(lps[p:q], c.logprobs)), f"row {r}: logprobs differ from the sampler's"
            p = q
    lost = [k for k in range(len(records)) if k not in used]
    assert not (every_call and lost), f"sampler calls {lost} are in no row"
    return rows


class DigitRounds(Env):
    """An env for multi-turn tests: three rounds (``"Round k: say a number."``), each reply earning
    the share of its non-space characters that are digits; done after the third."""

    def __init__(self, **options: Any) -> None:
        self.round = 0

    async def reset(self, request: Any) -> tuple[str, dict[str, Any], str | None]:
        self.round = 0
        return "Round 1: say a number.", {}, None

    async def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        self.round += 1
        chars = [c for c in action if not c.isspace()]
        reward = sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0
        return f"Round {self.round + 1}: say a number.", reward, self.round >= 3, {}

    async def close(self) -> None:
        pass
