"""Run inside a subprocess with an unpacked vLLM wheel on ``sys.path`` (see test_vllm_real_modules.py).

Exercises vLLM's own pure-Python modules on the CPU and prints one JSON object: what
``collective_rpc`` arguments become after vLLM's msgpack round trip, which of our requests vLLM's
``SamplingParams`` accepts, and vLLM's real ``Sampler`` logprobs per mode for a grid of settings.
Not collected by pytest (no ``test_`` prefix).
"""

from __future__ import annotations

import inspect
import json
import sys

import torch


def msgpack_probe() -> dict:
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    enc, dec = MsgpackEncoder(), MsgpackDecoder()  # untyped: how the engine core decodes utility calls
    call = ("collective_rpc", ("rlcore_load_weights_from_path", None, ("/dev/shm/x.safetensors",), {}))
    path_arg = dec.decode(enc.encode(call))[1][2][0]
    tensor_arg = dec.decode(enc.encode(("collective_rpc", ("m", None, ([("w", torch.ones(2, 3))],), {}))))[1][2][0][0][1]
    return {"path_type": type(path_arg).__name__, "path": path_arg, "tensor_type": type(tensor_arg).__name__}


def sampling_params_probe(grid: list[dict]) -> list[str | None]:
    from vllm import SamplingParams

    out = []
    for kw in grid:
        try:
            SamplingParams(**kw)
            out.append(None)
        except Exception as exc:  # noqa: BLE001
            out.append(str(exc).splitlines()[0])
    return out


def sampler_probe(cases: list[dict]) -> list[list[float] | str] | str:
    try:
        from vllm.v1.sample.logits_processor import LogitsProcessors
        from vllm.v1.sample.metadata import SamplingMetadata
        from vllm.v1.sample.sampler import Sampler
    except Exception as exc:  # noqa: BLE001 - some versions need GPU-only packages here
        return f"{type(exc).__name__}: {exc}"
    try:
        from vllm.config import LogprobsMode
    except ImportError:
        LogprobsMode = None  # noqa: N806
    sig = inspect.signature(SamplingMetadata).parameters
    results = []
    for case in cases:
        logits = torch.tensor(case["logits"])
        t = case["temperature"]
        kw = dict(
            temperature=torch.tensor([t]), all_greedy=t == 0, all_random=t != 0,
            top_p=None if case["top_p"] >= 1 else torch.tensor([case["top_p"]]),
            top_k=None if case["top_k"] <= 0 else torch.tensor([case["top_k"]]),
            generators={}, max_num_logprobs=0, no_penalties=case["repetition_penalty"] == 1.0,
            prompt_token_ids=torch.tensor([case["prompt"]]), frequency_penalties=torch.zeros(1),
            presence_penalties=torch.zeros(1), repetition_penalties=torch.tensor([case["repetition_penalty"]]),
            output_token_ids=[case["output"]], allowed_token_ids_mask=None, bad_words_token_ids={},
            logitsprocs=LogitsProcessors(),
        )
        kw = {k: v for k, v in kw.items() if k in sig}
        for k, p in sig.items():
            if k not in kw and p.default is inspect.Parameter.empty:
                kw[k] = None
        mode = case["mode"] if LogprobsMode is None or not hasattr(LogprobsMode, "__members__") else LogprobsMode(case["mode"])
        try:
            out = Sampler(logprobs_mode=mode)(logits[None].clone(), SamplingMetadata(**kw))
        except Exception as exc:  # noqa: BLE001 - e.g. penalties call a compiled op (vllm._C) absent on CPU
            results.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            continue
        results.append([float(out.sampled_token_ids[0, 0]), float(out.logprobs_tensors.logprobs[0, 0])])
    return results


if __name__ == "__main__":
    spec = json.loads(sys.stdin.read())
    try:  # vLLM imports uvloop at module level to run its servers; nothing probed here uses it, and
        import uvloop  # noqa: F401  # installing it would switch every uvicorn in the test suite to it
    except ImportError:
        import types

        sys.modules["uvloop"] = types.ModuleType("uvloop")
    import vllm

    print(json.dumps({
        "version": getattr(vllm, "__version__", None),
        "msgpack": msgpack_probe(),
        "sampling_params": sampling_params_probe(spec["grid"]),
        "sampler": sampler_probe(spec["cases"]),
    }))
