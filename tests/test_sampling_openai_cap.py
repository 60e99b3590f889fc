"""The OpenAI-compatible sampler reads at most ``max_response_bytes`` of a response (issue 14):
a broken or hostile server that streams gigabytes is one clear error, not an out-of-memory."""

from __future__ import annotations

from typing import Iterator

import pytest

from rlcore.errors import SamplerError
from rlcore.sampling.openai import OpenAISampler
from rlcore.testing.fuzz import flooding_http_server
from rlcore.types import SamplingParams


@pytest.fixture
def flood_url() -> Iterator[str]:
    """Every POST answers a completion's JSON start, then 256 MiB if nobody stops reading."""
    with flooding_http_server(b'{"choices": [{"text": "', method="POST", megabytes=256) as url:
        yield url


async def test_a_flooding_server_is_an_error_not_an_out_of_memory(flood_url: str) -> None:
    sampler = OpenAISampler(flood_url, model="m", max_response_bytes=4 * 1024 * 1024, max_retries=0)
    try:
        with pytest.raises(SamplerError, match="sent more than 4194304 bytes"):
            await sampler.generate([1, 2, 3], SamplingParams(max_tokens=4))
    finally:
        await sampler.close() if hasattr(sampler, "close") else None
