"""The in-process ``vllm`` sampler against a stand-in for vLLM shaped by vLLM's real source.

vLLM needs a GPU and is absent here; the ``vllm_standin`` fixture (rlcore's pytest plugin) installs
:func:`rlcore.testing.vllm_standin.make_vllm_module`, whose docstring cites, per behaviour, the
vLLM version and file it reproduces (``v1/serial_utils.py`` for what ``collective_rpc`` arguments
become in the engine process, ``v1/sample/sampler.py`` for the logprob modes,
``sampling_params.py`` for request validation, ``entrypoints/llm.py`` for sleep / reset / shutdown).
Each test fails on the sampler as it was before issue #20.
"""

from __future__ import annotations

import asyncio
import os
import types

import pytest
import torch

from rlcore import SamplerError, SamplingParams
from rlcore.algorithms.logprobs import naive_logprobs
from rlcore.sampling.vllm.engine import VLLMSampler, engine_kwargs
from rlcore.sampling.vllm.support import PROCESSED, RAW, logprob_mismatch
from rlcore.sampling.vllm.worker import WeightSyncExtension, write_weights


@pytest.fixture
def prompt() -> list[int]:
    return [5, 17, 33, 8, 41, 12]


def trainer_logprobs(llm, prompt: list[int], tokens: list[int], temperature: float) -> torch.Tensor:
    """What GRPOTrainer computes: log_softmax(logits / T) of the untruncated model distribution."""
    with torch.no_grad():
        logits = llm.hf(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
    return naive_logprobs(logits, torch.tensor(tokens), temperature)


def shifted_state(llm, delta: float = 0.01) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() + delta for k, v in llm.hf.state_dict().items()}


# --- 1: weights cross vLLM's msgpack path -------------------------------------------------------------
@pytest.mark.parametrize("version", ["0.10.2", "0.33.0"])
def test_weight_sync_survives_the_engine_process_boundary(vllm_standin, tiny_model_dir, version) -> None:
    vllm_standin(version)
    s = VLLMSampler(tiny_model_dir)
    new = shifted_state(s.llm)
    s.update_weights(new)
    for k, v in s.llm.hf.state_dict().items():
        assert torch.equal(v, new[k]), k
    assert s.llm.rpc_calls and all(isinstance(a[0], str) for _, a in s.llm.rpc_calls)  # a path crossed, not tensors
    assert s.policy_version == 1 and s.llm.prefix_cache_resets == 1
    assert not os.listdir(s.sync_dir)  # buckets are removed once loaded
    asyncio.run(s.close())


def test_weights_go_in_bounded_buckets(vllm_standin, tiny_model_dir) -> None:
    vllm_standin()
    s = VLLMSampler(tiny_model_dir, bucket_bytes=64 * 1024)
    new = shifted_state(s.llm, 0.02)
    s.update_weights(new)
    assert len(s.llm.rpc_calls) > 1
    assert torch.equal(s.llm.hf.state_dict()["lm_head.weight"], new["lm_head.weight"])
    asyncio.run(s.close())


# --- 2: one logprob semantics ----------------------------------------------------------------------------
async def test_processed_logprobs_equal_the_trainers(vllm_standin, tiny_model_dir, prompt) -> None:
    vllm_standin("0.33.0")
    s = VLLMSampler(tiny_model_dir)
    for t in (0.7, 1.0):
        c = await s.generate(prompt, SamplingParams(max_tokens=6, temperature=t, seed=3, stop_token_ids=[-1]))
        assert torch.allclose(torch.tensor(c.logprobs), trainer_logprobs(s.llm, prompt, c.token_ids, t), atol=1e-5)
    await s.close()


async def test_truncation_with_processed_logprobs_is_refused(vllm_standin, tiny_model_dir, prompt) -> None:
    vllm_standin("0.33.0")
    s = VLLMSampler(tiny_model_dir)
    # what vLLM would have returned: renormalised over the kept tokens, not the trainer's value
    from rlcore.testing.vllm_standin import token_logprobs

    sp = s._vllm.SamplingParams(temperature=0.7, top_p=0.5)
    toks = [int(torch.argmax(s.llm.hf(torch.tensor([prompt])).logits[0, -1]))]
    biased = token_logprobs(s.llm.hf, prompt, toks, sp, PROCESSED, (0, 33, 0))
    assert abs(biased[0] - float(trainer_logprobs(s.llm, prompt, toks, 0.7)[0])) > 1e-3
    for bad in (dict(top_p=0.5), dict(top_k=4), dict(min_p=0.2), dict(repetition_penalty=1.2), dict(min_tokens=2)):
        with pytest.raises(SamplerError) as info:
            await s.generate(prompt, SamplingParams(max_tokens=4, temperature=0.7, **bad))
        assert "\n" not in str(info.value) and "trainer does not compute" in str(info.value)
    assert s.llm.generate_calls == 0
    await s.close()


async def test_raw_logprobs_at_temperature_one_allow_truncation(vllm_standin, tiny_model_dir, prompt) -> None:
    vllm_standin("0.33.0")
    s = VLLMSampler(tiny_model_dir, logprobs_mode=RAW)
    c = await s.generate(prompt, SamplingParams(max_tokens=6, temperature=1.0, top_k=5, top_p=0.9, seed=1))
    assert torch.allclose(torch.tensor(c.logprobs), trainer_logprobs(s.llm, prompt, c.token_ids, 1.0), atol=1e-5)
    with pytest.raises(SamplerError, match="ignore temperature=0.7"):
        await s.generate(prompt, SamplingParams(max_tokens=2, temperature=0.7))
    await s.close()


def test_vllm_older_than_the_supported_range_is_refused(vllm_standin, tiny_model_dir) -> None:
    vllm_standin("0.10.1.1")
    with pytest.raises(SamplerError, match=r"needs vLLM >=0.10.2,<0.34, found 0.10.1.1"):
        VLLMSampler(tiny_model_dir)


def test_logprob_rule_per_vllm_version() -> None:
    sp = SamplingParams
    assert logprob_mismatch(sp(temperature=0.7), PROCESSED, (0, 11, 0)) is None
    assert logprob_mismatch(sp(temperature=0.7), PROCESSED, (0, 10, 1)) is not None  # pre-temperature there
    assert logprob_mismatch(sp(temperature=1.0), PROCESSED, (0, 10, 1)) is None
    assert logprob_mismatch(sp(temperature=1.0, repetition_penalty=1.1), PROCESSED, (0, 10, 1)) is not None
    assert logprob_mismatch(sp(temperature=0.0), PROCESSED, (0, 10, 2)) is not None  # greedy rows / -1 temperature
    assert logprob_mismatch(sp(temperature=0.0), PROCESSED, (0, 11, 0)) is None
    assert logprob_mismatch(sp(temperature=0.7, top_p=0.9), PROCESSED, (0, 33, 0)) is not None
    assert logprob_mismatch(sp(temperature=1.0, top_p=0.9), RAW, (0, 33, 0)) is None
    assert logprob_mismatch(sp(temperature=0.7), RAW, (0, 33, 0)) is not None
    assert logprob_mismatch(sp(temperature=0.7), None, None) is not None  # vLLM's default is raw
    assert logprob_mismatch(sp(), "processed_logits", None) is not None


# --- 7: one bad request fails alone ----------------------------------------------------------------------
async def test_one_invalid_request_fails_alone(vllm_standin, tiny_model_dir, prompt) -> None:
    vllm_standin("0.33.0")
    s = VLLMSampler(tiny_model_dir, batch_window_ms=100)
    good = SamplingParams(max_tokens=3, temperature=1.0, seed=2)
    results = await asyncio.gather(
        s.generate_n(prompt, SamplingParams(max_tokens=3, temperature=0.0, n=2)),  # vLLM: n must be 1 for greedy
        s.generate(prompt, good),
        s.generate(prompt, SamplingParams(max_tokens=3, temperature=3.0)),  # vLLM >= 0.25: temperature in [0, 2]
        s.generate([5, 10**6], good),  # a prompt vLLM rejects inside generate()
        s.generate(prompt, good),
        return_exceptions=True,
    )
    greedy, ok, hot, oov, ok2 = results
    assert isinstance(greedy, SamplerError) and "n must be 1 when using greedy sampling" in str(greedy)
    assert isinstance(hot, SamplerError) and "temperature must be in [0, 2]" in str(hot)
    assert isinstance(oov, SamplerError) and "out of vocabulary" in str(oov)
    assert len(ok.token_ids) == 3 and ok2.token_ids == ok.token_ids
    await s.close()


# --- 8: sleep state ----------------------------------------------------------------------------------------
async def test_generate_while_asleep_fails_at_once_and_wake_up_does_not_deadlock(vllm_standin, tiny_model_dir, prompt) -> None:
    vllm_standin("0.33.0", hang_s=3.0)
    s = VLLMSampler(tiny_model_dir)
    s.sleep()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(SamplerError, match=r"asleep \(sleep\(level=1\)\); call wake_up\(\)"):
        await s.generate(prompt, SamplingParams(max_tokens=2))
    assert loop.time() - t0 < 1.0 and s.llm.generate_calls == 0
    await asyncio.wait_for(asyncio.to_thread(s.wake_up), 2.0)
    assert len((await s.generate(prompt, SamplingParams(max_tokens=2))).token_ids) >= 1
    await s.close()


async def test_update_weights_while_asleep_and_after_level_2(vllm_standin, tiny_model_dir, prompt) -> None:
    vllm_standin("0.33.0")
    s = VLLMSampler(tiny_model_dir)
    new = shifted_state(s.llm)
    s.sleep(level=1)
    s.update_weights(new)  # weights are woken first; the stand-in fails writes into offloaded weights
    assert s.llm.sleeping == {"kv_cache"} and s.is_sleeping
    s.wake_up()
    assert not s.llm.sleeping and torch.equal(s.llm.hf.state_dict()["lm_head.weight"], new["lm_head.weight"])
    s.sleep(level=2)
    s.wake_up()
    with pytest.raises(SamplerError, match=r"sleep\(level=2\) discarded the weights"):
        await s.generate(prompt, SamplingParams(max_tokens=2))
    s.update_weights(new)
    c = await s.generate(prompt, SamplingParams(max_tokens=3, seed=0))
    assert all(torch.isfinite(torch.tensor(c.logprobs)))
    await s.close()


# --- 6 (in process): the prefix-cache reset is checked ------------------------------------------------------
def test_prefix_cache_reset_result_is_checked(vllm_standin, tiny_model_dir) -> None:
    vllm_standin("0.33.0")
    s = VLLMSampler(tiny_model_dir)
    s.llm.running = 2  # requests holding blocks: 0.13+ preempts them with reset_running_requests=True
    s.reset_prefix_cache()
    assert s.llm.prefix_cache_resets == 1
    asyncio.run(s.close())
    vllm_standin("0.11.0")
    s = VLLMSampler(tiny_model_dir)
    s.llm.running = 2  # 0.11 has no reset_running_requests: reset_prefix_cache() returns False
    with pytest.raises(SamplerError, match="refused to reset its prefix cache"):
        s.reset_prefix_cache()
    asyncio.run(s.close())


# --- 9: colocated memory share ------------------------------------------------------------------------------
def test_colocated_engine_takes_a_trainer_friendly_memory_share(vllm_standin, tiny_model_dir) -> None:
    vllm_standin()
    assert engine_kwargs("/m")["gpu_memory_utilization"] == 0.3
    s = VLLMSampler(tiny_model_dir)
    assert s.llm.kwargs["gpu_memory_utilization"] == 0.3
    asyncio.run(s.close())


# --- 10: tensor parallelism and close() -------------------------------------------------------------------
async def test_tensor_parallel_ranks_each_load_their_shard_and_close_shuts_down(vllm_standin, tiny_model_dir, prompt) -> None:
    vllm_standin()
    s = VLLMSampler(tiny_model_dir, tensor_parallel_size=2)
    new = shifted_state(s.llm, 0.03)
    s.update_weights(new)
    names = set(new)
    assert [set(w.model_runner.model.loaded) for w in s.llm.workers] == [names, names]
    assert torch.equal(s.llm.hf.state_dict()["model.embed_tokens.weight"], new["model.embed_tokens.weight"])
    llm, sync_dir = s.llm, s.sync_dir
    await s.close()
    assert llm.llm_engine.engine_core.shut_down and s.llm is None and not os.path.exists(sync_dir)
    with pytest.raises(SamplerError, match="closed"):
        await s.generate(prompt, SamplingParams(max_tokens=2))


def _rss_anon_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise RuntimeError("no RssAnon")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="Linux /proc needed to read RssAnon")
def test_each_rank_streams_the_weight_file_without_private_copies(tmp_path) -> None:
    """A rank keeps only the tensor in hand, memory-mapped from the shared file (no private copy),
    like vLLM's weight loaders that narrow each tensor to the rank's shard. (A regression guard:
    with safetensors >= 0.4 the old whole-file ``load_file`` was memory-mapped too; what the old
    in-process path did wrong was shipping the whole state dict to every rank through
    ``collective_rpc`` — see the tensor-parallel test above.)"""
    n, shape = 24, (1024, 1024)  # 24 × 4 MiB = 96 MiB
    path = write_weights({f"w{i}": torch.full(shape, float(i)) for i in range(n)}, str(tmp_path))

    class ShardModel:
        def __init__(self, rank: int) -> None:
            self.rank, self.peak, self.shards = rank, 0, []
            self.base = _rss_anon_kb()  # before the worker opens the file

        def load_weights(self, weights):
            base = self.base
            for _name, t in weights:
                self.shards.append(float(t[self.rank * 512, 0]))  # keep only what this rank needs
                self.peak = max(self.peak, _rss_anon_kb() - base)

    for rank in range(2):
        worker = type("Worker", (WeightSyncExtension,), {})()
        worker.model_runner = types.SimpleNamespace(model=ShardModel(rank))
        assert worker.rlcore_load_weights_from_path(path) == n
        model = worker.model_runner.model
        assert sorted(model.shards) == [float(i) for i in range(n)]
        assert model.peak < 40 * 1024, f"rank {rank} held {model.peak // 1024} MiB of a 96 MiB file"
