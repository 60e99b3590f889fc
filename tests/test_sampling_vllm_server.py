"""The ``openai``/``vllm_server`` sampler against a test server that behaves like a real vLLM server.

vLLM cannot run here. :class:`~rlcore.testing.openai_server.OpenAICompatServer` reproduces, per
vLLM version, what a client of a real server meets (each behaviour cites the vLLM file it follows
in its docstring): omitted fields filled from the model's ``generation_config``
(``entrypoints/openai/completion/protocol.py`` ``to_sampling_params``, 0.33), raw logprobs by
default (``v1/sample/sampler.py``), no ``/collective_rpc`` before 0.10.2 (``api_server.py`` of
0.10.1 vs 0.10.2), ``{"success": false}`` from a busy ``/reset_prefix_cache`` (0.33
``serve/dev/cache/api_router.py``), ``/sleep`` aborting running requests (``mode=abort`` default,
0.17+ ``serve/sleep/api_router.py``), requests queueing while the engine sleeps.
Each test below fails on the sampler before issue #20.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
import torch

from rlcore import SamplerError, SamplingParams
from rlcore.sampling.hf.sampler import HFSampler
from rlcore.sampling.openai import OpenAISampler
from rlcore.testing.openai_server import OpenAICompatServer

QWEN_LIKE = {"top_k": 20, "repetition_penalty": 1.05, "top_p": 0.8, "temperature": 0.7}


@pytest.fixture(scope="module")
def hf(tiny_model_dir: str) -> HFSampler:
    return HFSampler(tiny_model_dir, batch_window_ms=5)


@pytest.fixture(scope="module")
def prompt(hf: HFSampler) -> list[int]:
    return hf.tokenizer.encode("how many apples are there", add_special_tokens=False)


def start(hf: HFSampler, **kw) -> OpenAICompatServer:
    return OpenAICompatServer(hf, **kw).start()


def make_client(srv: OpenAICompatServer, tiny_model_dir: str, **kw) -> OpenAISampler:
    return OpenAISampler(srv.url, tokenizer=tiny_model_dir, backoff=0.01, max_retries=1, **kw)


def trainer_logprobs(hf: HFSampler, prompt: list[int], tokens: list[int], temperature: float) -> torch.Tensor:
    """What GRPOTrainer computes: log_softmax(logits / T) of the untruncated model distribution."""
    from rlcore.algorithms.logprobs import naive_logprobs

    with torch.no_grad():
        logits = hf.model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
    return naive_logprobs(logits, torch.tensor(tokens), temperature)


# --- 3: omitted fields are filled from generation_config ---------------------------------------------
async def test_off_values_are_sent_so_generation_config_cannot_fill_them(hf, prompt, tiny_model_dir) -> None:
    srv = start(hf, generation_config=QWEN_LIKE, logprobs_mode="processed_logprobs")
    try:
        client = make_client(srv, tiny_model_dir)
        c = await client.generate(prompt, SamplingParams(max_tokens=6, temperature=1.0, seed=3))
        body, ran = srv.requests[-1], srv.effective[-1]
        assert body["top_k"] == -1 and body["min_p"] == 0.0 and body["repetition_penalty"] == 1.0
        assert body["presence_penalty"] == 0.0 and body["frequency_penalty"] == 0.0
        # what the server actually sampled with: our "off" values, not Qwen's generation_config
        assert ran["top_k"] == -1 and ran["repetition_penalty"] == 1.0 and ran["top_p"] == 1.0
        assert ran["temperature"] == 1.0 and ran["min_p"] == 0.0
        ref = trainer_logprobs(hf, prompt, c.token_ids, 1.0)
        assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4)
        await client.close()
    finally:
        srv.stop()


# --- 4: the server's logprobs mode is checked -------------------------------------------------------------
async def test_raw_logprobs_server_is_refused_at_temperature_not_one(hf, prompt, tiny_model_dir) -> None:
    srv = start(hf)  # vLLM's default: --logprobs-mode raw_logprobs
    try:
        client = make_client(srv, tiny_model_dir)
        before = len(srv.requests)
        with pytest.raises(SamplerError) as info:
            await client.generate(prompt, SamplingParams(max_tokens=4, temperature=0.7))
        msg = str(info.value)
        assert "\n" not in msg and "raw logprobs" in msg and "--logprobs-mode processed_logprobs" in msg
        assert len(srv.requests) == before  # refused before sampling anything
        c = await client.generate(prompt, SamplingParams(max_tokens=4, temperature=1.0, seed=1))  # raw == ours at T=1
        assert torch.allclose(torch.tensor(c.logprobs), trainer_logprobs(hf, prompt, c.token_ids, 1.0), atol=1e-4)
        await client.close()
    finally:
        srv.stop()


async def test_processed_server_agrees_with_the_trainer_and_refuses_truncation(hf, prompt, tiny_model_dir) -> None:
    srv = start(hf, logprobs_mode="processed_logprobs")
    try:
        client = make_client(srv, tiny_model_dir)
        c = await client.generate(prompt, SamplingParams(max_tokens=6, temperature=0.7, seed=4))
        assert client.server_logprobs_mode == "processed_logprobs" and client.server_version == (0, 33, 0)
        assert torch.allclose(torch.tensor(c.logprobs), trainer_logprobs(hf, prompt, c.token_ids, 0.7), atol=1e-4)
        for bad in (dict(top_p=0.9), dict(top_k=5), dict(min_p=0.1), dict(repetition_penalty=1.1)):
            with pytest.raises(SamplerError, match="renormalise over the kept tokens"):
                await client.generate(prompt, SamplingParams(max_tokens=2, temperature=0.7, **bad))
        await client.close()
    finally:
        srv.stop()


async def test_unknown_logprobs_mode_warns_once(hf, prompt, tiny_model_dir, caplog) -> None:
    srv = start(hf, dev_mode=False)  # no /server_info: the mode cannot be read
    try:
        client = make_client(srv, tiny_model_dir)
        with caplog.at_level(logging.WARNING, logger="rlcore.sampling.openai"):
            await client.generate(prompt, SamplingParams(max_tokens=2, temperature=0.7))
            await client.generate(prompt, SamplingParams(max_tokens=2, temperature=0.7))
        warnings = [r for r in caplog.records if "logprobs mode" in r.getMessage()]
        assert len(warnings) == 1 and "--logprobs-mode processed_logprobs" in warnings[0].getMessage()
        await client.close()
    finally:
        srv.stop()


# --- 5: /collective_rpc before 0.10.2 --------------------------------------------------------------------
async def test_collective_rpc_missing_on_old_vllm_is_named(hf, tiny_model_dir, tmp_path) -> None:
    srv = start(hf, version="0.10.1.1")
    try:
        client = make_client(srv, tiny_model_dir, sync_dir=str(tmp_path))
        with pytest.raises(SamplerError) as info:
            client.update_weights({"lm_head.weight": hf.model.lm_head.weight.detach().clone()})
        assert "vLLM 0.10.1" in str(info.value) and "0.10.2" in str(info.value)
        assert "VLLM_SERVER_DEV_MODE" not in str(info.value)
    finally:
        srv.stop()


# --- 6: a busy /reset_prefix_cache --------------------------------------------------------------------
async def test_reset_prefix_cache_preempts_running_requests_and_checks_success(hf, tiny_model_dir, tmp_path) -> None:
    srv = start(hf)
    try:
        client = make_client(srv, tiny_model_dir, sync_dir=str(tmp_path))
        srv.busy = True  # another client's requests hold KV blocks
        client.update_weights({"lm_head.weight": hf.model.lm_head.weight.detach().clone()})
        assert srv.prefix_cache_resets == 1  # reset_running_requests=true let vLLM preempt them
        srv.kv_transfers_in_flight = True  # 0.33: success=false while async KV offload transfers hold blocks
        with pytest.raises(SamplerError, match="success=false after 4 tries"):
            client.reset_prefix_cache()
        assert srv.prefix_cache_resets == 1
    finally:
        srv.stop()


# --- 8: sleep state --------------------------------------------------------------------------------------
async def _running_generation(client, srv, prompt) -> asyncio.Task:
    """A 48-token generation the server is running right now (no stop token can end it early)."""
    task = asyncio.create_task(client.generate(prompt, SamplingParams(max_tokens=48, stop_token_ids=[-1])))
    while not srv.running:
        await asyncio.sleep(0.005)
    return task


async def test_generate_while_asleep_fails_at_once(hf, prompt, tiny_model_dir) -> None:
    srv = start(hf, hang_s=3.0)
    try:
        client = make_client(srv, tiny_model_dir)
        client.sleep()
        before = len(srv.requests)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(SamplerError, match=r"put to sleep.*call wake_up\(\)"):
            await client.generate(prompt, SamplingParams(max_tokens=2))
        assert loop.time() - t0 < 1.0 and len(srv.requests) == before  # never queued behind the sleeping engine
        client.wake_up()
        assert len((await client.generate(prompt, SamplingParams(max_tokens=2))).token_ids) >= 1
        await client.close()
    finally:
        srv.stop()


async def test_sleep_waits_for_running_requests_instead_of_aborting_them(hf, prompt, tiny_model_dir) -> None:
    srv = start(hf)
    try:
        client = make_client(srv, tiny_model_dir)
        task = await _running_generation(client, srv, prompt)
        await asyncio.to_thread(client.sleep)
        c = await task
        assert c.finish_reason == "length" and len(c.token_ids) == 48
        assert srv.sleep_calls[-1] == {"level": 1, "mode": "wait"}
        client.wake_up()
        await client.close()
    finally:
        srv.stop()


async def test_aborted_completion_is_an_error_not_a_result(hf, prompt, tiny_model_dir) -> None:
    srv = start(hf)
    try:
        client = make_client(srv, tiny_model_dir)
        task = await _running_generation(client, srv, prompt)
        import httpx

        await asyncio.to_thread(httpx.post, srv.url + "/sleep", params={"level": 1})  # someone else, mode=abort
        with pytest.raises(SamplerError, match="finish_reason='abort'"):
            await task
        await asyncio.to_thread(httpx.post, srv.url + "/wake_up")
        await client.close()
    finally:
        srv.stop()


async def test_update_weights_while_asleep_wakes_the_weights_first(hf, prompt, tiny_model_dir, tmp_path) -> None:
    srv = start(hf)
    try:
        client = make_client(srv, tiny_model_dir, sync_dir=str(tmp_path))
        original = hf.model.lm_head.weight.detach().clone()
        client.sleep()
        client.update_weights({"lm_head.weight": original * 1.0})
        assert srv.wake_calls == [["weights"]] and srv.weight_syncs == 1
        with pytest.raises(SamplerError, match="put to sleep"):
            await client.generate(prompt, SamplingParams(max_tokens=2))  # the KV cache still sleeps
        client.wake_up()
        assert srv.wake_calls[-1] == ["kv_cache"] and not srv.sleeping
        client.sleep(level=2)
        client.wake_up()
        with pytest.raises(SamplerError, match="discarded the server's weights"):
            await client.generate(prompt, SamplingParams(max_tokens=2))
        client.update_weights(dict(hf.model.state_dict()))
        assert len((await client.generate(prompt, SamplingParams(max_tokens=2))).token_ids) >= 1
        await client.close()
    finally:
        srv.stop()
