"""Hostile completions: text a policy can write that has stalled or killed RL runs.

Use it to check that a reward, tool or environment stays bounded on model output::

    from rlcore.testing.fuzz import HOSTILE_COMPLETIONS
    for name, text in HOSTILE_COMPLETIONS.items():
        my_reward(completions=[text], answer=["5"])   # must return quickly, without a memory spike

Every entry is built lazily-cheap (string multiplication) and is at most a few megabytes. The
families: huge powers and exponent towers (arbitrary-precision arithmetic that never ends), deep
brackets (recursive parsers), megabyte strings and tag floods (regexes that are quadratic in the
number of unclosed tags), NUL bytes and invalid UTF-8 (decoders and C libraries), LaTeX bombs
(sympy simplification, macro expansion), tool-call floods in every family's format (hermes JSON,
Qwen3.5 XML, Llama 3 JSON, gpt-oss harmony, DeepSeek-V3, Gemma 4, Muse Glimmer's ATEM).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

_MB = 1_000_000

#: Lone surrogates: what ``bytes.decode("utf-8", "surrogateescape")`` makes of invalid UTF-8.
INVALID_UTF8 = bytes(range(0x80, 0x100)).decode("utf-8", "surrogateescape")

HOSTILE_COMPLETIONS: dict[str, str] = {
    # huge powers and towers
    "python_tower": "(((9**99)**99)**99)**99",
    "right_assoc_tower": "9**9**9**9",
    "latex_tower": "The answer is \\boxed{9^{9^{9^{9}}}}",
    "latex_tower_10": "\\boxed{10^{10^{10^{10^{10}}}}}",
    "factorial": "\\boxed{99999999!}",
    "huge_exponent_hash": "#### 1" + "0" * 5000,
    "huge_decimal": "#### " + "9" * 400 + "." + "9" * 400,
    "sci_notation": "\\boxed{1e999999999}",
    "power_tool_call": '<tool_call>{"name": "calculator", "arguments": {"expression": "(((9**99)**99)**99)**99"}}</tool_call>',
    # deep brackets
    "deep_parens": "(" * 100_000 + "1" + ")" * 100_000,
    "deep_braces_boxed": "\\boxed{" + "{" * 50_000 + "1" + "}" * 50_000 + "}",
    "unclosed_brackets": "[" * 200_000,
    "unclosed_braces": "{" * 100_000,
    "open_fence_spaces": "```json\n" + " " * 200_000 + "x",
    "deep_json_tool_call": "<tool_call>" + "[" * 100_000 + "</tool_call>",
    "deep_frac": "\\boxed{" + "\\frac{1}{" * 2_000 + "2" + "}" * 2_000 + "}",
    # megabyte strings and tag floods
    "megabyte_digits": "1" * _MB,
    "megabyte_words": "word " * (_MB // 5),
    "megabyte_newlines": "x" + "\n" * _MB + "#",
    "answer_tag_flood": "<answer>" * (_MB // 8),
    "think_close_flood": "<think>x" + "</think>" * (_MB // 8),
    "tool_call_flood": "<tool_call>" * (_MB // 11),
    "text_macro_flood": "\\text{" * (_MB // 6),
    "many_tool_calls": '<tool_call>{"name": "calculator", "arguments": {"expression": "9**99"}}</tool_call>' * 2_000,
    "hash_flood": "#### 1\n" * (_MB // 7),
    # NUL bytes and invalid UTF-8
    "nul_bytes": "\x00" * 10_000 + "#### 5" + "\x00" * 10_000,
    "invalid_utf8": INVALID_UTF8 * 1_000 + "\\boxed{5}",
    "lone_surrogate_tool_call": '<tool_call>{"name": "calculator", "arguments": {"expression": "1+\ud800"}}</tool_call>',
    # LaTeX bombs
    "sqrt_bomb": "\\boxed{" + "\\sqrt{" * 5_000 + "2" + "}" * 5_000 + "}",
    "left_right_flood": "\\boxed{" + "\\left(" * 20_000 + "}",
    "dollar_flood": "$" * _MB,
    "macro_bomb": "\\def\\a{\\a\\a}\\a \\boxed{\\a}",
    "integral": "\\boxed{\\int_0^{\\infty} e^{-x^{99999}} \\, dx}",
    "huge_matrix": "\\boxed{\\begin{pmatrix}" + "1 & " * 20_000 + "1\\end{pmatrix}}",
    "boxed_flood": "\\boxed{1}" * 100_000,
    # each family's tool-call format (rlcore.rollout.tool_parsers): tag floods, unclosed parts, call floods
    "xml_function_flood": "<tool_call><function=" * (_MB // 21),
    "xml_parameter_flood": "<tool_call>\n<function=calculator>\n" + "<parameter=" * (_MB // 11),
    "xml_unclosed_parameters": "<tool_call>\n<function=calculator>\n" + "<parameter=expression>\n9**99\n" * 40_000 + "</tool_call>",
    "xml_many_calls": "<tool_call>\n<function=calculator>\n<parameter=expression>\n9**99\n</parameter>\n</function>\n</tool_call>" * 2_000,
    "llama3_deep_json": '{"name": "calculator", "parameters": ' + "[" * 100_000,
    "llama3_call_flood": '{"name": "calculator", "parameters": {"expression": "9**99"}}; ' * 5_000,
    "harmony_recipient_flood": "to=functions." * (_MB // 13),
    "harmony_message_flood": "<|channel|>commentary to=functions.calculator <|constrain|>json<|message|>" * 12_000,
    "harmony_many_calls": "<|start|>assistant<|channel|>commentary to=functions.calculator <|constrain|>json<|message|>"
                          '{"expression": "9**99"}<|call|>' * 2_000,
    "deepseek_call_flood": "<｜tool▁calls▁begin｜>" + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>" * (_MB // 40),
    "deepseek_many_calls": "<｜tool▁call▁begin｜>function<｜tool▁sep｜>calculator\n```json\n"
                           '{"expression": "9**99"}\n```<｜tool▁call▁end｜>\n' * 2_000,
    "gemma_quote_flood": "<|tool_call>call:calculator{expression:" + '<|"|>' * (_MB // 5) + "}<tool_call|>",
    "gemma_deep_nesting": "<|tool_call>call:calculator{x:" + "[{x:" * 50_000 + "<tool_call|>",
    "gemma_many_calls": '<|tool_call>call:calculator{expression:<|"|>9**99<|"|>}<tool_call|>' * 2_000,
    "atem_parameter_flood": '<atem:function_calls>\n<atem:invoke name="calculator">\n'
                            + '<atem:parameter name="expression">' * (_MB // 35) + "</atem:invoke>\n</atem:function_calls>",
    "atem_many_calls": '<atem:function_calls>\n<atem:invoke name="calculator">\n<atem:parameter name="expression">9**99'
                       "</atem:parameter>\n</atem:invoke>\n</atem:function_calls>" * 2_000,
}


# --- hostile servers ----------------------------------------------------------------------------------
def flooding_http_server(prefix: bytes, *, method: str = "GET", megabytes: int = 64) -> contextlib.AbstractContextManager[str]:
    """A context manager: an HTTP server on 127.0.0.1 whose every ``method`` response starts as
    valid JSON (``prefix``) and then never ends (no Content-Length, ``megabytes`` MiB of ``x``).
    Yields its base URL. A client that reads bodies whole runs out of memory on it; a bounded one
    stops with an error. Used by the sampler's and the OpenEnv client's size-cap tests."""
    return _flooding(prefix, method, megabytes)


@contextlib.contextmanager
def _flooding(prefix: bytes, method: str, megabytes: int) -> Iterator[str]:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    def respond(handler: BaseHTTPRequestHandler) -> None:
        handler.rfile.read(int(handler.headers.get("content-length") or 0))
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.end_headers()  # no Content-Length: the body just keeps coming
        try:
            handler.wfile.write(prefix)
            for _ in range(megabytes):
                handler.wfile.write(b"x" * (1 << 20))
        except (BrokenPipeError, ConnectionResetError):
            pass

    handler_cls = type("_Flood", (BaseHTTPRequestHandler,), {f"do_{method.upper()}": respond,
                                                             "log_message": lambda self, *args: None})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler_cls)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
