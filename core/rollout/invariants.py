"""The rollout invariants, checked on every trajectory (driver) and every batch (trainer).

Why a checker and not only careful code: schedulers are user code. They edit messages, return
their own token ids, replace prompts, return several outputs per request. Any of those can make the
tokens the trainer scores disagree with the conversation the scheduler reports, and such a run
still finishes with rc=0. So the rule is checked, not hoped for:

* ``prompt``: ``prompt_ids`` detokenise to the chat-template rendering (with the generation prompt)
  of the prompt messages (the messages before the first trained assistant message);
* ``tokens``: ``prompt_ids + completion_ids`` detokenise to the rendering of the final ``messages``,
  up to a closing the model did not emit (the template's text after an assistant message: the
  ``"\\n"`` after a sampled eos, or the whole closing when the completion was cut by length);
* ``tokens`` also: no trained assistant message holds the template's closing token (``<|im_end|>``)
  inside its text — tokens and text would agree, but the model would learn to go on after its eos
  (ms-swift 4.6.0 continues token-backed messages after the sampled eos);
* ``logprobs``: every loss-mask-1 token carries a finite sampler logprob;
* ``status``: ``ok``/``truncated``/``failed``; a trajectory whose last completion was cut by length
  is not ``ok``;
* ``uuid``: unique within a batch.

Failed trajectories are exempt from the token checks (they do not train). A trajectory whose
conversation was decoded from its tokens (``infos["messages_from_tokens"]``: TRL's ``rollout_func``
hands back token ids, and the messages are only their decoding) agrees with its tokens by
construction, so only the token-level checks (mask, logprobs, status) apply to it. The checker needs only a
tokenizer, so ``rlcore check-rollouts FILE`` runs it on a JSONL dump.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import attrs

from ..types import Trajectory
from .. import chat_template as tk
from .token_backed import closing_token_ids

STATUSES = ("ok", "truncated", "failed")


@attrs.define
class Violation:
    """One broken invariant: which trajectory, which check, where (``turn``), and what."""

    uuid: str
    check: str
    message: str
    turn: int | None = None

    def __str__(self) -> str:
        where = "prompt" if self.turn == 0 else (f"turn {self.turn}" if self.turn else "trajectory")
        return f"{self.check} ({where}): {self.message}"


def prompt_message_count(traj: Trajectory) -> int:
    """How many leading messages the prompt tokens stand for."""
    n = traj.infos.get("prompt_messages")
    if isinstance(n, int) and 0 <= n <= len(traj.messages):
        return n
    for i, m in enumerate(traj.messages):
        if m.get("role") == "assistant":
            return i
    return len(traj.messages)


def check_trajectory(
    traj: Trajectory,
    tokenizer: Any,
    *,
    tools: list[dict[str, Any]] | None = None,
    require_logprobs: bool | None = None,
    closing: str | None = None,
    memo: dict[Any, str] | None = None,
) -> list[Violation]:
    """Every invariant ``traj`` breaks (empty when it is sound).

    ``memo`` (a dict kept across one batch) shares the prompt's rendering and decoding between the
    trajectories of a group, which have the same prompt.

    ``require_logprobs``: True — every mask-1 token needs one; None (default) — all or none (a
    backend that returns no logprobs at all is allowed: importance-sampling correction is then off
    for the trajectory; some present and some missing means they were lost or misaligned)."""
    if traj.has_turn_samples:  # per-turn samples: each is held to its own prompt and messages
        return [v for sample in traj.turn_samples()
                for v in check_trajectory(sample, tokenizer, tools=tools, require_logprobs=require_logprobs, closing=closing,
                                          memo=memo)]
    out: list[Violation] = []
    own_tools = traj.infos.get("template_tools")
    if isinstance(own_tools, list):  # this trajectory's template rendered its own tools
        tools, closing = own_tools, None
    if traj.status not in STATUSES:
        out.append(Violation(traj.uuid, "status", f"status {traj.status!r} is not one of {', '.join(STATUSES)}"))
    if traj.status == "failed":
        return out
    last = _last_sampled(traj)
    if last is not None and last.finish_reason == "length" and traj.status == "ok":
        out.append(Violation(traj.uuid, "status", "the last completion was cut by max_tokens but the status is 'ok'",
                             _turn_of(traj, len(traj.turns) - 1)))
    trained_lps = [lp for turn in traj.turns for m, lp in zip(turn.loss_mask, turn.logprobs) if m]
    strict = require_logprobs if require_logprobs is not None else any(lp is not None for lp in trained_lps)
    for i, turn in enumerate(traj.turns):
        for m, lp in zip(turn.loss_mask, turn.logprobs):
            if m not in (0, 1):
                out.append(Violation(traj.uuid, "mask", f"loss mask value {m!r} (must be 0 or 1)", _turn_of(traj, i)))
                break
            if m and strict and (lp is None or not math.isfinite(float(lp))):
                missing = sum(1 for x in trained_lps if x is None)
                out.append(Violation(traj.uuid, "logprobs",
                                     f"{missing} of {len(trained_lps)} trained (mask 1) tokens have no sampler logprob",
                                     _turn_of(traj, i)))
                break
    if not traj.messages or traj.infos.get("messages_from_tokens"):
        return out
    n_prompt = prompt_message_count(traj)
    try:
        memo = {} if memo is None else memo
        key = ("render", repr(traj.messages[:n_prompt]), repr(tools))
        want_prompt = memo.get(key)
        if want_prompt is None:
            want_prompt = memo[key] = tk.render(tokenizer, traj.messages[:n_prompt], add_generation_prompt=True, tools=tools)
        key = ("decode", tuple(traj.prompt_ids))
        have_prompt = memo.get(key)
        if have_prompt is None:
            have_prompt = memo[key] = tk.decode(tokenizer, traj.prompt_ids)
        # a prompt rlcore cut to max_prompt_length keeps its last tokens: then a suffix of the rendering is sound
        if not prompt_matches(tokenizer, traj.messages[:n_prompt], traj.prompt_ids, have_prompt, want_prompt,
                              truncated=bool(traj.infos.get("prompt_truncated"))):
            out.append(Violation(traj.uuid, "prompt",
                                 f"prompt_ids do not spell the prompt messages: {_diff(have_prompt, want_prompt)}", 0))
            return out
        inside = _closing_inside_text(tokenizer, traj, n_prompt)
        if inside is not None:
            out.append(inside)
            return out
        if traj.infos.get("turn_sample") is not None and all(all(t.loss_mask) for t in traj.turns):
            # a per-turn sample that is its prompt then sampled tokens only: its prompt is checked
            # above, the rest is what the sampler returned, and how a template would render the
            # longer conversation (the reason this is a sample of its own) says nothing against it
            return out
        ends_open = traj.messages[-1].get("role") == "assistant"
        as_sampled = None
        if closing is None:
            closing = tk.generic_assistant_closing(tokenizer, tools=tools)
        have_all = tk.decode(tokenizer, _text_ids(traj, tokenizer, closing))
        # the template's own rendering of the final messages; where it reformats assistant text
        # (strips it, splits a <think> block out and renders it back), its rendering with each
        # trained message's content placed verbatim
        wants = [tk.render(tokenizer, traj.messages, tools=tools, add_generation_prompt=not ends_open)]
        if ends_open and len(traj.messages) - 1 >= n_prompt:
            # the last reply (the first one too: a single-turn episode), as sampled after the
            # generation prompt of the messages before it (a thinking template renders a reply that
            # never closed its <think> otherwise, and DeepSeek-V3's drops the reasoning of even the
            # last reply; no later turn was given that rendering, so the tokens the model saw are these)
            opener = tk.assistant_form(tokenizer, tools)[1]
            last = str(traj.messages[-1].get("content") or "")
            gen = tk.render(tokenizer, traj.messages[:-1], tools=tools, add_generation_prompt=True)
            as_sampled = gen + (last[len(opener):] if opener and last.startswith(opener) and gen.endswith(opener) else last)
        trained = trained_messages(traj, n_prompt)
        if trained:
            try:
                wants.append(render_trained(tokenizer, traj.messages, trained, tools, not ends_open))
            except tk.ChatTemplateError:  # the template places a message's fields, not its text (gpt-oss)
                pass
    except tk.ChatTemplateError as exc:
        out.append(Violation(traj.uuid, "tokens", str(exc)))
        return out
    have = want = ""
    aligned = False
    for want_all in wants:
        if not want_all.startswith(want_prompt) or not have_all.startswith(have_prompt):
            continue
        aligned = True
        have, want = have_all[len(have_prompt):], want_all[len(want_prompt):]
        if have == want or (ends_open and want.startswith(have) and closing.endswith(want[len(have):])):
            return out
    if as_sampled is not None and as_sampled.startswith(want_prompt) and have_all.startswith(have_prompt):
        # the tokens: the last reply as sampled, then at most the start of its closing (the eos)
        got, sampled = have_all[len(have_prompt):], as_sampled[len(want_prompt):]
        if got.startswith(sampled) and closing.startswith(got[len(sampled):]):
            return out
    if not aligned:
        out.append(Violation(traj.uuid, "tokens", "the rendering of the final messages does not start with the "
                             "rendering of the prompt messages (earlier messages were rewritten)", 0))
        return out
    at = _first_diff(have, want)
    out.append(Violation(traj.uuid, "tokens",
                         f"the tokens do not spell the final messages: {_diff(have, want)}",
                         _turn_at_char(traj, tokenizer, at + len(have_prompt))))
    return out


def check_batch(
    trajectories: Sequence[Trajectory],
    tokenizer: Any,
    *,
    tools: list[dict[str, Any]] | None = None,
    require_logprobs: bool | None = None,
) -> list[Violation]:
    """Every violation of every trajectory plus duplicate uuids."""
    out: list[Violation] = []
    closing: str | None = None
    seen: dict[str, int] = {}
    memo: dict[Any, str] = {}
    for t in trajectories:
        if t.uuid in seen:
            out.append(Violation(t.uuid, "uuid", f"uuid {t.uuid} is used by {seen[t.uuid] + 1} trajectories"))
        seen[t.uuid] = seen.get(t.uuid, 0) + 1
        if closing is None and t.status != "failed" and t.messages:
            try:
                closing = tk.generic_assistant_closing(tokenizer, tools=tools)
            except tk.ChatTemplateError:
                closing = ""
        out.extend(check_trajectory(t, tokenizer, tools=tools, require_logprobs=require_logprobs, closing=closing, memo=memo))
    return out


def fail_violations(trajectories: Iterable[Trajectory], violations: Iterable[Violation], who: str) -> int:
    """Fail each trajectory that broke an invariant with one reason naming ``who`` and the turn."""
    by_uuid: dict[str, Violation] = {}
    for v in violations:
        by_uuid.setdefault(v.uuid, v)
    n = 0
    for t in trajectories:
        v = by_uuid.get(t.uuid)
        if v is not None and t.status != "failed":
            t.fail(f"invariant violated by {who}: {v}")
            t.infos["invariant"] = v.check
            n += 1
    return n


def prompt_matches(tokenizer: Any, messages: list[dict[str, Any]], prompt_ids: Sequence[int], have: str, want: str,
                   *, truncated: bool = False) -> bool:
    """Whether prompt tokens (decoded: ``have``) stand for the prompt messages (rendered: ``want``).

    Sound: the rendering, or its tail when rlcore left-truncated the prompt to max_prompt_length
    (``truncated``: recorded where it cut, ``infos["prompt_truncated"]``; any other suffix is a
    prompt whose messages were replaced or extended at the front, e.g. a system message a
    scheduler prepended, which the tokens do not hold), or — TRL's *standard* prompt, a plain-text
    ``prompt`` column tokenized without the chat template — exactly the text of the single user
    message (special tokens such as a BOS aside; its tail when ``truncated``)."""
    if have and (want == have or (truncated and want.endswith(have))):
        return True
    if len(messages) == 1 and messages[0].get("role") == "user":
        content = str(messages[0].get("content") or "")
        text = tokenizer.decode(list(prompt_ids), skip_special_tokens=True)
        return bool(content) and bool(text) and (text == content or (truncated and content.endswith(text)))
    return False


_MARK = "\u2063RLCORE-CHECK-{}\u2063"


def trained_messages(traj: Trajectory, n_prompt: int) -> list[int]:
    """Indices of the assistant messages the completion tokens hold as sampled (after the prompt)."""
    given = traj.infos.get("trained_messages")
    if isinstance(given, list):
        return [int(i) for i in given]
    return [i for i, m in enumerate(traj.messages) if i >= n_prompt and m.get("role") == "assistant"]


def render_trained(tokenizer: Any, messages: list[dict[str, Any]], trained: Sequence[int],
                   tools: list[dict[str, Any]] | None, add_generation_prompt: bool) -> str:
    """The template's rendering of ``messages`` with each trained assistant message's content as the
    model produced it: the template places it (headers, closings, everything around it) but may
    not rewrite it — a template that strips or reformats assistant text would otherwise make
    every sampled token look wrong, though those tokens are exactly what the model saw."""
    if not trained:
        return tk.render(tokenizer, messages, tools=tools, add_generation_prompt=add_generation_prompt)
    marked = [dict(m) for m in messages]
    for i in trained:
        marked[i]["content"] = _MARK.format(i)
    text = tk.render(tokenizer, marked, tools=tools, add_generation_prompt=add_generation_prompt)
    for i in trained:
        mark = _MARK.format(i)
        if mark not in text:
            raise tk.ChatTemplateError(f"the chat template drops the content of assistant message {i}")
        text = text.replace(mark, str(messages[i].get("content") or ""), 1)
    return text


def _text_ids(traj: Trajectory, tokenizer: Any, closing: str) -> list[int]:
    """The trajectory's ids as text: a special stop token that ended a sampled message (a custom
    ``stop_token_ids`` entry such as ``<think>``) closes the message like the eos does but is not
    its text, so it is left out — unless it is the template's own closing (``<|im_end|>``)."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids = list(traj.prompt_ids)
    for turn in traj.turns:
        tid = turn.token_ids
        if (tid and turn.loss_mask and turn.loss_mask[-1] and turn.finish_reason not in (None, "length")
                and tid[-1] in special and not closing.startswith(tk.decode(tokenizer, tid[-1:]))):
            ids += tid[:-1]
        else:
            ids += tid
    return ids


# --- helpers --------------------------------------------------------------------------------------
def _closing_inside_text(tokenizer: Any, traj: Trajectory, n_prompt: int) -> Violation | None:
    """A trained assistant message whose text holds a closing token (``<|im_end|>``)."""
    names = [tk.decode(tokenizer, [t]) for t in sorted(closing_token_ids(tokenizer))]
    names = [n for n in names if n]
    for i in trained_messages(traj, n_prompt):
        if not 0 <= i < len(traj.messages):
            continue
        content = traj.messages[i].get("content")
        if not isinstance(content, str):
            continue
        for name in names:
            if name in content:
                return Violation(traj.uuid, "tokens", f"assistant message {i} holds the closing token {name!r} inside its text; "
                                 "the model would be trained to go on after it (drop it from response ids the message continues after)")
    return None


def _last_sampled(traj: Trajectory) -> Any:
    for turn in reversed(traj.turns):
        if any(turn.loss_mask):
            return turn
    return None


def _turn_of(traj: Trajectory, index: int) -> int:
    """1-based assistant turn number of ``traj.turns[index]`` (observations count with the turn before)."""
    n = 0
    for turn in traj.turns[: index + 1]:
        if turn.role == "assistant" and any(turn.loss_mask):
            n += 1
    return max(n, 1)


def _turn_at_char(traj: Trajectory, tokenizer: Any, at: int) -> int:
    """The turn whose tokens hold character ``at`` of the decoded stream (0: the prompt)."""
    ids = list(traj.prompt_ids)
    if len(tk.decode(tokenizer, ids)) > at:
        return 0
    for i, turn in enumerate(traj.turns):
        ids += turn.token_ids
        if len(tk.decode(tokenizer, ids)) > at:
            return _turn_of(traj, i)
    return _turn_of(traj, len(traj.turns) - 1) if traj.turns else 0


def _first_diff(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _diff(have: str, want: str) -> str:
    at = _first_diff(have, want)
    lo = max(0, at - 25)
    return f"at char {at} the tokens say {have[lo:at + 25]!r}, the messages render {want[lo:at + 25]!r}"
