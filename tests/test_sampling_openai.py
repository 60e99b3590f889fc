"""The ``openai`` sampler against a real HTTP server on 127.0.0.1 serving the real tiny model."""

from __future__ import annotations

import asyncio
import socket

import pytest
import torch

import rlcore
from rlcore import SamplerError, SamplingParams
from rlcore.sampling.hf.sampler import HFSampler
from rlcore.sampling.openai import OpenAISampler
from rlcore.testing.openai_server import OpenAICompatServer


@pytest.fixture(scope="module")
def server(tiny_model_dir: str):
    # a correctly started vLLM server: --logprobs-mode processed_logprobs (the tests below that need
    # vLLM's defaults start their own)
    srv = OpenAICompatServer(HFSampler(tiny_model_dir, batch_window_ms=10), logprobs_mode="processed_logprobs").start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server: OpenAICompatServer, tiny_model_dir: str) -> OpenAISampler:
    return OpenAISampler(server.url + "/v1", tokenizer=tiny_model_dir, backoff=0.01, max_retries=3)


@pytest.fixture(scope="module")
def prompt(server: OpenAICompatServer) -> list[int]:
    tok = server.sampler.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "how many apples"}], tokenize=False, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False)


async def test_token_ids_and_logprobs_round_trip(server, client, prompt) -> None:
    params = SamplingParams(max_tokens=8, temperature=0.9, seed=5, stop_token_ids=[-1])
    c = await client.generate(prompt, params)
    body = server.requests[-1]
    assert body["prompt"] == prompt and body["logprobs"] == 1 and body["return_tokens_as_token_ids"] is True
    assert body["seed"] == 5 and body["max_tokens"] == 8
    assert client.model == "rlcore-tiny"  # discovered from /v1/models
    direct = await server.sampler.generate(prompt, params)  # same seed, same model, no HTTP
    assert c.token_ids == direct.token_ids and c.finish_reason == "length" == direct.finish_reason
    assert c.logprobs == pytest.approx(direct.logprobs, abs=1e-6)
    assert c.text == direct.text
    ids = torch.tensor([prompt + c.token_ids])
    with torch.no_grad():
        logits = server.sampler.model(ids).logits[0, len(prompt) - 1 : -1] / 0.9
    ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(c.token_ids)[:, None]).squeeze(1)
    assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4)


async def test_n_and_batch_go_in_one_request(server, client, prompt) -> None:
    before = len(server.requests)
    grid = await client.generate_batch([prompt, prompt[:-2]], SamplingParams(max_tokens=4, n=3, seed=1))
    assert len(server.requests) == before + 1
    assert [len(r) for r in grid] == [3, 3]
    assert all(len(c.token_ids) == len(c.logprobs) >= 1 for r in grid for c in r)
    many = await client.generate_n(prompt, SamplingParams(max_tokens=4, n=2, seed=1))
    assert [c.token_ids for c in many] == [c.token_ids for c in grid[0][:2]]


async def test_concurrent_calls_share_the_pool_and_get_batched(server, client, prompt) -> None:
    sizes_before = len(server.sampler.batch_sizes)
    outs = await asyncio.gather(*(client.generate(prompt, SamplingParams(max_tokens=3)) for _ in range(12)))
    assert all(len(o.token_ids) >= 1 for o in outs)
    assert max(server.sampler.batch_sizes[sizes_before:]) > 1


async def test_retries_503_and_429_then_succeeds(server, client, prompt) -> None:
    before = len(server.requests)
    server.faults.extend([503, 429, 503])
    c = await client.generate(prompt, SamplingParams(max_tokens=2))
    assert len(c.token_ids) >= 1
    assert len(server.requests) == before + 4  # three injected failures, then the answer


async def test_gives_up_after_bounded_retries(server, client, prompt) -> None:
    server.faults.extend([503] * 10)
    try:
        with pytest.raises(SamplerError, match=r"failed after 4 attempts \(503"):
            await client.generate(prompt, SamplingParams(max_tokens=2))
    finally:
        server.faults.clear()


async def test_client_errors_are_not_retried(server, tiny_model_dir, prompt) -> None:
    bad = OpenAISampler(server.url, model="no-such-model", backoff=0.01)
    before = len(server.requests)
    with pytest.raises(SamplerError, match="answered 404: The model `no-such-model` does not exist"):
        await bad.generate(prompt, SamplingParams(max_tokens=2))
    assert len(server.requests) == before + 1


async def test_server_down_is_one_clear_error(prompt) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = OpenAISampler(f"http://127.0.0.1:{port}", model="m", max_retries=2, backoff=0.01)
    with pytest.raises(SamplerError, match=rf"127.0.0.1:{port}/v1/completions failed after 3 attempts \(ConnectError.*is the server up\?"):
        await down.generate(prompt, SamplingParams(max_tokens=2))
    with pytest.raises(SamplerError, match="unreachable"):
        down.reset_prefix_cache()


async def test_weight_sync_through_collective_rpc(server, client, prompt, tmp_path) -> None:
    params = SamplingParams(max_tokens=4, temperature=1.0, seed=2, stop_token_ids=[-1])
    before = await client.generate(prompt, params)
    original = {k: v.clone() for k, v in server.sampler.model.state_dict().items()}
    client.sync_dir = str(tmp_path)
    changed = {k: v + 0.5 * torch.randn_like(v) if "down_proj" in k else v for k, v in original.items()}
    try:
        client.update_weights(changed)
        assert server.weight_syncs == 1 and server.prefix_cache_resets == 1 and client.policy_version == 1
        w = "model.layers.1.mlp.down_proj.weight"
        assert torch.equal(server.sampler.model.state_dict()[w], changed[w])
        after = await client.generate(prompt, params)
        assert after.logprobs[0] != pytest.approx(before.logprobs[0], abs=1e-4)
        with pytest.raises(SamplerError, match="full weights only"):
            client.update_weights(changed, lora=True)
    finally:
        client.update_weights(original)
    assert (await client.generate(prompt, params)).token_ids == before.token_ids
    client.sleep()
    assert server.sleeping
    client.wake_up()
    assert not server.sleeping


def test_registered_with_alias() -> None:
    assert rlcore.get("sampler", "openai") is OpenAISampler
    assert rlcore.get("sampler", "vllm_server") is OpenAISampler
