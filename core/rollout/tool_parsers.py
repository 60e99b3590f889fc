"""Tool-call parsers: each model family writes its tool calls its own way.

A parser reads the text of one assistant message and returns its :class:`~rlcore.rollout.ToolCall`\\ s
in order; a call it cannot understand carries an ``error`` (the model is answered ``Error: invalid
tool call …`` and may retry), and no input makes it raise. Every built-in parser runs in time linear
in the text (``str.find`` scans that only move forward, one-pass marker scans, the C JSON decoder),
because a policy in training writes floods of unclosed tags and brackets.

Built-ins (kind ``tool_parser``; ``rlcore components tool_parser``):

* ``hermes`` — ``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` (Qwen2.5, Qwen3, Hermes, SmolLM3 …);
* ``qwen3_xml`` — ``<tool_call><function=NAME><parameter=ARG>value</parameter></function></tool_call>``
  (Qwen3.5/3.6, qwen3-coder, Nemotron 3); values are typed by the tool's JSON schema;
* ``llama3_json`` — the whole reply is ``{"name": …, "parameters": {…}}`` (Llama 3.1/3.2);
* ``gptoss`` — harmony messages ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>``
  (either order of recipient and channel, as gpt-oss writes them and as its template renders them);
* ``deepseek_v3`` — ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{…}\n```<｜tool▁call▁end｜>…``
  (DeepSeek-V3, R1), and V3.1's ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜>``;
* ``gemma4`` — ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>`` (Gemma 4, DiffusionGemma);
  values typed by Gemma's own notation;
* ``muse_atem`` — ``<atem:function_calls><atem:invoke name="NAME"><atem:parameter name="ARG">value</atem:parameter>…``
  (Muse Glimmer); values typed by the tool's JSON schema;
* ``response_schema`` — transformers' ``tokenizer.parse_response`` with the tokenizer's own response
  template, or the one TRL knows for its chat template (``trl.chat_template_utils.add_response_schema``).

``auto`` (the default of ``tool_parser``): the tokenizer's own response template if it carries one;
else the parser of the family whose template TRL ships (``trl/chat_templates/*.jinja``, originals
and ``_training`` variants) — rlcore's own parser where it has one, ``response_schema`` for the other
families TRL knows (GLM-4-MoE, LFM2.5); else what the template's text shows; else ``hermes``.

Reply forms (:func:`rlcore.chat_template.register_reply_form`) registered here: ``harmony`` (gpt-oss)
and ``atem`` (Muse Glimmer), which read a reply into the message fields its template renders back.
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import json
import re
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

import attrs

from ..chat_template import register_reply_form
from ..errors import ConfigError

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


@attrs.define
class ToolCall:
    """One parsed call; ``error`` is set when the JSON could not be understood."""

    name: str
    arguments: dict[str, Any] = attrs.field(factory=dict)
    error: str | None = None


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>`` block in ``text``, in order; malformed ones carry an ``error``."""
    calls = []
    for raw in _call_blocks(text or ""):
        try:
            obj = json.loads(raw)
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                raise ValueError("expected an object with a string 'name'")
            args = obj.get("arguments", obj.get("parameters", {}))
            if isinstance(args, str):
                args = json.loads(args) if args.strip() else {}
            if not isinstance(args, dict):
                raise ValueError("'arguments' must be an object")
            calls.append(ToolCall(obj["name"], args))
        except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested thousands deep
            calls.append(ToolCall("", {}, error=f"invalid tool call {raw[:80]!r}: {str(exc)[:200]}"))
    return calls


def _call_blocks(text: str) -> list[str]:
    """The stripped contents of ``<tool_call>…</tool_call>`` blocks, left to right, in linear time
    (a lazy regex rescans the rest of the text for every unclosed ``<tool_call>``: quadratic)."""
    return [b.strip() for b in _blocks(text, _OPEN, _CLOSE)]


#: longest function or parameter name a parser reads (a bounded scan for the closing ``>``)
MAX_NAME_CHARS = 256
#: ``response_schema`` hands at most this many characters to transformers (its regexes are not
#: linear in the text); a longer message gets one error call instead
MAX_SCHEMA_CHARS = 100_000


def invalid(raw: str, why: str) -> ToolCall:
    """A call that could not be understood: the model is answered ``Error: invalid tool call …``."""
    return ToolCall("", {}, error=f"invalid tool call {raw[:80]!r}: {str(why)[:200]}")


class ToolParser:
    """Finds the tool calls in an assistant message's text.

    Subclass it (or write any class with the same ``parse``) and register it from a plugin::

        @rlcore.hookimpl
        def register_tool_parsers(register):
            register("my_format", MyParser)

    The factory is called with no arguments, or with ``tokenizer=`` when it declares that parameter.
    ``tools`` are the schemas the prompt rendered (OpenAI style), for parsers that type arguments by
    them; ``prompt`` is the text the model was given before this message, for parsers that need it.
    """

    name = "tool_parser"

    def parse(self, text: str, *, tools: Sequence[dict[str, Any]] | None = None,
              prompt: str | None = None) -> list[ToolCall]:
        raise NotImplementedError

    #: whether :meth:`parse` reads ``prompt`` (the scheduler renders it only for such parsers)
    wants_prompt = False


class HermesToolParser(ToolParser):
    """``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` blocks (``parse_tool_calls``)."""

    name = "hermes"

    def parse(self, text: str, *, tools: Sequence[dict[str, Any]] | None = None,
              prompt: str | None = None) -> list[ToolCall]:
        return parse_tool_calls(text)


# --- qwen3_xml ---------------------------------------------------------------------------------------
def _param_types(tools: Sequence[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """tool name → {parameter name → its JSON schema}."""
    out: dict[str, dict[str, Any]] = {}
    for t in tools or []:
        fn = t.get("function", t) if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            props = (fn.get("parameters") or {}).get("properties") if isinstance(fn.get("parameters"), dict) else None
            out[fn["name"]] = props if isinstance(props, dict) else {}
    return out


def _typed(value: str, schema: Any) -> Any:
    """A parameter's text as its schema's type: a string stays text (``"75001"`` is a zip code);
    any other declared type, or none known, is read as JSON where it parses, else kept as text."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "string" or (isinstance(kind, list) and kind and kind[0] == "string"):
        return value
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return value


def _name_at(text: str, pos: int) -> tuple[str, int] | None:
    """The name from ``pos`` to the next ``>`` (at most :data:`MAX_NAME_CHARS`, one line), and the
    position after the ``>``; None when there is none."""
    end = text.find(">", pos, pos + MAX_NAME_CHARS + 1)
    if end < 0:
        return None
    name = text[pos:end].strip()
    if not name or "\n" in name or "<" in name:
        return None
    return name, end + 1


class Qwen3XMLToolParser(ToolParser):
    """``<tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nvalue\\n</parameter>\\n</function>\\n</tool_call>``.

    The template writes a string value as raw text and anything else as JSON, one newline on each
    side: those newlines are removed and the value is typed by the tool's schema (``tools``). A
    block holding hermes JSON instead (``{"name": …}``) is read as hermes. A parameter left open
    ends at the next ``<parameter=`` or at ``</function>``.
    """

    name = "qwen3_xml"

    def parse(self, text: str, *, tools: Sequence[dict[str, Any]] | None = None,
              prompt: str | None = None) -> list[ToolCall]:
        types = _param_types(tools)
        calls = []
        for raw in _call_blocks(text or ""):
            if raw.startswith("{"):
                calls.extend(parse_tool_calls(f"<tool_call>{raw}</tool_call>"))
                continue
            calls.append(self._block(raw, types))
        return calls

    @staticmethod
    def _block(raw: str, types: dict[str, dict[str, Any]]) -> ToolCall:
        if not raw.startswith("<function="):
            return invalid(raw, "expected <function=NAME> after <tool_call>")
        got = _name_at(raw, len("<function="))
        if got is None:
            return invalid(raw, f"<function=NAME> needs a name of at most {MAX_NAME_CHARS} characters closed by '>'")
        name, pos = got
        stop = raw.find("</function>", pos)
        body = raw[pos:] if stop < 0 else raw[pos:stop]
        schema = types.get(name, {})
        args: dict[str, Any] = {}
        start = body.find("<parameter=")
        if body[:start if start >= 0 else len(body)].strip():
            return invalid(raw, "only <parameter=ARG>…</parameter> may follow <function=NAME>")
        close = body.find("</parameter>")  # the next closing tag, searched again only once passed
        while start >= 0:
            got = _name_at(body, start + len("<parameter="))
            if got is None:
                return invalid(raw, f"<parameter=ARG> needs a name of at most {MAX_NAME_CHARS} characters closed by '>'")
            key, vstart = got
            nxt = body.find("<parameter=", vstart)
            if 0 <= close < vstart:
                close = body.find("</parameter>", vstart)
            ends = [e for e in (close, nxt) if e >= 0]
            vend = min(ends) if ends else len(body)
            value = body[vstart:vend]
            if value.startswith("\n"):
                value = value[1:]
            if value.endswith("\n"):
                value = value[:-1]
            args[key] = _typed(value, schema.get(key))
            if vend == close:
                tail = body[close + len("</parameter>"): nxt if nxt >= 0 else len(body)]
                if tail.strip():
                    return invalid(raw, f"text after </parameter> of {key!r}: {tail.strip()[:40]!r}")
            start = nxt
        return ToolCall(name, args)


# --- llama3_json -------------------------------------------------------------------------------------
_LLAMA_HEAD = re.compile(r'\{\s*"name"\s*:')
_LLAMA_SEPARATORS = " \t\r\n;"


class Llama3JSONToolParser(ToolParser):
    """Llama 3.1/3.2: the reply *is* the call, ``{"name": NAME, "parameters": {…}}`` (``arguments``
    is read too), optionally after ``<|python_tag|>``; several calls may follow each other,
    separated by ``;`` or whitespace. A reply that does not start with such an object is an answer,
    not a call; one that starts like a call and does not parse is an invalid call."""

    name = "llama3_json"

    def parse(self, text: str, *, tools: Sequence[dict[str, Any]] | None = None,
              prompt: str | None = None) -> list[ToolCall]:
        s = (text or "").strip()
        for tag in ("<|python_tag|>",):
            if s.startswith(tag):
                s = s[len(tag):].lstrip()
        for end in ("<|eot_id|>", "<|eom_id|>"):
            if s.endswith(end):
                s = s[: -len(end)].rstrip()
        if not s.startswith("{"):
            return []
        decoder = json.JSONDecoder()
        calls: list[ToolCall] = []
        pos = 0
        while pos < len(s):
            looks_like_call = _LLAMA_HEAD.match(s, pos) is not None
            try:
                obj, end = decoder.raw_decode(s, pos)
            except (ValueError, RecursionError) as exc:
                if looks_like_call or calls:
                    calls.append(invalid(s[pos:], exc))
                return calls
            if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)
                    and ("parameters" in obj or "arguments" in obj)):
                if calls:
                    calls.append(invalid(s[pos:end], "expected an object with a string 'name' and 'parameters'"))
                return calls  # a JSON answer, not a call
            args = obj.get("parameters", obj.get("arguments", {}))
            try:
                if isinstance(args, str):
                    args = json.loads(args) if args.strip() else {}
            except (ValueError, RecursionError) as exc:
                calls.append(invalid(s[pos:end], exc))
            else:
                calls.append(ToolCall(obj["name"], args) if isinstance(args, dict)
                             else invalid(s[pos:end], "'parameters' must be an object"))
            pos = end
            while pos < len(s) and s[pos] in _LLAMA_SEPARATORS:
                pos += 1
            if pos < len(s) and s[pos] != "{":
                return calls  # text after the call(s): not part of them
        return calls


# --- gptoss (harmony) --------------------------------------------------------------------------------
_HARMONY_MARKER = re.compile(r"<\|(start|end|message|channel|constrain|call|return)\|>")
_TERMINATORS = ("end", "call", "return")


class GptOssToolParser(ToolParser):
    """gpt-oss's harmony messages: a message whose header names a recipient (``to=functions.NAME``,
    before or after ``<|channel|>commentary``, with or without ``<|constrain|>json``) is a call, its
    ``<|message|>`` body the JSON arguments, up to ``<|call|>`` (or the end of the text: the sampler
    drops the closing special token). Other messages (``analysis``, ``final``, preambles) are not
    calls. One scan over the harmony markers: linear in the text."""

    name = "gptoss"

    def parse(self, text: str, *, tools: Sequence[dict[str, Any]] | None = None,
              prompt: str | None = None) -> list[ToolCall]:
        calls = []
        for header, body in self._messages(text or ""):
            call = self._message(header, body)
            if call is not None:
                calls.append(call)
        return calls

    def message(self, text: str) -> dict[str, Any]:
        """The reply as the assistant message gpt-oss's template renders back: the ``analysis``
        bodies as ``thinking``, the ``final`` body as ``content``, each call as ``tool_calls``
        (OpenAI shape). The template writes a tool's answer only after such a message."""
        thinking: list[str] = []
        content: list[str] = []
        for header, body in self._messages(text or ""):
            if "to=" in header:
                continue
            channel = header.partition("<|channel|>")[2].strip().split(" ")[0] if "<|channel|>" in header else ""
            (thinking if channel == "analysis" else content).append(body)
        calls = [c for c in self.parse(text) if c.error is None]
        out: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
        if thinking:
            out["thinking"] = "".join(thinking)
        if calls:
            out["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        return out

    @staticmethod
    def _messages(text: str) -> list[tuple[str, str]]:
        """``(header, body)`` of each harmony message in ``text``, in order (one marker scan)."""
        out = []
        header_start = 0
        body_start: int | None = None
        header = ""
        for m in _HARMONY_MARKER.finditer(text):
            kind = m.group(1)
            if body_start is None:
                if kind == "message":
                    header = text[header_start:m.start()]
                    body_start = m.end()
                elif kind == "start" or kind in _TERMINATORS:
                    header_start = m.end()  # a header without a body: the next one starts here
                continue
            if kind in _TERMINATORS or kind == "start":
                out.append((header, text[body_start:m.start()]))
                body_start = None
                header_start = m.end()
        if body_start is not None:
            out.append((header, text[body_start:]))
        return out

    @staticmethod
    def _message(header: str, body: str) -> ToolCall | None:
        at = header.find("to=")
        if at < 0:
            return None
        rest = header[at + 3: at + 3 + MAX_NAME_CHARS + 1]
        end = len(rest)
        for stop in (" ", "\t", "\n", "<|"):
            k = rest.find(stop)
            if 0 <= k < end:
                end = k
        recipient = rest[:end]
        raw = header.strip() + "<|message|>" + body
        if not recipient or end > MAX_NAME_CHARS:
            return invalid(raw, f"'to=' needs a recipient of at most {MAX_NAME_CHARS} characters")
        name = recipient[len("functions."):] if recipient.startswith("functions.") else recipient
        if not name:
            return invalid(raw, "'to=functions.' names no function")
        try:
            args = json.loads(body) if body.strip() else {}
        except (ValueError, RecursionError) as exc:
            return invalid(raw, exc)
        if not isinstance(args, dict):
            return invalid(raw, "the arguments must be a JSON object")
        return ToolCall(name, args)


# --- deepseek_v3 -------------------------------------------------------------------------------------
_DS_CALLS_END = "<｜tool▁calls▁end｜>"
_DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
_DS_CALL_END = "<｜tool▁call▁end｜>"
_DS_SEP = "<｜tool▁sep｜>"


def _plain_name(name: str) -> bool:
    return 0 < len(name) <= MAX_NAME_CHARS and not any(c.isspace() or c in "<>{}" for c in name)


class DeepSeekV3ToolParser(ToolParser):
    """DeepSeek-V3 / R1: ``<｜tool▁calls▁begin｜>`` then, per call, ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME``
    and the JSON arguments in a fenced block (``\\n```json\\n{…}\\n```\\n``) up to ``<｜tool▁call▁end｜>``,
    then ``<｜tool▁calls▁end｜>``; also DeepSeek-V3.1's ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜>``.
    The calls end at ``<｜tool▁calls▁end｜>`` (or the end of the text: the sampler may drop it); a call
    without its ``<｜tool▁call▁end｜>`` is an invalid call. One split over the call markers: linear."""

    name = "deepseek_v3"

    def parse(self, text: str, *, tools: Sequence[dict[str, Any]] | None = None,
              prompt: str | None = None) -> list[ToolCall]:
        text = text or ""
        start = text.find(_DS_CALL_BEGIN)
        if start < 0:
            return []
        stop = text.find(_DS_CALLS_END, start)
        region = text[start:stop if stop >= 0 else len(text)]
        calls = []
        for piece in region.split(_DS_CALL_BEGIN)[1:]:
            end = piece.find(_DS_CALL_END)
            if end < 0:
                calls.append(invalid(_DS_CALL_BEGIN + piece, f"the call is not closed by {_DS_CALL_END}"))
                continue
            calls.append(self._call(piece[:end]))
        return calls

    @staticmethod
    def _call(body: str) -> ToolCall:
        raw = _DS_CALL_BEGIN + body + _DS_CALL_END
        head, sep, rest = body.partition(_DS_SEP)
        if not sep:
            return invalid(raw, f"expected TYPE{_DS_SEP}NAME (or NAME{_DS_SEP}ARGUMENTS) after {_DS_CALL_BEGIN}")
        line, nl, after = rest.partition("\n")
        fenced = after.lstrip()
        if nl and fenced.startswith("```"):  # V3: the name on the line after the separator, fenced JSON
            name, args = line.strip(), fenced[3:]
            if args.startswith("json"):
                args = args[4:]
            args = args.rstrip()
            if not args.endswith("```"):
                return invalid(raw, "the arguments' ``` block is not closed")
            args = args[:-3]
        else:  # V3.1: the name before the separator, the JSON right after it
            name, args = head.strip(), rest
        if not _plain_name(name):
            return invalid(raw, f"the function name must be one word of at most {MAX_NAME_CHARS} characters")
        try:
            obj = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError) as exc:
            return invalid(raw, exc)
        if not isinstance(obj, dict):
            return invalid(raw, "the arguments must be a JSON object")
        return ToolCall(name, obj)


# --- gemma4 ------------------------------------------------------------------------------------------
_G_OPEN, _G_CLOSE, _G_QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
_G_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_G_WORDS = {"true": True, "false": False, "null": None}
#: deepest nesting of objects and lists a Gemma 4 call's arguments may have
MAX_DEPTH = 64


class _Malformed(ValueError):
    pass


def _blocks(text: str, opening: str, closing: str) -> list[str]:
    """The contents of ``opening…closing`` blocks, left to right, unstripped (forward scans: linear)."""
    out = []
    pos = 0
    while True:
        start = text.find(opening, pos)
        if start < 0:
            return out
        end = text.find(closing, start + len(opening))
        if end < 0:
            return out
        out.append(text[start + len(opening):end])
        pos = end + len(closing)


class Gemma4ToolParser(ToolParser):
    """Gemma 4 (and DiffusionGemma): ``<|tool_call>call:NAME{key:value,…}<tool_call|>``, one block per
    call. The arguments are Gemma's own object notation, as its template writes them: keys bare,
    strings between ``<|"|>`` quotes (raw, nothing escaped), numbers, ``true``/``false``/``null``,
    nested ``{…}`` and ``[…]``; so the values are typed by the text itself, not the schema. A block
    without its ``<tool_call|>`` is not a call (as a ``<tool_call>`` hermes block without its end).
    One pass over each block, nesting at most :data:`MAX_DEPTH` deep: linear."""

    name = "gemma4"

    def parse(self, text: str, *, tools: Sequence[dict[str, Any]] | None = None,
              prompt: str | None = None) -> list[ToolCall]:
        return [self._call(block) for block in _blocks(text or "", _G_OPEN, _G_CLOSE)]

    @classmethod
    def _call(cls, block: str) -> ToolCall:
        raw = _G_OPEN + block + _G_CLOSE
        s = block.strip()
        if not s.startswith("call:"):
            return invalid(raw, f"expected call:NAME{{…}} after {_G_OPEN}")
        brace = s.find("{", 0, len("call:") + MAX_NAME_CHARS + 1)
        name = s[len("call:"):brace].strip() if brace >= 0 else ""
        if not _plain_name(name):
            return invalid(raw, f"call:NAME{{…}} needs a name of at most {MAX_NAME_CHARS} characters and its arguments in {{…}}")
        try:
            args, pos = cls._value(s, brace, 0)
            if s[pos:].strip():
                raise _Malformed(f"text after the arguments: {s[pos:].strip()[:40]!r}")
        except _Malformed as exc:
            return invalid(raw, exc)
        return ToolCall(name, args)

    @classmethod
    def _value(cls, s: str, pos: int, depth: int) -> tuple[Any, int]:
        """The value at ``s[pos]`` (whitespace before it skipped) and the position after it."""
        n = len(s)
        while pos < n and s[pos].isspace():
            pos += 1
        if pos >= n:
            raise _Malformed("the arguments end inside a value")
        if s.startswith(_G_QUOTE, pos):
            end = s.find(_G_QUOTE, pos + len(_G_QUOTE))
            if end < 0:
                raise _Malformed(f"a string opened with {_G_QUOTE} is not closed")
            return s[pos + len(_G_QUOTE):end], end + len(_G_QUOTE)
        c = s[pos]
        if c in "{[":
            if depth >= MAX_DEPTH:
                raise _Malformed(f"the arguments nest deeper than {MAX_DEPTH}")
            return cls._container(s, pos, depth + 1)
        m = _G_NUMBER.match(s, pos)
        if m is not None:
            word = m.group(0)
            return (int(word) if word.lstrip("-").isdigit() else float(word)), m.end()
        for word, value in _G_WORDS.items():
            if s.startswith(word, pos):
                return value, pos + len(word)
        raise _Malformed(f"unexpected {s[pos:pos + 20]!r} where a value belongs")

    @classmethod
    def _container(cls, s: str, pos: int, depth: int) -> tuple[Any, int]:
        is_map = s[pos] == "{"
        close = "}" if is_map else "]"
        out: Any = {} if is_map else []
        pos += 1
        n = len(s)
        first = True
        while True:
            while pos < n and s[pos].isspace():
                pos += 1
            if pos >= n:
                raise _Malformed(f"a {'{' if is_map else '['} is not closed")
            if s[pos] == close:
                return out, pos + 1
            if not first:
                if s[pos] != ",":
                    raise _Malformed(f"expected ',' or {close!r}, got {s[pos:pos + 20]!r}")
                pos += 1
            first = False
            if is_map:
                key, pos = cls._key(s, pos)
                value, pos = cls._value(s, pos, depth)
                out[key] = value
            else:
                value, pos = cls._value(s, pos, depth)
                out.append(value)

    @staticmethod
    def _key(s: str, pos: int) -> tuple[str, int]:
        """A key (bare, or between ``<|"|>`` quotes) and the position after its ``:``."""
        n = len(s)
        while pos < n and s[pos].isspace():
            pos += 1
        if s.startswith(_G_QUOTE, pos):
            end = s.find(_G_QUOTE, pos + len(_G_QUOTE), pos + len(_G_QUOTE) + MAX_NAME_CHARS + 1)
            if end < 0:
                raise _Malformed(f"a quoted key is not closed within {MAX_NAME_CHARS} characters")
            key, after = s[pos + len(_G_QUOTE):end], end + len(_G_QUOTE)
            colon = after
            while colon < n and s[colon].isspace():
                colon += 1
            if colon >= n or s[colon] != ":":
                raise _Malformed(f"expected ':' after the key {key!r}")
            return key, colon + 1
        colon = s.find(":", pos, pos + MAX_NAME_CHARS + 1)
        key = s[pos:colon].strip() if colon >= 0 else ""
        if not key or any(c in key for c in "{}[],<>\n"):
            raise _Malformed(f"expected KEY: (at most {MAX_NAME_CHARS} characters) at {s[pos:pos + 20]!r}")
        return key, colon + 1


# --- muse_atem (Muse Glimmer's ATEM) -----------------------------------------------------------------
_A_CALLS, _A_CALLS_END = "<atem:function_calls>", "</atem:function_calls>"
_A_INVOKE, _A_INVOKE_END = '<atem:invoke name="', "</atem:invoke>"
_A_PARAM, _A_PARAM_END = '<atem:parameter name="', "</atem:parameter>"


def _attr_name(text: str, pos: int) -> tuple[str, int] | None:
    """The name from ``pos`` to the next ``">`` (at most :data:`MAX_NAME_CHARS`) and the position after it."""
    end = text.find('">', pos, pos + MAX_NAME_CHARS + 2)
    if end < 0:
        return None
    name = text[pos:end]
    if not name or any(c in name for c in '"<>\n'):
        return None
    return name, end + 2


class MuseAtemToolParser(ToolParser):
    """Muse Glimmer's ATEM calls, the body of a ``to=NAME<|message|>`` message::

        <atem:function_calls>
        <atem:invoke name="NAME">
        <atem:parameter name="ARG">value</atem:parameter>
        </atem:invoke>
        </atem:function_calls>

    A ``<atem:function_calls>`` block may hold several invokes, each a call. Values are written as
    they are, nothing stripped; strings raw, lists and objects as JSON, so a value is typed by the
    tool's schema (``tools``): text for a ``string`` parameter, else JSON where it parses. A block
    without its closing tag is not a call; an invoke or parameter left open is an invalid call.
    Forward scans only: linear."""

    name = "muse_atem"

    def parse(self, text: str, *, tools: Sequence[dict[str, Any]] | None = None,
              prompt: str | None = None) -> list[ToolCall]:
        types = _param_types(tools)
        calls: list[ToolCall] = []
        for block in _blocks(text or "", _A_CALLS, _A_CALLS_END):
            calls.extend(atem_invokes(block, lambda name, key, value: _typed(value, types.get(name, {}).get(key))))
        return calls


def atem_invokes(block: str, typed: Callable[[str, str, str], Any]) -> list[ToolCall]:
    """The calls of one ``<atem:function_calls>`` block's contents; ``typed(tool, key, text)`` gives a value."""
    calls = []
    pos = 0
    raw = _A_CALLS + block + _A_CALLS_END
    while True:
        start = block.find("<atem:invoke", pos)
        if start < 0:
            if block[pos:].strip():
                calls.append(invalid(raw, f"text outside <atem:invoke>: {block[pos:].strip()[:40]!r}"))
            return calls
        if block[pos:start].strip():
            calls.append(invalid(raw, f"text outside <atem:invoke>: {block[pos:start].strip()[:40]!r}"))
        end = block.find(_A_INVOKE_END, start)
        body_end = end if end >= 0 else len(block)
        calls.append(_atem_invoke(block[start:body_end], typed) if end >= 0
                     else invalid(block[start:], f"<atem:invoke> is not closed by {_A_INVOKE_END}"))
        if end < 0:
            return calls
        pos = end + len(_A_INVOKE_END)


def _atem_invoke(chunk: str, typed: Callable[[str, str, str], Any]) -> ToolCall:
    raw = chunk + _A_INVOKE_END
    got = _attr_name(chunk, len(_A_INVOKE)) if chunk.startswith(_A_INVOKE) else None
    if got is None:
        return invalid(raw, f'expected <atem:invoke name="NAME"> (a name of at most {MAX_NAME_CHARS} characters)')
    name, pos = got
    args: dict[str, Any] = {}
    while True:
        start = chunk.find("<atem:parameter", pos)
        gap = chunk[pos:start if start >= 0 else len(chunk)]
        if gap.strip():
            return invalid(raw, f"only <atem:parameter> may follow <atem:invoke>, got {gap.strip()[:40]!r}")
        if start < 0:
            return ToolCall(name, args)
        got = _attr_name(chunk, start + len(_A_PARAM)) if chunk.startswith(_A_PARAM, start) else None
        if got is None:
            return invalid(raw, f'expected <atem:parameter name="ARG"> (a name of at most {MAX_NAME_CHARS} characters)')
        key, vstart = got
        vend = chunk.find(_A_PARAM_END, vstart)
        if vend < 0:
            return invalid(raw, f"the parameter {key!r} is not closed by {_A_PARAM_END}")
        args[key] = typed(name, key, chunk[vstart:vend])
        pos = vend + len(_A_PARAM_END)


_ATEM_MARKER = re.compile(r"<\|(start|message|eom|eot)\|>")


def _atem_rendered(value: Any) -> str:
    """How Muse Glimmer's template writes an ATEM parameter value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _atem_value(text: str) -> Any:
    """A value as written, typed where the template writes that typed value back as the same text
    (``5`` → 5, ``true`` → True, ``[1, 2]`` → a list; ``2.50``, ``"x"`` and prose stay text)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    return value if not isinstance(value, str) and _atem_rendered(value) == text else text


def atem_message(text: str) -> dict[str, Any]:
    """A Muse Glimmer reply (sampled after ``<|start|>assistant``: `` to=self<|message|>…<|eom|>``
    reasoning, ``<|start|>assistant to=NAME<|message|><atem:function_calls>…`` calls, `` to=user<|message|>…``
    the answer) as the assistant message its template renders back: ``reasoning_content``,
    ``content``, ``tool_calls``. A reply not in that shape is its text as ``content``. One marker scan."""
    text = text or ""
    parts: list[tuple[str, str]] = []
    header_start, body_start, header = 0, None, ""
    for m in _ATEM_MARKER.finditer(text):
        kind = m.group(1)
        if body_start is None:
            if kind == "message":
                header, body_start = text[header_start:m.start()], m.end()
            elif kind == "start":
                header_start = m.end()
            continue
        if kind in ("eom", "eot", "start"):
            parts.append((header, text[body_start:m.start()]))
            body_start = None
            header_start = m.end()
    if body_start is not None:
        parts.append((header, text[body_start:]))
    if not parts:
        return {"role": "assistant", "content": text}
    reasoning, content, calls = [], [], []
    for head, body in parts:
        head = head.strip()
        if head.startswith("assistant"):
            head = head[len("assistant"):].strip()
        if not head.startswith("to="):
            return {"role": "assistant", "content": text}
        recipient = head[3:]
        if recipient == "self":
            reasoning.append(body)
        elif recipient == "user":
            content.append(body)
        else:
            found = [c for block in _blocks(body, _A_CALLS, _A_CALLS_END)
                     for c in atem_invokes(block, lambda name, key, value: _atem_value(value))]
            if not found or any(c.error for c in found):
                return {"role": "assistant", "content": text}
            calls.extend(found)
    out: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if reasoning:
        out["reasoning_content"] = "".join(reasoning)
    if calls:
        out["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
    return out


# Muse Glimmer's replies are runs of ATEM messages: recorded as the structured message its template
# renders back (reasoning_content, content, tool_calls), where that holds for the run's template
register_reply_form("atem", atem_message, " to=self<|message|>{reasoning}<|eom|><|start|>assistant to=user<|message|>{answer}")


# --- response_schema (transformers' parse_response) --------------------------------------------------
# gpt-oss replies are runs of channel messages: recorded as the structured message its template
# renders back (rlcore.chat_template.assistant_form picks this where that holds)
register_reply_form(
    "harmony", lambda text: GptOssToolParser().message(text),
    "<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant<|channel|>final<|message|>{answer}")


class ResponseSchemaToolParser(ToolParser):
    """transformers' ``tokenizer.parse_response`` with the tokenizer's own response template (or
    legacy ``response_schema``), else the one TRL's ``add_response_schema`` knows for its chat
    template. transformers' regexes are not linear in the text: a message over
    :data:`MAX_SCHEMA_CHARS` characters gets one error call instead of being parsed."""

    name = "response_schema"
    wants_prompt = True

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer
        self.schema = response_schema_of(tokenizer) if tokenizer is not None else None
        if tokenizer is not None and self.schema is None:
            raise ConfigError(
                f"tool_parser 'response_schema': the tokenizer {_tokenizer_name(tokenizer)} has no response template and TRL "
                "knows none for its chat template; set tokenizer.response_template or pick another tool_parser "
                f"({', '.join(BUILTIN_NAMES)})")

    def parse(self, text: str, *, tools: Sequence[dict[str, Any]] | None = None,
              prompt: str | None = None) -> list[ToolCall]:
        text = text or ""
        if self.tokenizer is None or self.schema is None:
            return [invalid(text, "the response_schema parser was built without a tokenizer")]
        if len(text) > MAX_SCHEMA_CHARS:
            return [invalid(text, f"the message is {len(text)} characters, over the {MAX_SCHEMA_CHARS} the response "
                                  "schema parser reads") ] if _mentions_call(text) else []
        try:
            message = self.tokenizer.parse_response(text, self.schema, prefix=prompt or "", tools=list(tools) if tools else None)
        except Exception as exc:  # noqa: BLE001 - whatever transformers raises on model output is the model's error
            return [invalid(text, f"{type(exc).__name__}: {exc}")]
        calls = []
        items = message.get("tool_calls") if isinstance(message, dict) else None
        for item in items if isinstance(items, list) else []:
            fn = item.get("function", item) if isinstance(item, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                calls.append(invalid(json.dumps(item, default=str), "expected a function with a string 'name'"))
                continue
            args = fn.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except (ValueError, RecursionError) as exc:
                    calls.append(invalid(args, exc))
                    continue
            calls.append(ToolCall(fn["name"], args) if isinstance(args, dict)
                         else invalid(json.dumps(fn, default=str), "'arguments' must be an object"))
        return calls


def _mentions_call(text: str) -> bool:
    return any(m in text for m in ("<tool_call>", "<|tool_call", "to=functions.", '"name"', "<function="))


def _tokenizer_name(tokenizer: Any) -> str:
    return getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__


def response_schema_of(tokenizer: Any) -> Any:
    """The response template (or legacy schema) ``tokenizer`` carries, else the one TRL's
    ``add_response_schema`` would set for its chat template (on a copy: the tokenizer is not
    changed), else None."""
    own = getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None)
    if own:
        return own
    if not isinstance(getattr(tokenizer, "chat_template", None), str):
        return None
    try:
        from trl.chat_template_utils import add_response_schema
    except Exception:  # noqa: BLE001 - TRL absent or broken: it knows nothing
        return None
    probe = copy.copy(tokenizer)
    family = trl_template_family(tokenizer.chat_template)
    original = trl_template_dir() / f"{family}.jinja" if family is not None and trl_template_dir() is not None else None
    if original is not None and original.is_file():  # a _training variant parses as its original does
        probe.chat_template = original.read_text(encoding="utf-8")
    try:
        add_response_schema(probe)
    except Exception:  # noqa: BLE001 - ValueError: TRL does not know this template
        return None
    return getattr(probe, "response_template", None) or getattr(probe, "response_schema", None)


# --- auto: which parser a tokenizer's template calls for ---------------------------------------------
BUILTIN_NAMES = ("hermes", "qwen3_xml", "llama3_json", "gptoss", "deepseek_v3", "gemma4", "muse_atem", "response_schema")

#: TRL's template files (``trl/chat_templates/NAME.jinja`` and ``NAME_training.jinja``) → the parser
#: of their family. The other families TRL knows a response schema for get ``response_schema``.
TRL_TEMPLATE_PARSERS: dict[str, str] = {
    **dict.fromkeys(("qwen2_5", "qwen3", "qwen3_instruct_2507", "qwen3_vl", "qwen2_5_vl"), "hermes"),
    **dict.fromkeys(("qwen3_5_think", "qwen3_5_nothink", "qwen3_6", "qwen3_8", "nemotron_3_nano", "nemotron_3_super",
                     "nemotron_3_ultra", "nemotron_3_5_lightning"), "qwen3_xml"),
    **dict.fromkeys(("llama3_1", "llama3_2"), "llama3_json"),
    "gptoss": "gptoss",
    **dict.fromkeys(("deepseekv3", "deepseek_r1_distill"), "deepseek_v3"),
    **dict.fromkeys(("gemma4", "gemma4_v2", "gemma4_v3", "gemma4_v4", "gemma4_v5", "diffusion_gemma"), "gemma4"),
    "muse_glimmer": "muse_atem",
    **dict.fromkeys(("glm4moe", "lfm2_v2", "lfm2_2_5", "lfm2_2_5_v2", "lfm2_2_5_vl"), "response_schema"),
}

_TRL_TEXTS: dict[str, str] | None = None
_TRL_LOCK = threading.Lock()


def trl_template_dir() -> Path | None:
    """``trl/chat_templates`` of the installed TRL (found without importing TRL), or None."""
    try:
        spec = importlib.util.find_spec("trl")
    except (ImportError, ValueError):
        return None
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        d = Path(loc) / "chat_templates"
        if d.is_dir():
            return d
    return None


def trl_template_family(template: str) -> str | None:
    """The name of the TRL template file (``qwen3_5_think``; a ``_training`` variant gives its
    family's name) whose text ``template`` is, or None."""
    global _TRL_TEXTS
    with _TRL_LOCK:
        if _TRL_TEXTS is None:
            texts: dict[str, str] = {}
            d = trl_template_dir()
            for path in sorted(d.glob("*.jinja")) if d is not None else []:
                try:
                    texts.setdefault(path.read_text(encoding="utf-8"), path.stem.removesuffix("_training"))
                except OSError:
                    continue
            _TRL_TEXTS = texts
    return _TRL_TEXTS.get(template)


def _by_text(template: str) -> str | None:
    """What a template's own text shows of its tool-call format (templates that are not TRL's copy)."""
    if "<function=" in template and "<parameter=" in template:
        return "qwen3_xml"
    if "to=functions." in template or ("<|channel|>" in template and "functions." in template):
        return "gptoss"
    if "<|tool_call>call:" in template:
        return "gemma4"
    if "<｜tool▁call▁begin｜>" in template:
        return "deepseek_v3"
    if "<atem:invoke" in template:
        return "muse_atem"
    if "<tool_call>" in template:
        return "hermes"
    if '"parameters"' in template and "<|start_header_id|>" in template:
        return "llama3_json"
    return None


def auto_tool_parser(tokenizer: Any) -> tuple[str, str]:
    """``(parser name, why)`` that ``tool_parser="auto"`` picks for ``tokenizer``."""
    if tokenizer is not None and (getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None)):
        return "response_schema", "the tokenizer's own response template"
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the default one renders tool conversations
        template = template.get("tool_use") or template.get("default")
    if isinstance(template, str):
        family = trl_template_family(template)
        if family is not None and family in TRL_TEMPLATE_PARSERS:
            return TRL_TEMPLATE_PARSERS[family], f"the {family} chat template"
        guess = _by_text(template)
        if guess is not None:
            return guess, "the tool-call format the chat template renders"
    return "hermes", "no known tool-call format in the chat template"


def make_tool_parser(spec: Any = "auto", tokenizer: Any = None) -> ToolParser:
    """A parser from a registered name (``"auto"`` resolves for ``tokenizer``), or ``spec`` itself
    when it already is one (anything with ``parse``)."""
    if spec is None:
        spec = "auto"
    if not isinstance(spec, str):
        if callable(getattr(spec, "parse", None)):
            return spec
        raise ConfigError(f"tool_parser must be a registered name or an object with parse(text), got {type(spec).__name__}")
    name = auto_tool_parser(tokenizer)[0] if spec == "auto" else spec
    from ..plugins import get

    factory = get("tool_parser", name)
    if _takes_tokenizer(factory):
        return factory(tokenizer=tokenizer)
    return factory()


_PARSE_KWARGS: dict[type, frozenset[str]] = {}


def run_parser(parser: Any, text: str, *, tools: Sequence[dict[str, Any]] | None = None,
               prompt: str | None = None) -> list[ToolCall]:
    """``parser.parse(text, …)`` with the keyword arguments its ``parse`` takes (a plugin's
    ``parse(self, text)`` gets only the text)."""
    kind = type(parser)
    accepted = _PARSE_KWARGS.get(kind)
    if accepted is None:
        try:
            params = inspect.signature(parser.parse).parameters
        except (TypeError, ValueError):
            params = {}  # type: ignore[assignment]
        var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
        accepted = frozenset(k for k in ("tools", "prompt") if var_kw or k in params)
        _PARSE_KWARGS[kind] = accepted
    kwargs = {k: v for k, v in (("tools", tools), ("prompt", prompt)) if k in accepted}
    return list(parser.parse(text or "", **kwargs))


def _takes_tokenizer(factory: Callable[..., Any]) -> bool:
    try:
        return "tokenizer" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def check_tool_parser_name(name: Any) -> str:
    """``name`` when it is ``auto`` or a registered tool parser; else one line naming the choices."""
    if name == "auto":
        return name
    if not isinstance(name, str) or not name:
        raise ConfigError(f"tool_parser must be a parser name or 'auto', got {name!r}")
    from ..plugins import plugins

    plugins().component("tool_parser", name)
    return name
