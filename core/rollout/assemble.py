"""Turn a :class:`RolloutOutput` into a token-exact :class:`Trajectory`.

An overridden ``run`` may report a conversation (``messages``) and, optionally, per-round token ids
instead of a trajectory: a :class:`RolloutOutput` (ms-swift's schedulers return the same shape).
The trainer needs tokens: the sampled ones exactly as sampled (with their logprobs) and the rest of
the conversation as the chat template renders it. So:

1. each assistant message is either *trained* — its tokens are the round's ``response_token_ids``
   (ms-swift: the last ``K`` rounds belong to the last ``K`` assistant messages), or, for text-only
   outputs, the recorded samples of this request whose text spells the message — or *context*
   (an assistant message no sample spells, e.g. history with its thinking removed);
2. the conversation is rendered once with a sentinel in place of each trained message's content;
   the text between sentinels becomes loss-mask-0 tokens, the prompt is the text before the first;
3. logprobs come from ``rollout_logprobs`` when given, else from the recorded samples whose ids
   match. The invariant checker then holds the result to the rendering of the final messages.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import attrs

from ..errors import RlcoreError
from ..types import Completion, Trajectory, Turn
from .. import chat_template as tk
from .token_backed import materialize_messages

_SENTINEL = "\u2063RLCORE-MSG-{}\u2063"


def _rounds(value: Any) -> list[list[Any]]:
    """A flat list of numbers is one round (ms-swift's ``_wrap_flat_list`` reads it the same way)."""
    if value is None:
        return []
    items = list(value)
    if items and not isinstance(items[0], (list, tuple)):
        return [items]
    return [list(r) for r in items]


@attrs.define
class RolloutOutput:
    """What an overridden ``run`` may return instead of a trajectory (one per output trajectory; a
    list for several): the conversation and, per assistant round, its tokens.

    ``messages`` is the final conversation, ending with the last assistant message; when omitted
    the response's text (``response.choices[0].message.content``) is appended to the request's
    messages. ``response_token_ids`` / ``response_loss_mask`` / ``rollout_logprobs`` are per
    assistant round: round ``k`` of ``K`` belongs to the ``k``-th of the last ``K`` assistant
    messages; a flat list is one round. ms-swift's ``RolloutOutput`` has these fields and meanings
    (:mod:`rlcore.compat.swift` re-exports this class under that name).
    """

    response: Any = None
    messages: list[dict[str, Any]] | None = None
    response_token_ids: list[list[int]] = attrs.field(factory=list, converter=_rounds)
    response_loss_mask: list[list[int]] = attrs.field(factory=list, converter=_rounds)
    rollout_infos: dict[str, Any] = attrs.field(factory=dict)
    rollout_logprobs: list[list[float]] = attrs.field(factory=list, converter=_rounds)
    #: logprobs of the prompt tokens (ms-swift 4.x's field); accepted, not used for training
    prompt_logprobs: list[Any] | None = None


class RolloutOutputError(RlcoreError):
    """A ``RolloutOutput`` that cannot be turned into tokens (fails its trajectory)."""


Segment = tuple[list[int], list[int], list[float | None]]  # ids, mask, logprobs


def output_to_trajectory(
    trajectory: Trajectory,
    out: RolloutOutput,
    samples: Sequence[Completion],
    tokenizer: Any,
    *,
    tools: list[dict[str, Any]] | None = None,
) -> Trajectory:
    """The trajectory ``out`` describes, for ``trajectory`` (the one that was run; its uuid, data
    and infos carry over); ``samples`` are its sampler calls, in order."""
    messages = _final_messages(trajectory, out, tokenizer)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    asst = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    rounds = out.response_token_ids
    if len(rounds) > len(asst):
        raise RolloutOutputError(
            f"RolloutOutput has {len(rounds)} rounds of response_token_ids but messages hold {len(asst)} assistant messages"
        )
    masks = out.response_loss_mask
    if masks and len(masks) != len(rounds):
        raise RolloutOutputError(f"RolloutOutput has {len(rounds)} rounds of response_token_ids but {len(masks)} of response_loss_mask")
    lps_rounds = out.rollout_logprobs if len(out.rollout_logprobs) == len(rounds) else []
    trained: dict[int, list[Segment]] = {}
    first_round = len(asst) - len(rounds)
    for k, i in enumerate(asst[first_round:]):
        ids = [int(t) for t in rounds[k]]
        mask = [int(m) for m in masks[k]] if masks else [1] * len(ids)
        if len(mask) != len(ids):
            raise RolloutOutputError(f"round {k + 1}: {len(ids)} response_token_ids but {len(mask)} response_loss_mask values")
        lps = _spread(lps_rounds[k], mask) if lps_rounds else _lookup_logprobs(ids, mask, samples)
        trained[i] = [(ids, mask, lps)]
    used: set[int] = set()
    for i in asst[:first_round]:
        segs = _align_text(tokenizer, str(messages[i].get("content") or ""), samples, used, special)
        if segs is not None:
            trained[i] = segs
    if not trained:
        raise RolloutOutputError("RolloutOutput has no assistant message the sampler produced (no token ids, no matching sample)")
    prompt_ids, turns = _assemble(tokenizer, messages, trained, tools)
    if trajectory.has_turn_samples and _contexts_differ(prompt_ids, turns, samples):
        # the stream started samples of their own (the template rewrites the history: auto or
        # per_turn) and a round was sampled after other tokens than the single rendering of the
        # reported messages gives it: each trained message is then a sample, after exactly its input
        prompt_ids, turns = _per_turn(prompt_ids, trained, samples, tokenizer)
    for turn in turns:  # each trained run keeps the finish reason of the sample it came from
        if any(turn.loss_mask):
            src = _last_sample_of([(turn.token_ids, turn.loss_mask, turn.logprobs)], samples)
            turn.finish_reason = src.finish_reason if src is not None else None
    infos = {**trajectory.infos, **(out.rollout_infos or {})}
    first = min(trained)
    infos["prompt_messages"] = first
    infos["trained_messages"] = sorted(trained)
    result = Trajectory(prompt_ids=prompt_ids, messages=messages, data=trajectory.data, uuid=trajectory.uuid,
                        group_id=trajectory.group_id, turns=turns, infos=infos, policy_version=trajectory.policy_version)
    step_rewards = infos.get("step_rewards")
    if isinstance(step_rewards, list) and all(isinstance(r, (int, float)) for r in step_rewards):
        result.step_rewards = [float(r) for r in step_rewards]
    n = infos.get("num_turns")
    result.num_turns = int(n) if isinstance(n, int) else len(trained)
    last_sample = _last_sample_of(trained[max(trained)], samples)
    if last_sample is not None and last_sample.finish_reason == "length":
        result.status, result.reason = "truncated", "max_tokens reached"
    else:
        result.status = "ok"
    return result


def _final_messages(trajectory: Trajectory, out: RolloutOutput, tokenizer: Any = None) -> list[dict[str, Any]]:
    if out.messages is not None:
        msgs = copy.deepcopy(list(out.messages))
    else:
        msgs = copy.deepcopy(list(trajectory.messages))
        choice = (getattr(out.response, "choices", None) or [None])[0]
        text = getattr(getattr(choice, "message", None), "content", None)
        if text is not None:
            msgs.append({"role": "assistant", "content": text})
    for m in msgs:
        if not isinstance(m, dict) or "role" not in m:
            raise RolloutOutputError(f"RolloutOutput.messages holds {type(m).__name__} {m!r:.60}; each message must be a dict with 'role' and 'content'")
    while msgs and msgs[-1].get("role") == "assistant" and msgs[-1].get("content") is None:
        msgs.pop()  # a trailing empty assistant entry ("continue this message", ms-swift's marker)
    materialize_messages(tokenizer, msgs)  # token-backed history: its text
    return msgs


def _spread(lps: Sequence[float], mask: Sequence[int]) -> list[float | None]:
    """``rollout_logprobs`` hold one value per mask-1 token (or one per token)."""
    if len(lps) == len(mask):
        return [float(lp) if m else None for lp, m in zip(lps, mask)]
    if len(lps) == sum(mask):
        it = iter(lps)
        return [float(next(it)) if m else None for m in mask]
    return [None] * len(mask)


def _lookup_logprobs(ids: Sequence[int], mask: Sequence[int], samples: Sequence[Completion]) -> list[float | None]:
    """Logprobs of each mask-1 run, taken from a recorded sample that holds exactly those ids."""
    out: list[float | None] = [None] * len(ids)
    i = 0
    while i < len(ids):
        if not mask[i]:
            i += 1
            continue
        j = i
        while j < len(ids) and mask[j]:
            j += 1
        run = list(ids[i:j])
        for s in samples:
            if s.logprobs is None or len(s.logprobs) != len(s.token_ids):
                continue
            at = _find(s.token_ids, run)
            if at >= 0:
                out[i:j] = s.logprobs[at:at + len(run)]
                break
        i = j
    return out


def _find(hay: Sequence[int], needle: list[int]) -> int:
    n = len(needle)
    for s in range(len(hay) - n + 1):
        if hay[s] == needle[0] and list(hay[s:s + n]) == needle:
            return s
    return -1


def _prefix_len(tokenizer: Any, ids: Sequence[int], text: str) -> int:
    """Largest ``k`` with ``decode(ids[:k])`` a prefix of ``text`` (binary search, then a local check)."""
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if text.startswith(tk.decode(tokenizer, ids[:mid])):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _align_text(tokenizer: Any, content: str, samples: Sequence[Completion], used: set[int], special: set[int]) -> list[Segment] | None:
    """Split an assistant message's text into sampled runs (exact ids + logprobs) and other text.

    Returns ``None`` when no sample spells any of it (the message is context, not trained)."""
    segs: list[Segment] = []
    rem = content
    any_sample = False
    while rem:
        best = (0, -1)
        for si, s in enumerate(samples):
            if si in used or not s.token_ids:
                continue
            k = _prefix_len(tokenizer, s.token_ids, rem)
            if k > best[0]:
                best = (k, si)
        k, si = best
        if k > 0:
            s = samples[si]
            used.add(si)
            any_sample = True
            text = tk.decode(tokenizer, s.token_ids[:k])
            rem = rem[len(text):]
            end = k
            if not rem and all(t in special for t in s.token_ids[k:]):
                end = len(s.token_ids)  # the eos the model emitted closes the message: trained
            lps = list(s.logprobs[:end]) if s.logprobs is not None and len(s.logprobs) == len(s.token_ids) else [None] * end
            segs.append((list(s.token_ids[:end]), [1] * end, lps))
            continue
        # no sample starts here: the text up to the next sample's start is scheduler text
        nxt = len(rem)
        for si, s in enumerate(samples):
            if si in used or not s.token_ids:
                continue
            head = tk.decode(tokenizer, s.token_ids[: min(4, len(s.token_ids))])
            p = rem.find(head, 1) if head else -1
            if 0 < p < nxt:
                nxt = p
        ids = tk.encode_text(tokenizer, rem[:nxt])
        segs.append((ids, [0] * len(ids), [None] * len(ids)))
        rem = rem[nxt:]
    return segs if any_sample else None


def _assemble(
    tokenizer: Any, messages: list[dict[str, Any]], trained: dict[int, list[Segment]], tools: list[dict[str, Any]] | None
) -> tuple[list[int], list[Turn]]:
    marked = copy.deepcopy(messages)
    for i in trained:
        marked[i]["content"] = _SENTINEL.format(i)
    ends_open = messages[-1].get("role") == "assistant"
    text = tk.render(tokenizer, marked, add_generation_prompt=not ends_open, tools=tools)
    order = sorted(trained)
    chunks: list[str] = []
    rest = text
    for i in order:
        s = _SENTINEL.format(i)
        at = rest.find(s)
        if at < 0:
            raise RolloutOutputError(f"the chat template drops the content of assistant message {i}; it cannot be trained")
        chunks.append(rest[:at])
        rest = rest[at + len(s):]
    chunks.append(rest)
    prompt_ids = tk.encode_text(tokenizer, chunks[0])
    turns: list[Turn] = []
    for n, i in enumerate(order):
        content = str(messages[i].get("content") or "")
        ids_all: list[int] = []
        for ids, mask, lps in trained[i]:
            role = "assistant" if any(mask) else "continuation"
            turns.append(Turn(list(ids), list(mask), list(lps), role=role, text=tk.decode(tokenizer, ids)))
            ids_all += ids
        nxt = chunks[n + 1]
        spelled = tk.decode(tokenizer, ids_all)
        if spelled.startswith(content):
            extra = spelled[len(content):]  # e.g. the sampled eos, which the template's closing also has
            if extra and nxt.startswith(extra):
                nxt = nxt[len(extra):]
        last = n == len(order) - 1
        if last and i == len(messages) - 1:
            break  # the closing after the final message is not emitted by the model
        ids = tk.encode_text(tokenizer, nxt)
        if ids:
            turns.append(Turn.observation(ids, role=str(messages[i + 1].get("role") or "user") if i + 1 < len(messages) else "context", text=nxt))
    return prompt_ids, turns


def _source(run: list[int], samples: Sequence[Completion]) -> Completion | None:
    """The recorded sample a trained run of ids came from (its ids start with the run)."""
    for s in samples:
        if list(s.token_ids[:len(run)]) == run:
            return s
    return None


def _contexts_differ(prompt_ids: list[int], turns: list[Turn], samples: Sequence[Completion]) -> bool:
    """Whether a trained turn of the assembled sequence follows other tokens than its sample was
    drawn after (the sampler's input, recorded on the sample)."""
    context = list(prompt_ids)
    for turn in turns:
        if any(turn.loss_mask):
            src = _source(list(turn.token_ids), samples)
            given = src.meta.get("input_ids") if src is not None else None
            if given is not None and list(given) != context:
                return True
        context += turn.token_ids
    return False


def _per_turn(prompt_ids: list[int], trained: dict[int, list[Segment]], samples: Sequence[Completion],
              tokenizer: Any) -> tuple[list[int], list[Turn]]:
    """Each trained assistant message as a sample of its own, its prompt exactly what the sampler
    was given for its first sampled run (see :meth:`rlcore.types.Turn.restart`)."""
    turns: list[Turn] = []
    first = True
    for i in sorted(trained):
        segs = trained[i]
        run = next((list(ids) for ids, mask, _ in segs if any(mask)), None)
        src = _source(run, samples) if run else None
        given = src.meta.get("input_ids") if src is not None else None
        if given is None:
            raise RolloutOutputError(f"assistant message {i} cannot be a sample of its own: no sampler call of this "
                                     "request produced its tokens")
        if first:
            prompt_ids, first = list(given), False
        else:
            turns.append(Turn.restart(list(given), messages=i, text=tk.decode(tokenizer, list(given))))
        for ids, mask, lps in segs:
            turns.append(Turn(list(ids), list(mask), list(lps), role="assistant" if any(mask) else "continuation",
                              text=tk.decode(tokenizer, ids)))
    return prompt_ids, turns


def _last_sample_of(segs: list[Segment], samples: Sequence[Completion]) -> Completion | None:
    """The recorded sample the message's last trained run came from (for its finish_reason)."""
    for ids, mask, _ in reversed(segs):
        run = [t for t, m in zip(ids, mask) if m]
        if not run:
            continue
        for s in reversed(samples):
            if _find(s.token_ids, run) >= 0 and list(s.token_ids[-len(run):]) == run:
                return s
        return None
    return None
