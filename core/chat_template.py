"""Token bookkeeping for multi-turn rollouts: observation tokens from the chat template's delta.

Why this file exists: re-applying a chat template to a whole conversation can tokenise earlier
turns differently from what the sampler produced (BPE merges across turn boundaries, templates that
rewrite history), and then the trainer scores tokens the policy never sampled. So the engine never
re-tokenises earlier turns: it keeps the sampled ids as they are and encodes only the *new* text,
which it finds by rendering the conversation before and after the new message(s) and taking the
suffix. If the template is not prefix-preserving the suffix is undefined, and we say so loudly.
"""

from __future__ import annotations

import re
import weakref
from typing import Any, Sequence

from .errors import ConfigError, RlcoreError


class ChatTemplateError(RlcoreError):
    """The tokenizer's chat template cannot give token-exact observation deltas."""


_SENTINEL = "\u2063RLCORE-SENTINEL\u2063"


#: tokenizer -> extra chat-template arguments of its run (TRL's ``chat_template_kwargs``)
_TEMPLATE_KWARGS: "weakref.WeakKeyDictionary[Any, dict[str, Any]]" = weakref.WeakKeyDictionary()
#: arguments rlcore sets itself on every render; chat_template_kwargs may not override them
RESERVED_TEMPLATE_ARGS = ("tokenize", "add_generation_prompt", "tools", "continue_final_message", "conversation",
                          "return_dict", "chat_template")


def check_vocabulary(tokenizer: Any, source: Any, instead: str = "or, in Python, pass the tokenizer") -> Any:
    """``tokenizer``, unless it is empty: transformers builds a tokenizer of one token or none for a
    directory without tokenizer files, and every prompt would then encode to nothing. One place for
    this check, so the CLI, the trainer and a sampler built directly all say the same line."""
    if len(tokenizer) <= 1:
        raise ConfigError(f"the tokenizer of {str(source)!r} has an empty vocabulary: the directory has no tokenizer "
                          f"files (tokenizer.json …); save it next to the model (tokenizer.save_pretrained) {instead}")
    return tokenizer


def check_chat_template_kwargs(kwargs: dict[str, Any]) -> None:
    clash = sorted(set(kwargs) & set(RESERVED_TEMPLATE_ARGS))
    if clash:
        raise ConfigError(f"chat_template_kwargs may not set {', '.join(clash)}: rlcore sets those itself on every "
                          "render; pass only the template's own options (e.g. enable_thinking)")


def set_chat_template_kwargs(tokenizer: Any, kwargs: dict[str, Any] | None) -> None:
    """Render every conversation of ``tokenizer`` with ``kwargs`` too (prompts, turn deltas and the
    invariant checks alike, so the tokens and their check agree). ``None``/``{}`` clears them."""
    if kwargs:
        check_chat_template_kwargs(kwargs)
        try:
            _TEMPLATE_KWARGS[tokenizer] = dict(kwargs)
        except TypeError:
            raise ConfigError(f"chat_template_kwargs: a {type(tokenizer).__name__} cannot carry them; "
                              "pass a transformers tokenizer") from None
    else:
        _TEMPLATE_KWARGS.pop(tokenizer, None)


#: how a multi-turn conversation becomes training sequences (``GRPOConfig.multi_turn_mode``)
MULTI_TURN_MODES = ("auto", "append", "per_turn")
_MULTI_TURN_MODE: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


def check_multi_turn_mode(mode: Any) -> str:
    if mode not in MULTI_TURN_MODES:
        raise ConfigError(f"multi_turn_mode {mode!r} is not one of {', '.join(MULTI_TURN_MODES)}")
    return str(mode)


def set_multi_turn_mode(tokenizer: Any, mode: str) -> None:
    """How every rollout of ``tokenizer``'s conversations extends them after a turn:

    * ``append`` — one sequence per episode: the template's delta for the new messages is appended
      to the sampled tokens; a template that is not prefix-preserving fails the trajectory loudly;
    * ``per_turn`` — every assistant turn after the first is a sample of its own, its prompt the
      template's rendering of the whole conversation so far (what the model is given), its
      completion the sampled tokens (see :meth:`~rlcore.types.Turn.restart`);
    * ``auto`` (the default) — ``append`` wherever the template appends, a new sample at the turns
      where it rewrites the history (a thinking template dropping earlier ``<think>`` blocks)."""
    mode = check_multi_turn_mode(mode)
    try:
        if mode == "auto":
            _MULTI_TURN_MODE.pop(tokenizer, None)
        else:
            _MULTI_TURN_MODE[tokenizer] = mode
    except TypeError:
        raise ConfigError(f"multi_turn_mode: a {type(tokenizer).__name__} cannot carry it; pass a transformers tokenizer") from None


def multi_turn_mode(tokenizer: Any) -> str:
    """The mode set for ``tokenizer`` (``"auto"`` when none was)."""
    try:
        return _MULTI_TURN_MODE.get(tokenizer) or "auto"
    except TypeError:
        return "auto"


#: tokenizer -> the chat template its run renders with instead of its own (``--chat-template``,
#: a family's training template); the tokenizer itself, and so the saved model, keeps its own
_TEMPLATE_OVERRIDE: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


def set_chat_template(tokenizer: Any, template: str | None) -> None:
    """Render every conversation of ``tokenizer``'s run with ``template`` (``None``: its own again)."""
    try:
        if template is None:
            _TEMPLATE_OVERRIDE.pop(tokenizer, None)
        else:
            _TEMPLATE_OVERRIDE[tokenizer] = str(template)
    except TypeError:
        raise ConfigError(f"a chat template override needs a transformers tokenizer, not a {type(tokenizer).__name__}") from None


def chat_template_override(tokenizer: Any) -> str | None:
    try:
        return _TEMPLATE_OVERRIDE.get(tokenizer)
    except TypeError:
        return None


def effective_chat_template(tokenizer: Any) -> str | None:
    """The template text the run renders with (its override, else the tokenizer's default one)."""
    override = chat_template_override(tokenizer)
    if override is not None:
        return override
    tpl = getattr(tokenizer, "chat_template", None)
    if isinstance(tpl, dict):
        tpl = tpl.get("default")
    return tpl if isinstance(tpl, str) else None


def template_takes(tokenizer: Any, name: str) -> bool:
    """Whether the run's chat template reads the variable ``name`` (e.g. ``preserve_thinking``)."""
    tpl = effective_chat_template(tokenizer)
    if not tpl:
        return False
    try:
        import jinja2
        from jinja2 import meta

        return name in meta.find_undeclared_variables(jinja2.Environment().parse(tpl))
    except Exception:  # noqa: BLE001 - a template jinja2 alone cannot parse (transformers' extensions)
        return name in tpl


#: the conversation shape the run's template is probed with: a model that thinks before it answers,
#: asked again twice (what thinking templates rewrite: earlier turns' reasoning)
_PROBE_ASKS = ("Pick a number from 1 to 9.", "Higher.", "Lower.")
_PROBE_REPLIES = (("A middle guess.", "5"), ("Between 6 and 9.", "7"))


def _probe_reply(form: str, opener: str, reasoning: str, answer: str) -> str:
    """What a thinking model samples after a generation prompt ending in ``opener``, in ``form``."""
    if form in _READERS:
        return _READERS[form][1].format(reasoning=reasoning, answer=answer)
    if "</think>" in opener:
        return answer
    if opener:
        return f"{reasoning}\n</think>\n\n{answer}"
    return f"<think>\n{reasoning}\n</think>\n\n{answer}"


def probe_appends(tokenizer: Any, tools: list[dict[str, Any]] | None = None) -> ChatTemplateError | None:
    """Play the probe conversation the way a rollout extends it (each reply sampled after the
    generation prompt and recorded as :func:`assistant_message` records it, then the next user
    message appended): ``None`` when every turn appends exactly, else the first turn's reason."""
    try:
        form, opener = assistant_form(tokenizer, tools)
        msgs: list[dict[str, Any]] = [{"role": "user", "content": _PROBE_ASKS[0]}]
        head = render(tokenizer, msgs, add_generation_prompt=True, tools=tools)
        for (reasoning, answer), ask in zip(_PROBE_REPLIES, _PROBE_ASKS[1:]):
            sampled = _probe_reply(form, opener, reasoning, answer)
            synced = msgs + [assistant_message(tokenizer, sampled, tools)]
            new = [{"role": "user", "content": ask}]
            after = render(tokenizer, synced + new, add_generation_prompt=True, tools=tools)
            text, problem = appended_text(tokenizer, synced, new, sampled, tools=tools, head=head, after=after)
            if problem is not None:
                return problem
            msgs, head = synced + new, after
    except ChatTemplateError as exc:
        return exc
    return None


def prepare_multi_turn(
    tokenizer: Any,
    mode: str = "auto",
    *,
    chat_template: str | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """Set up how the run's multi-turn conversations become training sequences and say how, in one
    line for the run header. ``chat_template``: a template file (or text) to render with instead of
    the tokenizer's own. Otherwise, unless ``mode`` is ``per_turn``, a template that does not append
    exactly is made to where the family allows it: ``preserve_thinking=True`` for a template that
    takes it (Qwen3.6 and later) and the user did not set it, else the family's prefix-preserving
    training template from TRL (``trl.chat_template_utils.get_training_chat_template``); a
    ``chat_template`` given here is treated as the tokenizer's own would be."""
    mode = check_multi_turn_mode(mode)
    set_chat_template(tokenizer, None)
    source = "the chat template"
    if chat_template:
        text = chat_template
        if "{" not in chat_template:  # a path
            from pathlib import Path

            try:
                text = Path(chat_template).read_text(encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"chat_template {chat_template!r} cannot be read ({exc.strerror or exc}); "
                                  "pass a Jinja template file") from None
            source = f"the chat template {chat_template}"
        set_chat_template(tokenizer, text)
    set_multi_turn_mode(tokenizer, mode)
    check_renders_in_time(tokenizer, chat_template if chat_template and "{" not in chat_template else None, tools)
    if mode == "per_turn":
        return "per_turn: every assistant turn after the first is a sample of its own (its prompt re-rendered)"
    problem = probe_appends(tokenizer, tools)
    fixed = ""
    if problem is not None:
        kwargs = chat_template_kwargs(tokenizer)
        if template_takes(tokenizer, "preserve_thinking") and "preserve_thinking" not in kwargs:
            set_chat_template_kwargs(tokenizer, {**kwargs, "preserve_thinking": True})
            problem = probe_appends(tokenizer, tools)
            if problem is None:
                fixed = "preserve_thinking=True (the template keeps earlier turns' reasoning)"
            else:
                set_chat_template_kwargs(tokenizer, kwargs)
        if problem is not None:
            training = trl_training_template(tokenizer)
            if training is not None:
                set_chat_template(tokenizer, training)
                problem = probe_appends(tokenizer, tools)
                if problem is None:
                    fixed = "TRL's prefix-preserving training template of this family (the saved model keeps its own)"
                else:
                    set_chat_template(tokenizer, None)
                    problem = probe_appends(tokenizer, tools)
    if problem is None:
        return f"{mode}: one sequence per episode, {fixed or source + ' appends exactly'}"
    why = str(problem).split(":", 1)[-1].split(";")[0].strip()
    if mode == "append":
        return (f"append, but {source} does not append exactly ({why}): a trajectory whose history it rewrites fails; "
                "multi_turn_mode auto trains such turns as samples of their own")
    return (f"auto: a sample per turn where {source} rewrites the history ({why}), one sequence per episode elsewhere; "
            "each such turn re-encodes the conversation")


def trl_training_template(tokenizer: Any) -> str | None:
    """The family's prefix-preserving training template TRL ships for the run's template, if any."""
    try:
        from trl.chat_template_utils import get_training_chat_template
    except Exception:  # noqa: BLE001 - TRL absent or broken: no family templates
        return None
    tpl = effective_chat_template(tokenizer)
    if tpl is None:
        return None

    class _View:  # what the helper reads: the template text, and a renderer for its tool probe
        chat_template = tpl

        @staticmethod
        def apply_chat_template(*args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("chat_template", tpl)
            return tokenizer.apply_chat_template(*args, **kwargs)

    try:
        out = get_training_chat_template(_View())  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - a helper failure means: no known training template
        return None
    return out if isinstance(out, str) and out != tpl else None


def chat_template_kwargs(tokenizer: Any) -> dict[str, Any]:
    """The extra chat-template arguments set for ``tokenizer`` (``{}`` when none)."""
    try:
        return _TEMPLATE_KWARGS.get(tokenizer) or {}
    except TypeError:  # not weak-referenceable: nothing can have been set for it
        return {}


def render(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    *,
    add_generation_prompt: bool = False,
    tools: list[dict[str, Any]] | None = None,
    continue_final_message: bool = False,
) -> str:
    """The chat template's text for ``messages`` (never token ids: see transformers 5 notes)."""
    kwargs: dict[str, Any] = {**chat_template_kwargs(tokenizer), "tokenize": False, "add_generation_prompt": add_generation_prompt}
    override = chat_template_override(tokenizer)
    if override is not None:
        kwargs["chat_template"] = override
    if tools:
        kwargs["tools"] = tools
    if continue_final_message:
        kwargs["continue_final_message"] = True
        kwargs["add_generation_prompt"] = False
    try:
        text = tokenizer.apply_chat_template(list(messages), **kwargs)
    except Exception as exc:  # noqa: BLE001 - template bugs are user-facing
        raise ChatTemplateError(
            f"the tokenizer's chat template failed to render {len(messages)} messages "
            f"({type(exc).__name__}: {exc}); fix the template or the messages"
        ) from exc
    if not isinstance(text, str):  # some tokenizers return a list for batched input
        text = text[0]
    return text


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Encode rendered template text (it already carries its special tokens)."""
    if not text:
        return []
    return list(tokenizer.encode(text, add_special_tokens=False))


def encode_prompt(tokenizer: Any, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
    """Prompt ids: the conversation rendered with the generation prompt (the assistant header)."""
    return encode_text(tokenizer, render(tokenizer, messages, add_generation_prompt=True, tools=tools))


def template_delta(
    tokenizer: Any,
    messages_before: Sequence[dict[str, Any]],
    new_messages: Sequence[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    old: str | None = None,
) -> str:
    """The text the template adds when ``new_messages`` follow ``messages_before``.

    ``messages_before`` is rendered without a generation prompt (it ends with a closed message);
    the full conversation with one, so the delta ends with the next assistant header. ``old`` may
    pass that rendering when the caller already has it.
    """
    if old is None:
        old = render(tokenizer, messages_before, tools=tools) if messages_before else ""
    new = render(tokenizer, list(messages_before) + list(new_messages), add_generation_prompt=add_generation_prompt, tools=tools)
    if not new.startswith(old):
        raise not_prefix_error(old, new, new_messages)
    return new[len(old):]


def appended_text(
    tokenizer: Any,
    synced: Sequence[dict[str, Any]],
    new_messages: Sequence[dict[str, Any]],
    streamed: str,
    *,
    tools: list[dict[str, Any]] | None = None,
    head: str | None = None,
    after: str | None = None,
) -> tuple[str | None, ChatTemplateError | None]:
    """The text to append after an assistant message streamed as ``streamed`` (the last of
    ``synced``) when ``new_messages`` follow it — the closing the stream lacks, the new messages and
    the next assistant header — or ``(None, why)`` when the template renders the longer
    conversation so that the tokens so far are not its start (it rewrites history).

    ``head``: the rendering, with the generation prompt, of the messages before that assistant
    message; ``after``: of every message with the new ones, with the generation prompt."""
    last = len(synced) - 1
    if head is None:
        head = render(tokenizer, synced[:last], add_generation_prompt=True, tools=tools)
    if after is None:
        after = render(tokenizer, list(synced) + list(new_messages), add_generation_prompt=True, tools=tools)
    if not after.startswith(head):
        return None, not_prefix_error(head, after, new_messages)
    if after[len(head):].startswith(streamed):
        # common case, one render per turn: the template shows the assistant text as streamed, so
        # everything after it (closing "\n", new messages, next header) is the observation
        return after[len(head) + len(streamed):], None
    # the template rewrites assistant text (strip, <think> removal …): close it generically, where it
    # still places the text right after the header it was sampled after (a template that puts
    # something of its own there instead, such as an empty <think></think> before a reply that did
    # not close its reasoning, renders that reply otherwise than it was sampled)
    marked = render(tokenizer, list(synced[:last]) + [{**synced[last], "content": _SENTINEL}], tools=tools)
    at = marked.find(_SENTINEL)
    if at < 0 or marked[:at] != head:
        shown = marked[len(head):at] if at >= 0 and marked.startswith(head) else ""
        return None, ChatTemplateError(
            f"the chat template renders the reply otherwise than it was sampled (it puts {shown!r} before it); "
            "multi_turn_mode auto or per_turn trains the next turn as a sample of its own")
    full = render(tokenizer, synced, tools=tools)
    closing = assistant_closing(tokenizer, synced[:last], synced[last], streamed, tools=tools, head=head, full=full)
    if after.startswith(full):
        return closing + after[len(full):], None
    return None, not_prefix_error(full, after, new_messages)


def not_prefix_error(old: str, new: str, new_messages: Sequence[dict[str, Any]]) -> ChatTemplateError:
    """The one-line error for a template whose rendering of a longer conversation rewrites the start."""
    at = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
    return ChatTemplateError(
        "the chat template is not prefix-preserving: adding "
        f"{[m.get('role') for m in new_messages]} message(s) changes earlier text at char {at} "
        f"({old[max(0, at - 20):at + 20]!r} became {new[max(0, at - 20):at + 20]!r}); "
        "multi_turn_mode auto or per_turn trains each such turn as a sample of its own; or use a template that "
        "only appends (ChatML style), or return response_token_ids from step"
    )


def encode_observation(
    tokenizer: Any,
    messages_before: Sequence[dict[str, Any]],
    new_messages: Sequence[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Token ids of the chat-template delta for ``new_messages`` (plus the next assistant header).

    Assumes the token stream so far equals the rendering of ``messages_before``; the engine uses
    :func:`assistant_closing` first when the stream ends mid-message (e.g. right after an eos).
    """
    return encode_text(tokenizer, template_delta(tokenizer, messages_before, new_messages, tools=tools))


def assistant_closing(
    tokenizer: Any,
    history: Sequence[dict[str, Any]],
    assistant: dict[str, Any],
    streamed_text: str,
    *,
    tools: list[dict[str, Any]] | None = None,
    head: str | None = None,
    full: str | None = None,
) -> str:
    """Text the template puts after the last assistant message that the token stream lacks.

    The sampler stops at the eos (``<|im_end|>``) while the template renders ``<|im_end|>\\n`` after
    an assistant message, so before the next user message we must append the missing ``\\n`` (loss
    mask 0). ``streamed_text`` is the decoded text of the tokens since the assistant header.
    """
    if head is None:
        head = render(tokenizer, history, add_generation_prompt=True, tools=tools)
    if full is None:
        full = render(tokenizer, list(history) + [assistant], tools=tools)
    if full.startswith(head):
        tail = full[len(head):]
        if tail.startswith(streamed_text):
            return tail[len(streamed_text):]
    # The template rewrites assistant content (strips it, drops <think> …): fall back to the
    # template's generic closing of an assistant message, minus what the stream already has.
    closing = generic_assistant_closing(tokenizer, tools=tools)
    for k in range(len(closing), 0, -1):
        if streamed_text.endswith(closing[:k]):
            return closing[k:]
    return closing


_OPENER = re.compile(r"<think>\s*(?:</think>\s*)?$")
_FORMS: "weakref.WeakKeyDictionary[Any, dict[Any, tuple[str, str]]]" = weakref.WeakKeyDictionary()


def _split_reasoning(text: str) -> dict[str, str] | None:
    reasoning, sep, answer = text.partition("</think>")
    if not sep:
        return None
    return {"reasoning_content": reasoning.split("<think>", 1)[-1].strip("\n"), "content": answer.lstrip("\n")}


#: reply forms beyond the built-in ones: name -> (reader, probe reply). A reader turns a reply's text
#: into the assistant message a family's template renders back (gpt-oss's channels: see
#: :mod:`rlcore.rollout.tool_parsers`, which registers ``harmony``); the probe is a reply in that
#: format with ``{reasoning}`` and ``{answer}`` to fill in
_READERS: dict[str, tuple[Any, str]] = {}


def register_reply_form(name: str, reader: Any, probe: str) -> None:
    """Offer ``reader`` (reply text -> assistant message dict) as a way to record replies, for
    templates under which a reply shaped like ``probe`` renders back exactly that way."""
    _READERS[str(name)] = (reader, str(probe))
    for cache in list(_FORMS.values()):
        cache.clear()


def assistant_form(tokenizer: Any, tools: list[dict[str, Any]] | None = None) -> tuple[str, str]:
    """How a sampled reply is recorded as an assistant message so that the template renders it back
    as the generation prompt followed by exactly the sampled text: ``(form, opener)``.

    ``opener`` is the start of the message the generation prompt already holds — ``<think>\n``
    where a thinking template opens the reasoning block for the model (Qwen3.5), an empty
    ``<think>\n\n</think>\n\n`` where a non-thinking mode closes it — and the sampled text goes
    on after it. ``form``: ``plain`` (content = the sampled text, most templates), ``opener``
    (content = opener + sampled text: a Qwen3.5 template given the sampled text alone would render
    an empty reasoning block before it), ``reasoning`` (the text split at ``</think>`` into
    ``reasoning_content`` and ``content``, for templates that render only that field, such as
    Qwen3.6's). A template none of them fits (it drops even the last message's reasoning) stays
    ``plain``: its turns are closed generically and, where it rewrites the history, become samples
    of their own."""
    key = (repr(chat_template_kwargs(tokenizer)), effective_chat_template(tokenizer), repr(tools))
    try:
        cache = _FORMS.setdefault(tokenizer, {})
    except TypeError:
        cache = {}
    if key in cache:
        return cache[key]
    found = ("plain", "")
    probe = [{"role": "user", "content": "x"}]
    try:
        gen = render(tokenizer, probe, add_generation_prompt=True, tools=tools)
        m = _OPENER.search(gen)
        opener = m.group(0) if m is not None else ""
        sampled = "y" if "</think>" in opener else "w\n</think>\n\ny"
        candidates = [("plain", {"content": sampled})]
        if opener:
            candidates.append(("opener", {"content": opener + sampled}))
        split = _split_reasoning(opener + sampled)
        if split is not None:
            candidates.append(("reasoning", split))
        checks = [(form, fields, sampled) for form, fields in candidates]
        for name, (reader, reply) in _READERS.items():
            try:
                text = reply.format(reasoning="w", answer="y")
                checks.append((name, {k: v for k, v in reader(text).items() if k != "role"}, text))
            except Exception:  # noqa: BLE001 - a reader that cannot read its own probe offers nothing
                continue
        for form, fields, reply in checks:
            try:
                closed = render(tokenizer, probe + [{"role": "assistant", **fields}], tools=tools)
            except ChatTemplateError:
                continue
            if closed.startswith(gen + reply):
                found = (form, opener)
                break
    except ChatTemplateError:
        pass
    cache[key] = found
    return found


def assistant_message(tokenizer: Any, sampled: str, tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The assistant message a reply sampled as ``sampled`` (after the generation prompt) stands
    for, in the shape the template renders back token-exactly (:func:`assistant_form`)."""
    form, opener = assistant_form(tokenizer, tools)
    if form in _READERS:
        return {**_READERS[form][0](sampled), "role": "assistant"}
    if form == "reasoning":
        split = _split_reasoning(opener + sampled)
        if split is not None:
            return {"role": "assistant", **split}
    if form in ("opener", "reasoning"):
        return {"role": "assistant", "content": opener + sampled}
    return {"role": "assistant", "content": sampled}


def generic_assistant_closing(tokenizer: Any, tools: list[dict[str, Any]] | None = None) -> str:
    """What the template renders right after an assistant message's content (``<|im_end|>\\n`` in ChatML)."""
    probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}]
    text = render(tokenizer, probe, tools=tools)
    idx = text.rfind(_SENTINEL)
    if idx < 0:
        raise ChatTemplateError("the chat template drops assistant content; it cannot be used for multi-turn rollouts")
    return text[idx + len(_SENTINEL):]


def decode(tokenizer: Any, ids: Sequence[int]) -> str:
    """Decode keeping special tokens, so the text lines up with template renderings."""
    return decoder(tokenizer)(list(ids)) if ids else ""


_DECODERS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def decoder(tokenizer: Any) -> Any:
    """``ids -> tokenizer.decode(ids, skip_special_tokens=False)``, the same text, faster when it can be.

    Why: stop strings are checked by decoding a window of tokens after every sampled token of every
    row (:class:`~rlcore.sampling.stops.StopChecker`): ~6 µs a call through transformers' Python
    layers, where the Rust tokenizer underneath takes ~2 µs. A transformers fast tokenizer whose
    ``decode``/``_decode`` are the library's own and which cleans up no spaces decodes with exactly
    that Rust call, so it is called directly; any other tokenizer keeps its own ``decode``."""
    try:
        fn = _DECODERS.get(tokenizer)
    except TypeError:  # not weak-referenceable
        fn = None
    if fn is not None:
        return fn
    fn = _fast_decoder(tokenizer)
    if fn is None:
        def fn(ids: Sequence[int]) -> str:
            return tokenizer.decode(list(ids), skip_special_tokens=False)
    try:
        _DECODERS[tokenizer] = fn
    except TypeError:
        pass
    return fn


def _fast_decoder(tokenizer: Any) -> Any:
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or not callable(getattr(backend, "decode", None)) or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return None
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    except ImportError:
        return None
    try:  # transformers 5: TokenizersBackend; 4.x: PreTrainedTokenizerFast
        from transformers.tokenization_utils_tokenizers import TokenizersBackend as Fast
    except ImportError:
        try:
            from transformers.tokenization_utils_fast import PreTrainedTokenizerFast as Fast
        except ImportError:
            return None
    cls = type(tokenizer)
    if getattr(cls, "decode", None) is not PreTrainedTokenizerBase.decode or getattr(cls, "_decode", None) is not Fast._decode:
        return None
    decode = backend.decode

    def fast(ids: Sequence[int]) -> str:
        return decode(list(ids), skip_special_tokens=False)

    return fast


def sampled_prefix_len(tokenizer: Any, ids: Sequence[int], base_text: str, target: str) -> int:
    """Largest ``k`` such that ``base_text + decode(ids[:k])`` is a prefix of ``target``.

    Used when a scheduler edits the last assistant message (continuation): the sampled tokens that
    still agree with the edited text are kept exactly (with their logprobs); the rest is dropped
    and the new text after them is appended as observation tokens.
    """
    if not target.startswith(base_text):
        return -1
    rest = target[len(base_text):]
    for k in range(len(ids), -1, -1):
        if rest.startswith(decode(tokenizer, ids[:k])):
            return k
    return 0


# --- a template that never finishes ------------------------------------------------------------------
#: seconds the first renders of a run's chat template may take (``RLCORE_TEMPLATE_TIMEOUT``; 0: no bound)
TEMPLATE_TIMEOUT = 30.0


class _RenderTimeout(BaseException):
    """Raised inside a render past its deadline; a BaseException so no ``except Exception`` of the
    template machinery (transformers', jinja's, :func:`render`'s) swallows it."""


def template_file(tokenizer: Any, override: str | None = None) -> str:
    """Where the tokenizer's chat template is written: ``override`` (a ``--chat-template`` file), else
    the model directory's ``chat_template.jinja`` / ``chat_template.json`` / ``tokenizer_config.json``."""
    import os

    if override:
        return str(override)
    folder = str(getattr(tokenizer, "name_or_path", "") or "")
    for name in ("chat_template.jinja", "chat_template.json", "tokenizer_config.json"):
        path = os.path.join(folder, name)
        if folder and os.path.isfile(path):
            return path
    return f"the chat template of {folder or type(tokenizer).__name__}"


def check_renders_in_time(tokenizer: Any, override: str | None = None,
                          tools: list[dict[str, Any]] | None = None, timeout: float | None = None) -> None:
    """Render a short conversation (one user message with the generation prompt, then three
    messages: the run's first renders) within ``timeout`` seconds, else one :class:`ChatTemplateError`
    naming the template file. Why: a template that loops (``range(100000)`` nested) hung the run at
    startup with no output. The bound is a SIGALRM timer (one set before it, such as pytest-timeout's, still fires
    when it is due), so it holds in the main thread, where ``rlcore train`` and ``rlcore rollout``
    render; in another thread the renders run unbounded."""
    import os
    import signal
    import threading
    import time

    if timeout is None:
        try:
            timeout = float(os.environ.get("RLCORE_TEMPLATE_TIMEOUT", TEMPLATE_TIMEOUT))
        except ValueError:
            raise ConfigError(f"RLCORE_TEMPLATE_TIMEOUT={os.environ['RLCORE_TEMPLATE_TIMEOUT']!r} is not a number of seconds") from None
    convo = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye."}]
    if not (timeout > 0 and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()):
        return
    previous = signal.getsignal(signal.SIGALRM)
    theirs, interval = signal.getitimer(signal.ITIMER_REAL)
    if theirs > 0 and not callable(previous):
        return  # someone's timer would end the process: leave it alone
    start = time.monotonic()
    due = {"ours": start + timeout, "theirs": start + theirs if theirs > 0 else None}

    def on_alarm(signum: int, frame: Any) -> Any:
        now = time.monotonic()
        if due["theirs"] is not None and now >= due["theirs"] - 1e-3:  # a timer set before ours (pytest-timeout's)
            due["theirs"] = None
            signal.setitimer(signal.ITIMER_REAL, max(due["ours"] - now, 1e-3))
            return previous(signum, frame)
        raise _RenderTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, min(timeout, theirs) if theirs > 0 else timeout)
    try:
        render(tokenizer, convo[:1], add_generation_prompt=True, tools=tools)
        render(tokenizer, convo, add_generation_prompt=True, tools=tools)
    except _RenderTimeout:
        raise ChatTemplateError(
            f"the chat template ({template_file(tokenizer, override)}) did not finish rendering a short conversation "
            f"within {timeout:g} s (a loop that never ends?); fix the template, or pass one with --chat-template FILE "
            "(RLCORE_TEMPLATE_TIMEOUT sets the bound)") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if due["theirs"] is not None:  # the earlier timer goes on with the time it had left
            signal.setitimer(signal.ITIMER_REAL, max(due["theirs"] - time.monotonic(), 1e-3), interval)
