"""Keeps a trajectory's token stream in step with its ``messages``, token-exactly.

Schedulers (ours, plugins', ms-swift style ones) only ever edit ``trajectory.messages``: append a
user/tool message, or edit the last assistant message (continuation, "But wait…" tips). The
:class:`TokenStream` remembers which messages the tokens already represent and, before the next
generation, turns the difference into tokens without touching what was sampled:

* new messages after an assistant turn → the missing closing text of the assistant message (the
  sampler stops at ``<|im_end|>``, the template renders ``<|im_end|>\\n``) plus the chat-template
  delta of the new messages and the next assistant header, all loss_mask 0;
* the last assistant message extended or edited → the sampled tokens that still agree with the new
  text are kept (with their logprobs), the rest is dropped, the new text is appended with loss_mask 0
  and generation continues inside the same message (no new turn header);
* anything else (earlier messages rewritten) cannot be token-exact and raises a clear error.

*Token-backed* assistant messages (``content`` = the message's exact token ids, see
:mod:`rlcore.rollout.token_backed`; ms-swift 4.x's schedulers write them) are checked against the
tokens the stream holds before anything else: equal ids change nothing, ids for the open assistant
message replace its tokens (what still matches the sample keeps mask 1 and its logprobs, the rest
is mask 0), ids for an earlier message must be its tokens, and a closing token (eos) inside a
message that goes on is refused.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import attrs

from ..errors import RlcoreError
from ..types import Completion, Trajectory, Turn
from .. import chat_template as tk
from .token_backed import closing_inside, closing_token_ids, message_text, token_backed_ids

#: Turn.role of loss-mask-0 text placed *inside* the current assistant message (continuations).
INLINE_ROLE = "continuation"


class MessagesEditError(RlcoreError):
    """A scheduler changed messages in a way the token stream cannot follow exactly."""


@attrs.define
class TokenStream:
    """Per-trajectory state: the messages the tokens represent and whether an assistant message is open."""

    tokenizer: Any
    synced: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    #: True while the tokens end inside an assistant message (right after sampling)
    open: bool = False
    #: index into trajectory.turns where the open assistant message's tokens begin
    gen_start: int = 0
    #: (number of messages, their rendering with the generation prompt): the text the open
    #: assistant message started from, kept so each turn renders the conversation twice, not four times
    head: tuple[int, str] | None = None
    #: the last sampled turn and the assistant text before it: what a continuation edit may trim
    last_sample: Turn | None = None
    base_content: str | None = ""
    #: the exact tokens of each closed assistant message, by message index (checks token-backed messages)
    closed_ids: dict[int, list[int]] = attrs.field(factory=dict)
    #: reply text -> the assistant message it is as a tool-call message (``content`` + ``tool_calls``),
    #: or None: given by a scheduler that runs tools (:meth:`RolloutScheduler.reply_reader`)
    reader: Any = None

    @classmethod
    def start(cls, tokenizer: Any, trajectory: Trajectory, tools: list[dict[str, Any]] | None = None) -> "TokenStream":
        return cls(tokenizer, copy.deepcopy(list(trajectory.messages)), tools, open=False, gen_start=len(trajectory.turns))

    # --- after sampling -----------------------------------------------------------------------------
    def content_of(self, completion: Completion) -> str:
        """Message text of a completion: its tokens decoded, minus a closing special token (eos).

        Taken from the tokens, not ``completion.text``, so special tokens such as ``<tool_call>``
        survive and the text always agrees with what the trajectory holds.
        """
        return tk.decode(self.tokenizer, self._text_ids(completion))

    def _text_ids(self, completion: Completion) -> list[int]:
        ids = list(completion.token_ids)
        special = set(getattr(self.tokenizer, "all_special_ids", []) or [])
        if ids and ids[-1] in special and completion.finish_reason != "length":
            ids = ids[:-1]
        return ids

    def _rejoin(self, trajectory: Trajectory, completion: Completion, content: str) -> tuple[str, str]:
        """(the open message's text before this sample, this sample's text): normally its synced text
        and ``content``. A character a byte-level BPE spells with several tokens (an emoji) can be
        split between the previous sample, cut by max_tokens, and this one: each decodes alone to
        replacement characters, so the text is the message's tokens decoded together and the split
        character belongs to this sample."""
        base = str(self.synced[-1].get("content") or "")
        if not base.endswith("\ufffd"):
            return base, content
        before = [t for turn in trajectory.turns[self.gen_start:] for t in turn.token_ids]
        if not before or tk.decode(self.tokenizer, before) != base:
            return base, content
        whole = tk.decode(self.tokenizer, before + self._text_ids(completion))
        k = 0
        while k < min(len(base), len(whole)) and base[k] == whole[k]:
            k += 1
        return base[:k], whole[k:]

    def record_sample(self, trajectory: Trajectory, completion: Completion, *, update_messages: bool = True) -> str:
        """Append the sampled turn; add/extend the assistant message. Returns the message text."""
        content = self.content_of(completion)
        continues = self.open and bool(self.synced) and self.synced[-1].get("role") == "assistant"
        kept = ""
        if continues:
            kept, content = self._rejoin(trajectory, completion, content)
        completion.text = content
        if not self.open:
            self.gen_start = len(trajectory.turns)
        turn = Turn.sampled(completion)
        trajectory.turns.append(turn)
        self.last_sample = turn
        if continues:
            self.base_content = str(self.synced[-1].get("content") or "")
            self.synced[-1]["content"] = kept + content
            if update_messages and trajectory.messages and trajectory.messages[-1].get("role") == "assistant":
                prev = trajectory.messages[-1].get("content")
                if token_backed_ids(prev) is not None or prev == self.base_content:  # its text is the synced one
                    prev = kept
                trajectory.messages[-1]["content"] = str(prev or "") + content
        else:
            # the message as the template renders it back: the sampled text, after the part of
            # the message the generation prompt already opened (``<think>\n``) where it has one
            message = tk.assistant_message(self.tokenizer, content, tools=self.tools)
            text = message.get("content")
            # the message text before this sample (what a continuation edit may keep): unknown
            # where the template splits the reasoning out
            self.base_content = text[:len(text) - len(content)] if isinstance(text, str) and text.endswith(content) \
                and "reasoning_content" not in message else None
            self.synced.append(message)
            if update_messages:
                trajectory.messages.append(dict(message))
        self.open = True
        return content

    def replace_response(
        self,
        trajectory: Trajectory,
        token_ids: list[int],
        loss_mask: list[int] | None,
        logprobs: list[float | None] | None,
    ) -> None:
        """ms-swift's ``response_token_ids``: the scheduler says what this round's response tokens are.

        They replace the tokens of the open assistant message. Sampled logprobs are kept where the
        ids still match what was sampled at that position; positions with mask 1 and no logprob make
        the trajectory's logprobs incomplete (no IS correction for it).
        """
        ids = [int(t) for t in token_ids]
        mask = [int(m) for m in loss_mask] if loss_mask is not None else [1] * len(ids)
        if len(mask) != len(ids):
            raise MessagesEditError(
                f"step returned {len(ids)} response_token_ids but {len(mask)} response_loss_mask values; they must match"
            )
        old_turns = trajectory.turns[self.gen_start:]
        old_ids = [t for turn in old_turns for t in turn.token_ids]
        old_lps = [lp for turn in old_turns for lp in turn.logprobs]
        old_mask = [m for turn in old_turns for m in turn.loss_mask]
        if logprobs is not None and len(logprobs) == len(ids):
            lps: list[float | None] = [None if lp is None else float(lp) for lp in logprobs]
        elif logprobs is not None and len(logprobs) == sum(mask):
            it = iter(logprobs)
            lps = [float(next(it)) if m else None for m in mask]
        else:
            lps = [None] * len(ids)
            for i, t in enumerate(ids):
                if i >= len(old_ids) or old_ids[i] != t:
                    break
                if old_mask[i]:
                    lps[i] = old_lps[i]
        lps = [lp if m else None for lp, m in zip(lps, mask)]
        del trajectory.turns[self.gen_start:]
        # keep runs of equal mask as separate turns so sampled/inline parts stay distinguishable
        i = 0
        while i < len(ids):
            j = i
            while j < len(ids) and mask[j] == mask[i]:
                j += 1
            role = "assistant" if mask[i] else INLINE_ROLE
            trajectory.turns.append(Turn(ids[i:j], mask[i:j], lps[i:j], role=role, text=tk.decode(self.tokenizer, ids[i:j])))
            i = j
        # trust the scheduler's tokens and message text for the assistant message
        self.last_sample = None
        if trajectory.messages and trajectory.messages[-1].get("role") == "assistant" and self.synced:
            self.synced[-1] = copy.deepcopy(trajectory.messages[-1])
        self.open = True

    # --- before the next generation -----------------------------------------------------------------
    def sync(self, trajectory: Trajectory) -> None:
        """Append tokens for whatever the scheduler changed in ``messages`` since the last sync."""
        cur = self._resolve_token_backed(trajectory)
        synced = self.synced
        common = 0
        while common < min(len(cur), len(synced)) and _same(cur[common], synced[common]):
            common += 1
        if common == len(cur) == len(synced):
            if self.open:  # nothing new: the model continues its own message
                self._edit_assistant(trajectory, str(synced[-1].get("content") or ""))
            return
        last = len(synced) - 1
        assistant_open = self.open and last >= 0 and synced[last].get("role") == "assistant"
        if common < len(synced):
            if not (assistant_open and common == last and len(cur) > last and cur[last].get("role") == "assistant"):
                raise MessagesEditError(
                    f"the scheduler changed message {common} ({synced[common].get('role') if common < len(synced) else '?'}) "
                    "which is already in the token stream; only append messages or edit the last assistant message "
                    "(or return response_token_ids from step)"
                )
            self._edit_assistant(trajectory, str(cur[last].get("content") or ""))
            synced[last] = copy.deepcopy(cur[last])
        new = cur[len(synced):]
        if not new:
            return
        if not self.open:
            raise MessagesEditError(
                "messages were appended before the model answered; put them in the prompt "
                "(re-encode prompt_ids in on_trajectory_start) instead"
            )
        streamed = tk.decode(self.tokenizer, [t for turn in trajectory.turns[self.gen_start:] for t in turn.token_ids])
        head = self.head[1] if self.head is not None and self.head[0] == last else None
        if head is None:
            head = tk.render(self.tokenizer, synced[:last], add_generation_prompt=True, tools=self.tools)
        mode = tk.multi_turn_mode(self.tokenizer)
        after = tk.render(self.tokenizer, list(synced) + list(new), add_generation_prompt=True, tools=self.tools)
        text: str | None = None
        problem: tk.ChatTemplateError | None = None
        if mode != "per_turn":
            # a reply with tool calls answered by tool messages: recorded as the tool-call message
            # (content + tool_calls) where the template then appends exactly, so the template
            # renders the calls and their answers as its family does; else as its text
            called = self._as_tool_call(trajectory, last, new, streamed, head) \
                if assistant_open and any(m.get("role") == "tool" for m in new) else None
            if called is not None:
                text, after = called
            else:
                text, problem = tk.appended_text(self.tokenizer, synced, new, streamed, tools=self.tools, head=head,
                                                 after=after)
                if problem is not None and assistant_open and any(m.get("role") == "tool" for m in new):
                    # neither form renders back as sampled: the tool-call message whose content is
                    # the text the reply wrote before its calls (DeepSeek-V3 renders a call message's
                    # content, a closed <think> block, verbatim, but not a reply's text)
                    called = self._as_tool_call(trajectory, last, new, streamed, head, with_content=True)
                    if called is not None:
                        (text, after), problem = called, None
        if problem is not None and mode == "append":
            raise problem
        self.head = (len(synced) + len(new), after)
        if assistant_open:
            self.closed_ids[last] = [t for turn in trajectory.turns[self.gen_start:] for t in turn.token_ids]
        if text is None:
            # a sample of its own: the whole conversation as the template renders it now is the
            # prompt the sampler gets, exactly (nothing before it is scored with it)
            trajectory.turns.append(Turn.restart(tk.encode_text(self.tokenizer, after), messages=len(synced) + len(new),
                                                 text=after))
        else:
            ids = tk.encode_text(self.tokenizer, text)
            role = str(new[0].get("role") or "user")
            trajectory.turns.append(Turn.observation(ids, role=role, text=text))
        synced.extend(copy.deepcopy(list(new)))
        self.open = False
        self.gen_start = len(trajectory.turns)

    def _resolve_token_backed(self, trajectory: Trajectory) -> list[dict[str, Any]]:
        """``trajectory.messages`` with each token-backed assistant message checked against the
        stream (and, for the open message, adopted) and shown as its text."""
        cur = trajectory.messages
        backed = [i for i, m in enumerate(cur)
                  if isinstance(m, dict) and m.get("role") == "assistant" and token_backed_ids(m.get("content")) is not None]
        if not backed:
            return cur
        view = list(cur)
        synced = self.synced
        open_at = len(synced) - 1 if self.open and synced and synced[-1].get("role") == "assistant" else -1
        for i in backed:
            ids = token_backed_ids(cur[i]["content"]) or []
            where = f"token-backed assistant message {i}"
            problem = closing_inside(self.tokenizer, ids, i == len(cur) - 1, where)
            if problem:
                raise MessagesEditError(problem)
            if i == open_at:
                text = self._adopt_ids(trajectory, ids)
            elif i in self.closed_ids and i < len(synced):
                have = self.closed_ids[i]
                if not (ids == have or (have and ids == have[:-1] and have[-1] in closing_token_ids(self.tokenizer))):
                    raise MessagesEditError(
                        f"{where} was set to {len(ids)} token ids that are not the {len(have)} tokens it was answered with; "
                        "only the open (last) assistant message's tokens can be replaced"
                    )
                text = str(synced[i].get("content") or "")
            else:
                raise MessagesEditError(
                    f"{where} is not an answer of the model in this trajectory, so its ids cannot be checked; give it as text"
                )
            view[i] = {**cur[i], "content": text}
        return view

    def _adopt_ids(self, trajectory: Trajectory, ids: list[int]) -> str:
        """The open assistant message's tokens become ``ids``: the leading run equal to the tokens the
        stream holds keeps its masks and logprobs, the rest is the scheduler's (mask 0)."""
        old = trajectory.turns[self.gen_start:]
        have = [t for turn in old for t in turn.token_ids]
        text = message_text(self.tokenizer, ids)
        if ids != have:
            k = 0
            while k < min(len(ids), len(have)) and ids[k] == have[k]:
                k += 1
            kept: list[Turn] = []
            left = k
            for turn in old:
                if left <= 0:
                    break
                n = min(left, len(turn.token_ids))
                kept.append(turn if n == len(turn.token_ids) else Turn(
                    turn.token_ids[:n], turn.loss_mask[:n], turn.logprobs[:n], role=turn.role,
                    text=tk.decode(self.tokenizer, turn.token_ids[:n]), finish_reason=turn.finish_reason))
                left -= n
            del trajectory.turns[self.gen_start:]
            trajectory.turns.extend(kept)
            if ids[k:]:
                trajectory.turns.append(Turn.observation(ids[k:], role=INLINE_ROLE, text=tk.decode(self.tokenizer, ids[k:])))
            self.last_sample = None
            trajectory.infos["token_backed_edits"] = int(trajectory.infos.get("token_backed_edits", 0)) + 1
        self.synced[-1] = {**self.synced[-1], "content": text}
        return text

    def _as_tool_call(self, trajectory: Trajectory, last: int, new: list[dict[str, Any]], streamed: str,
                      head: str, *, with_content: bool = False) -> tuple[str, str] | None:
        """The reply (the open assistant message, ``last``) read by :attr:`reader` as a tool-call
        message, when the conversation with it in that form appends exactly: ``(the text to
        append, the rendering after it)``; the message is then kept in that form. Else None.
        ``with_content``: the message's ``content`` is the text before the calls as the template
        places it (:func:`content_before_calls`), not empty."""
        content = self.synced[last].get("content")
        message = self.reader(content) if self.reader is not None and isinstance(content, str) else None
        if not message or not message.get("tool_calls"):
            return None
        as_text = {**message, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
                                             for c in message["tool_calls"]]}  # DeepSeek-V3 takes the arguments as JSON text
        for candidate in (message, as_text):
            if with_content:
                try:
                    before = content_before_calls(self.tokenizer, self.synced[:last], candidate, head + content, self.tools)
                except tk.ChatTemplateError:
                    before = None
                if not before:
                    continue
                candidate = {**candidate, "content": before}
            synced = [*self.synced[:last], {**candidate, "role": "assistant"}]
            try:
                # the template must render the message as the reply was sampled, not only close it
                if not tk.render(self.tokenizer, synced, tools=self.tools).startswith(head + content):
                    continue
                after = tk.render(self.tokenizer, synced + list(new), add_generation_prompt=True, tools=self.tools)
                text, problem = tk.appended_text(self.tokenizer, synced, new, streamed, tools=self.tools, head=head,
                                                 after=after)
            except tk.ChatTemplateError:
                continue
            if problem is None and text is not None:
                self.synced[last] = synced[last]
                if len(trajectory.messages) > last and trajectory.messages[last].get("role") == "assistant":
                    trajectory.messages[last] = copy.deepcopy(synced[last])
                return text, after
        return None

    def _edit_assistant(self, trajectory: Trajectory, new_content: str) -> None:
        """Make the open assistant message's tokens spell ``new_content`` (continuation).

        Only the last sampled completion can be trimmed (e.g. its eos, or text a tip replaces);
        tokens before it stay as they are, so the new text must extend what they spell.
        """
        if len(trajectory.turns) <= self.gen_start:
            return
        last = trajectory.turns[-1]
        current = str(self.synced[-1].get("content") or "") if self.synced else ""
        if last is self.last_sample and self.base_content is not None and new_content.startswith(self.base_content):
            k = tk.sampled_prefix_len(self.tokenizer, last.token_ids, self.base_content, new_content)
            if k < len(last.token_ids):
                trajectory.infos["trimmed_tokens"] = int(trajectory.infos.get("trimmed_tokens", 0)) + len(last.token_ids) - k
                if k:
                    trajectory.turns[-1] = Turn(
                        last.token_ids[:k], last.loss_mask[:k], last.logprobs[:k], role=last.role,
                        text=tk.decode(self.tokenizer, last.token_ids[:k]), finish_reason=last.finish_reason,
                    )
                else:
                    trajectory.turns.pop()
                self.last_sample = trajectory.turns[-1] if k else None
            have = self.base_content + tk.decode(self.tokenizer, last.token_ids[:k])
        elif new_content.startswith(current):
            have = current
        else:
            raise MessagesEditError(
                "the scheduler rewrote assistant text generated before the last completion; only the last "
                "completion can be trimmed or extended (or return response_token_ids from step)"
            )
        rest = new_content[len(have):]
        if rest:
            trajectory.turns.append(Turn.observation(tk.encode_text(self.tokenizer, rest), role=INLINE_ROLE, text=rest))
            self.last_sample = None
        if self.synced and self.synced[-1].get("role") == "assistant":
            self.synced[-1]["content"] = new_content


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a == b


def content_before_calls(tokenizer: Any, history: list[dict[str, Any]], message: dict[str, Any], sampled: str,
                         tools: list[dict[str, Any]] | None) -> str | None:
    """The ``content`` that makes the tool-call ``message`` render, after ``history``, as the text
    ``sampled`` (the generation prompt and the reply), where the template writes a call message's
    content verbatim before its calls: what ``sampled`` holds between the text the template puts
    before the content and the longest tail of it that begins the calls' rendering. None when the
    template does not place the content that way (the caller checks the rendering either way)."""
    marked = tk.render(tokenizer, [*history, {**message, "role": "assistant", "content": tk._SENTINEL}], tools=tools)
    at = marked.find(tk._SENTINEL)
    if at < 0 or not sampled.startswith(marked[:at]):
        return None
    rest, calls = sampled[at:], marked[at + len(tk._SENTINEL):]
    return rest[:len(rest) - _overlap(rest, calls)]


def _overlap(text: str, start: str) -> int:
    """Length of the longest tail of ``text`` that is a head of ``start`` (Knuth-Morris-Pratt: linear)."""
    if not start:
        return 0
    fail = [0] * len(start)
    k = 0
    for i in range(1, len(start)):
        while k and start[i] != start[k]:
            k = fail[k - 1]
        if start[i] == start[k]:
            k += 1
        fail[i] = k
    k = 0
    for ch in text:
        if k == len(start):
            k = fail[k - 1]
        while k and ch != start[k]:
            k = fail[k - 1]
        if ch == start[k]:
            k += 1
    return k
