"""OpenAI's chat-completions wire format, read and written: what the proxy accepts and answers.

Reading (:func:`parse_request`): a ``POST /v1/chat/completions`` body becomes a
:class:`ChatRequest` — the messages in the shape chat templates render (``content`` as text,
``developer`` as ``system``, tool-call arguments as objects), the function tools, ``tool_choice``
and the sampling fields. Anything the proxy cannot serve exactly is a :class:`ProxyError` naming
the field (HTTP 400, OpenAI's error object), never a silent change.

Writing: :func:`completion_body` (``chat.completion``) and :func:`stream_chunks` (SSE
``chat.completion.chunk`` events, then ``[DONE]``) from one :class:`Reply`.
"""

from __future__ import annotations

import copy
import json
import secrets
import time
from typing import Any, Iterator

import attrs

ROLES = ("system", "developer", "user", "assistant", "tool")


class ProxyError(Exception):
    """A request the proxy refuses: ``status`` and OpenAI's ``error`` object (``message``, ``type``,
    ``param``, ``code``). ``fatal`` also fails the trajectory (the run cannot train on it)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None, fatal: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind
        self.code = code
        self.fatal = fatal

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@attrs.define
class ChatRequest:
    """One chat-completions request, as the proxy serves it."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    tool_choice: Any
    stream: bool
    include_usage: bool
    model: str
    #: sampling fields the agent set (temperature, top_p …): checked against the run's
    sampling: dict[str, Any]
    max_tokens: int | None
    stop: list[str]
    seed: int | None
    logprobs: bool


def _text(content: Any, where: str) -> str:
    """A message's ``content`` as text: a string, None, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
                out.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ProxyError(400, f"{where}.content[{i}] is a {kind!r} part; the proxy serves text parts only",
                                 param=f"{where}.content")
        return "".join(out)
    raise ProxyError(400, f"{where}.content must be a string, null or a list of text parts, got {type(content).__name__}",
                     param=f"{where}.content")


def _arguments(raw: Any, where: str) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError):
            raise ProxyError(400, f"{where}.function.arguments is not JSON: {raw[:80]!r}", param=f"{where}.function.arguments") from None
        if isinstance(value, dict):
            return value
    raise ProxyError(400, f"{where}.function.arguments must be a JSON object", param=f"{where}.function.arguments")


def normalize_messages(raw: Any) -> list[dict[str, Any]]:
    """OpenAI request messages as template messages (see the module docstring)."""
    if not isinstance(raw, list) or not raw:
        raise ProxyError(400, "messages must be a non-empty list of message objects", param="messages")
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool_call id -> function name (a tool message's name, for templates that render it)
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            role = m.get("role") if isinstance(m, dict) else None
            raise ProxyError(400, f"{where} has role {role!r}; roles are {', '.join(ROLES)}", param=f"{where}.role")
        role = "system" if m["role"] == "developer" else m["role"]
        msg: dict[str, Any] = {"role": role, "content": _text(m.get("content"), where)}
        if role == "assistant" and m.get("tool_calls"):
            calls = []
            for j, c in enumerate(m["tool_calls"]):
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise ProxyError(400, f"{where}.tool_calls[{j}] needs a function with a name", param=f"{where}.tool_calls")
                call: dict[str, Any] = {"type": "function", "function": {"name": fn["name"],
                                                                         "arguments": _arguments(fn.get("arguments"), f"{where}.tool_calls[{j}]")}}
                if isinstance(c.get("id"), str):
                    call["id"] = c["id"]
                    names[c["id"]] = fn["name"]
                calls.append(call)
            msg["tool_calls"] = calls
        if role == "assistant":
            for key in ("reasoning_content", "reasoning"):
                if isinstance(m.get(key), str) and m[key]:
                    msg["reasoning_content"] = m[key]
        if role == "tool":
            if isinstance(m.get("tool_call_id"), str):
                msg["tool_call_id"] = m["tool_call_id"]
            name = m.get("name") or names.get(str(m.get("tool_call_id")))
            if isinstance(name, str):
                msg["name"] = name
        elif isinstance(m.get("name"), str) and role != "assistant":
            msg["name"] = m["name"]
        out.append(msg)
    if out[-1]["role"] == "assistant":
        raise ProxyError(400, "the last message is an assistant message; the proxy answers a conversation that ends with a "
                         "user, system or tool message (continuing an assistant message is not served)", param="messages")
    return out


def normalize_tools(raw: Any) -> list[dict[str, Any]] | None:
    """The function tools of a request, as the chat template renders them (None: no tools)."""
    if raw is None or raw == []:
        return None
    if not isinstance(raw, list):
        raise ProxyError(400, "tools must be a list of tool objects", param="tools")
    out = []
    for i, t in enumerate(raw):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str):
            raise ProxyError(400, f"tools[{i}] must be {{'type': 'function', 'function': {{'name': …}}}}", param=f"tools[{i}]")
        out.append({"type": "function", "function": copy.deepcopy(fn)})
    return out


#: sampling fields that change the distribution tokens are drawn from, and the value that leaves it alone
DISTRIBUTION_FIELDS = {"temperature": None, "top_p": None, "top_k": None, "min_p": None, "presence_penalty": 0.0,
                       "frequency_penalty": 0.0, "repetition_penalty": None, "logit_bias": None}


def parse_request(body: Any) -> ChatRequest:
    """A chat-completions body as a :class:`ChatRequest`; a field the proxy cannot serve is a 400."""
    if not isinstance(body, dict):
        raise ProxyError(400, "the request body must be a JSON object")
    messages = normalize_messages(body.get("messages"))
    n = body.get("n")
    if n not in (None, 1):
        raise ProxyError(400, f"n={n!r}: each trajectory is one sequence of samples; ask for one choice (n=1)", param="n")
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        raise ProxyError(400, f"response_format {fmt.get('type')!r} needs constrained decoding, which changes the policy's "
                         "distribution; the proxy samples the policy as it is (ask for JSON in the prompt instead)",
                         param="response_format")
    for key in ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs"):
        if body.get(key) is not None:
            raise ProxyError(400, f"{key}: constrained decoding changes the policy's distribution; the proxy does not serve it",
                             param=key)
    sampling = {k: body[k] for k in DISTRIBUTION_FIELDS if body.get(k) is not None}
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise ProxyError(400, f"max_tokens must be a positive integer, got {max_tokens!r}", param="max_tokens")
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if not all(isinstance(s, str) for s in stops):
        raise ProxyError(400, "stop must be a string or a list of strings", param="stop")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ProxyError(400, f"seed must be an integer, got {seed!r}", param="seed")
    choice = body.get("tool_choice")
    if choice is not None and choice not in ("none", "auto", "required") and not (
            isinstance(choice, dict) and isinstance((choice.get("function") or {}).get("name"), str)):
        raise ProxyError(400, f"tool_choice {choice!r} is not 'none', 'auto', 'required' or a named function", param="tool_choice")
    options = body.get("stream_options") or {}
    top_logprobs = body.get("top_logprobs")
    if top_logprobs not in (None, 0, 1):
        raise ProxyError(400, f"top_logprobs={top_logprobs!r}: the samplers return the sampled token's logprob only (0 or 1)",
                         param="top_logprobs")
    return ChatRequest(
        messages=messages, tools=normalize_tools(body.get("tools")), tool_choice=choice, stream=bool(body.get("stream")),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")), model=str(body.get("model") or ""),
        sampling=sampling, max_tokens=max_tokens, stop=stops, seed=seed, logprobs=bool(body.get("logprobs")),
    )


# --- answers -------------------------------------------------------------------------------------------
@attrs.define
class Reply:
    """What one request is answered with (one choice)."""

    content: str | None
    tool_calls: list[dict[str, Any]]  # OpenAI shape: id, type, function {name, arguments (JSON text)}
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    model: str
    reasoning: str | None = None
    logprobs: list[dict[str, Any]] | None = None
    id: str = attrs.field(factory=lambda: f"chatcmpl-{secrets.token_hex(12)}")
    created: int = attrs.field(factory=lambda: int(time.time()))

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        return msg

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def completion_body(reply: Reply) -> dict[str, Any]:
    """The ``chat.completion`` object."""
    return {
        "id": reply.id, "object": "chat.completion", "created": reply.created, "model": reply.model,
        "choices": [{"index": 0, "message": reply.message(), "finish_reason": reply.finish_reason,
                     "logprobs": {"content": reply.logprobs} if reply.logprobs is not None else None}],
        "usage": reply.usage(),
    }


def stream_chunks(reply: Reply, include_usage: bool) -> Iterator[str]:
    """The reply as SSE events: the role, the reasoning and content, each tool call (name and
    arguments in one delta), the finish reason, the usage when asked for, then ``[DONE]``. The
    samplers return whole completions, so the events come together once the reply is sampled."""

    def event(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        chunk = {"id": reply.id, "object": "chat.completion.chunk", "created": reply.created, "model": reply.model,
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None, **extra}]}
        if include_usage:
            chunk["usage"] = None
        return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"

    yield event({"role": "assistant", "content": ""})
    if reply.reasoning:
        yield event({"reasoning_content": reply.reasoning})
    if reply.content:
        yield event({"content": reply.content},
                    **({"logprobs": {"content": reply.logprobs}} if reply.logprobs is not None else {}))
    for i, call in enumerate(reply.tool_calls):
        yield event({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                     "function": {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}}]})
    yield event({}, reply.finish_reason)
    if include_usage:
        usage = {"id": reply.id, "object": "chat.completion.chunk", "created": reply.created, "model": reply.model,
                 "choices": [], "usage": reply.usage()}
        yield f"data: {json.dumps(usage)}\n\n"
    yield "data: [DONE]\n\n"


def same_reply(sent: dict[str, Any], returned: dict[str, Any]) -> bool:
    """Whether an assistant message an agent sent back (normalized) is a reply the proxy returned
    (normalized), as it was: same content, same reasoning, same calls (names and arguments; the
    call ids are the agent's business)."""
    if (sent.get("content") or "") != (returned.get("content") or ""):
        return False
    if (sent.get("reasoning_content") or "") != (returned.get("reasoning_content") or ""):
        return False
    a, b = sent.get("tool_calls") or [], returned.get("tool_calls") or []
    return len(a) == len(b) and all(x["function"]["name"] == y["function"]["name"]
                                    and x["function"]["arguments"] == y["function"]["arguments"] for x, y in zip(a, b))
