"""The ``vllm`` backend's pure logic, exercised without vLLM (it cannot be installed on CPU CI).

The output objects below are shaped like vLLM's ``RequestOutput`` / ``CompletionOutput`` /
``Logprob`` (attributes named as in vLLM's docs) — stand-ins for a library that is absent, not
mocks of our own code.
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch

import rlcore
from rlcore import MissingDependencyError, SamplingParams
from rlcore.sampling.vllm.engine import (
    INSTALL_HINT,
    WORKER_EXTENSION,
    VLLMSampler,
    engine_kwargs,
    request_output_to_completions,
    sampling_kwargs,
)
from rlcore.sampling.vllm.worker import WeightSyncExtension, read_weights, write_weights

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def logprob(v: float) -> SimpleNamespace:
    return SimpleNamespace(logprob=v, rank=1, decoded_token=None)


def test_engine_kwargs_carry_seed_001_args_and_the_worker_extension() -> None:
    kw = engine_kwargs("/m", gpu_memory_utilization=0.4, max_model_len=2048, tensor_parallel_size=2,
                       engine_args={"enforce_eager": True, "seed": 7})
    assert kw["model"] == "/m" and kw["gpu_memory_utilization"] == 0.4 and kw["max_model_len"] == 2048
    assert kw["tensor_parallel_size"] == 2 and kw["enable_sleep_mode"] is True
    assert kw["worker_extension_cls"] == WORKER_EXTENSION == "rlcore.sampling.vllm.worker.WeightSyncExtension"
    assert kw["enforce_eager"] is True and kw["seed"] == 7  # passthrough wins
    assert kw["logprobs_mode"] == "processed_logprobs"
    assert "max_model_len" not in engine_kwargs("/m") and "logprobs_mode" not in engine_kwargs("/m", logprobs_mode=None)


def test_sampling_kwargs_map_every_field() -> None:
    p = SamplingParams(max_tokens=9, temperature=0.7, top_p=0.9, top_k=0, min_p=0.05, n=4, seed=3,
                       stop=["\n\n"], stop_token_ids=[2], repetition_penalty=1.1, min_tokens=1)
    kw = sampling_kwargs(p)
    assert kw == {
        "n": 4, "max_tokens": 9, "temperature": 0.7, "top_p": 0.9, "top_k": -1, "min_p": 0.05,
        "repetition_penalty": 1.1, "min_tokens": 1, "stop": ["\n\n"], "stop_token_ids": [2], "logprobs": 0,
        "skip_special_tokens": False, "include_stop_str_in_output": False, "seed": 3,
    }
    assert sampling_kwargs(SamplingParams(top_k=20))["top_k"] == 20
    assert "seed" not in sampling_kwargs(SamplingParams())


def test_request_output_to_completions() -> None:
    out = SimpleNamespace(request_id="r1", outputs=[
        SimpleNamespace(index=1, text="b", token_ids=[7, 8], finish_reason="length", stop_reason=None,
                        logprobs=[{7: logprob(-0.5)}, {8: logprob(-1.5), 3: logprob(-0.1)}]),
        SimpleNamespace(index=0, text="a", token_ids=(5, 2), finish_reason="stop", stop_reason=2,
                        logprobs=[{5: logprob(-0.25)}, {2: logprob(-2.0)}]),
    ])
    first, second = request_output_to_completions(out, {"policy_version": 3})
    assert (first.token_ids, first.logprobs, first.finish_reason, first.text) == ([5, 2], [-0.25, -2.0], "stop", "a")
    assert first.meta == {"policy_version": 3, "stop": 2, "request_id": "r1"}
    assert second.logprobs == [-0.5, -1.5] and second.finish_reason == "length"


def test_missing_logprobs_become_none_not_misaligned() -> None:
    out = SimpleNamespace(request_id="r", outputs=[
        SimpleNamespace(index=0, text="", token_ids=[1, 2], finish_reason="stop", stop_reason=None,
                        logprobs=[{1: logprob(-1.0)}, {9: logprob(-1.0)}]),
        SimpleNamespace(index=1, text="", token_ids=[1], finish_reason="stop", stop_reason=None, logprobs=None),
    ])
    a, b = request_output_to_completions(out)
    assert a.logprobs is None and not a.logprobs_complete and b.logprobs is None


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_listed_without_vllm_and_fails_with_the_install_line(tiny_model_dir: str) -> None:
    assert "vllm" in rlcore.available("sampler")
    assert rlcore.get("sampler", "vllm") is VLLMSampler
    with pytest.raises(MissingDependencyError) as info:
        VLLMSampler(tiny_model_dir)
    assert str(info.value) == INSTALL_HINT and "pip install 'rlcore[vllm]'" in str(info.value)
    assert "\n" not in str(info.value)


class _VLLMStyleModel:
    """A model exposing vLLM's ``load_weights(weights: Iterable[(name, tensor)])`` over a real module."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def load_weights(self, weights):
        params = dict(self.module.named_parameters())
        with torch.no_grad():
            for name, t in weights:
                params[name].copy_(t)


def test_worker_extension_loads_weights_written_for_a_server(tmp_path) -> None:
    module = torch.nn.Linear(3, 2)
    worker = type("Worker", (WeightSyncExtension,), {})()
    worker.model_runner = SimpleNamespace(model=_VLLMStyleModel(module))
    new = {"weight": torch.ones(2, 3), "bias": torch.full((2,), 0.5)}
    path = write_weights(new, str(tmp_path))
    assert set(read_weights(str(tmp_path))) == {"weight", "bias"}
    assert worker.rlcore_load_weights_from_path(path) == 2
    assert torch.equal(module.weight, new["weight"]) and torch.equal(module.bias, new["bias"])


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_VLLM, reason="needs vLLM")
async def test_vllm_logprobs_match_a_forward_pass(tiny_model_dir: str) -> None:  # pragma: no cover - GPU CI
    from transformers import AutoModelForCausalLM

    s = VLLMSampler(tiny_model_dir, gpu_memory_utilization=0.3, max_model_len=512, dtype="float32",
                    engine_args={"enforce_eager": True})
    prompt = s.tokenizer.encode("how many apples", add_special_tokens=False)
    c = await s.generate(prompt, SamplingParams(max_tokens=8, temperature=1.0, seed=1))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + c.token_ids])).logits[0, len(prompt) - 1 : -1]
    ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(c.token_ids)[:, None]).squeeze(1)
    assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-3)
    s.update_weights(model.state_dict())
    s.sleep()
    s.wake_up()
    await s.close()
