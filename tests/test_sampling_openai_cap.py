"""The OpenAI-compatible sampler reads at most ``max_response_bytes`` of a response (issue 14):
a broken or hostile server that streams gigabytes is one clear error, not an out-of-memory."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from rlcore.errors import SamplerError
from rlcore.sampling.openai import OpenAISampler
from rlcore.types import SamplingParams


class _Flood(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()  # no Content-Length: the body keeps coming
        try:
            self.wfile.write(b'{"choices": [{"text": "')
            for _ in range(256):  # 256 MiB if nobody stops reading
                self.wfile.write(b"x" * (1 << 20))
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def flood_url() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Flood)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


async def test_a_flooding_server_is_an_error_not_an_out_of_memory(flood_url: str) -> None:
    sampler = OpenAISampler(flood_url, model="m", max_response_bytes=4 * 1024 * 1024, max_retries=0)
    try:
        with pytest.raises(SamplerError, match="sent more than 4194304 bytes"):
            await sampler.generate([1, 2, 3], SamplingParams(max_tokens=4))
    finally:
        await sampler.close() if hasattr(sampler, "close") else None
