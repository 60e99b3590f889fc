"""Optional: the vLLM stand-ins checked against vLLM's own pure-Python modules from unpacked wheels.

vLLM cannot be installed here, but several of its modules import on a CPU from an unpacked wheel
(``pip download vllm==X --no-deps``; unzip ``vllm/*.py``; their pure-Python dependencies — msgspec,
pyzmq, cbor2, blake3, gguf, pybase64, setproctitle, openai-harmony, and for 0.33's sampler
xgrammar, apache-tvm-ffi, partial-json-parser, llguidance — installed; uvloop is stubbed in the
subprocess):

- ``vllm/v1/serial_utils.py`` (every version checked, 0.10.0–0.33.0): the msgpack path of
  ``collective_rpc`` arguments;
- ``vllm/sampling_params.py`` (every version): request validation;
- ``vllm/v1/sample/sampler.py`` (0.10.1–0.33.0; 0.10.0 predates ``LogitsProcessors``): logprobs per
  ``logprobs_mode`` on CPU logits (settings that need a compiled op — the repetition penalty calls
  ``vllm._C`` — are left out).

Set ``RLCORE_VLLM_SRC`` to one or more unpacked source roots (``/tmp/vllm-0.33.0/src``, separated by
``os.pathsep``); each is probed in a subprocess so ``import vllm`` never leaks into this process.
Skipped when unset.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlcore import SamplingParams
from rlcore.sampling.vllm.engine import sampling_kwargs
from rlcore.sampling.vllm.support import PROCESSED, RAW, parse_version
from rlcore.testing import vllm_standin

SRCS = [p for p in os.environ.get("RLCORE_VLLM_SRC", "").split(os.pathsep) if p]
pytestmark = pytest.mark.skipif(not SRCS, reason="set RLCORE_VLLM_SRC to unpacked vLLM wheels to run")

GRID = [
    SamplingParams(),
    SamplingParams(temperature=0.0, n=2),
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=3.0),
    SamplingParams(top_p=0.0),
    SamplingParams(top_k=-2),
    SamplingParams(min_p=1.5),
    SamplingParams(repetition_penalty=0.0),
    SamplingParams(max_tokens=4, min_tokens=5),
    SamplingParams(top_k=20, top_p=0.8, min_p=0.05, repetition_penalty=1.05, temperature=0.7, seed=3),
]


def _cases() -> list[dict]:
    g = torch.Generator().manual_seed(0)
    cases = []
    for mode in (RAW, PROCESSED):
        for t, k, p, rp in [(1.0, 0, 1.0, 1.0), (0.7, 0, 1.0, 1.0), (0.7, 5, 1.0, 1.0), (0.7, 0, 0.8, 1.0),
                            (1.3, 8, 0.9, 1.0), (0.7, 0, 1.0, 1.2), (0.0, 0, 1.0, 1.0)]:
            cases.append({"mode": mode, "temperature": t, "top_k": k, "top_p": p, "repetition_penalty": rp,
                          "logits": (torch.randn(64, generator=g) * 3).tolist(), "prompt": [1, 2, 3], "output": [4]})
    return cases


CASES = _cases()


@pytest.fixture(scope="module", params=SRCS or ["-"])
def probe(request) -> dict:
    src = request.param
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    spec = {"grid": [sampling_kwargs(p) for p in GRID], "cases": CASES}
    r = subprocess.run([sys.executable, str(Path(__file__).with_name("vllm_probe.py"))], input=json.dumps(spec),
                       capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        pytest.skip(f"vLLM from {src} does not import on this machine: {r.stderr.strip().splitlines()[-1:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["version_tuple"] = parse_version(out.get("version")) or parse_version(Path(src).parent.name.removeprefix("vllm-"))
    return out


def test_msgpack_carries_a_path_but_not_a_tensor(probe) -> None:
    m = probe["msgpack"]
    assert m["path_type"] == "str" and m["path"] == "/dev/shm/x.safetensors"
    assert m["tensor_type"] == "list"  # why rlcore syncs weights by path (point 1 of issue #20)
    standin = vllm_standin.msgpack_roundtrip(("rlcore_load_weights_from_path", ([("w", torch.ones(2, 3))],)))
    assert type(standin[1][0][0][1]).__name__ == m["tensor_type"]


def test_standin_sampling_params_validate_like_vllm(probe) -> None:
    v = probe["version_tuple"]
    cls = type("SP", (vllm_standin.SamplingParams,), {"version": v})
    mine = []
    for p in GRID:
        try:
            cls(**sampling_kwargs(p))
            mine.append(None)
        except ValueError as exc:
            mine.append(str(exc))
    real = probe["sampling_params"]
    assert [m is None for m in mine] == [r is None for r in real], list(zip(mine, real))
    assert "n must be 1 when using greedy sampling" in real[1]


def test_standin_logprob_modes_match_vllms_sampler(probe) -> None:
    real = probe["sampler"]
    if isinstance(real, str):
        pytest.skip(f"vLLM {probe['version']}'s sampler does not import on CPU: {real}")
    v = probe["version_tuple"]
    compared = set()
    for case, res in zip(CASES, real):
        if isinstance(res, str):  # this setting needs a compiled vLLM op (penalties: vllm._C)
            continue
        tok, lp = res
        compared.add(case["mode"])
        sp = vllm_standin.SamplingParams(temperature=case["temperature"], top_k=case["top_k"], top_p=case["top_p"],
                                         repetition_penalty=case["repetition_penalty"])
        logits = torch.tensor(case["logits"])
        if case["mode"] == RAW:
            mine = float(torch.log_softmax(logits, -1)[int(tok)])
        else:
            _, lps = vllm_standin._process(logits, case["prompt"] + case["output"], 1, sp, [], v)
            mine = float(lps[int(tok)])
        assert mine == pytest.approx(lp, abs=1e-4), (probe["version"], case["mode"], case["temperature"],
                                                     case["top_k"], case["top_p"], case["repetition_penalty"])
    assert compared == {RAW, PROCESSED}
