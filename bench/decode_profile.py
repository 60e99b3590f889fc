"""Where a static-path decode step's time goes on CUDA: the captured step's replay time per bucket
(device time, CUDA events, median of many replays) against the sampler's measured end-to-end rate,
and the floor the weights set (bytes of parameters read per step over the copy bandwidth).

    python bench/decode_profile.py --shape qwen2-0.5b --dtype bfloat16 --buckets 64 256

Prints a table; the difference between ``replay`` and ``end-to-end`` is host time not hidden
behind the GPU (stop checks, launches), the difference between ``replay`` and ``floor`` the kernels.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from shapes import load_model  # noqa: E402

from rlcore.sampling.hf import HFSampler  # noqa: E402
from rlcore.types import SamplingParams  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="qwen2-0.5b")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--buckets", nargs="+", type=int, default=[64, 256])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--forwards", nargs="+", default=["fused", "model"], choices=["fused", "model"],
                    help="the static path's forward: the fused one (default) and/or the model's own")
    a = ap.parse_args()
    model, tok = load_model(a.shape, "cuda", a.dtype)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    x = torch.empty(2**28, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        y.copy_(x)
    torch.cuda.synchronize()
    bw = 2 * x.numel() * 20 / (time.perf_counter() - t0)
    del x, y
    print(f"weights {weight_bytes / 1e9:.2f} GB, copy bandwidth {bw / 1e12:.2f} TB/s, floor {weight_bytes / bw * 1e3:.3f} ms/step")
    prompt = tok.encode("what is 12 + 7? think step by step", add_special_tokens=False)
    for forward in a.forwards:
        s = HFSampler(model, tok, max_batch_size=max(a.buckets), batch_window_ms=20, fused_decode=forward == "fused")
        for b in a.buckets:
            profile_bucket(s, prompt, b, a.tokens, forward)
        asyncio.run(s.close())


def profile_bucket(s: HFSampler, prompt: list[int], b: int, tokens: int, forward: str) -> None:
    params = [SamplingParams(max_tokens=tokens, seed=i, stop_token_ids=[-1]) for i in range(b)]

    async def run() -> float:
        t = time.perf_counter()
        await asyncio.gather(*(s.generate(prompt, p) for p in params))
        return time.perf_counter() - t

    asyncio.run(run())  # capture
    e2e = statistics.median(asyncio.run(run()) for _ in range(3))
    eng = s._engine
    key = next(k for k in eng.graphs if k[0] == b)
    g = eng.graphs[key]
    with torch.inference_mode():
        times = []
        for _ in range(30):
            st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            st.record()
            g.replay()
            en.record()
            en.synchronize()
            times.append(st.elapsed_time(en))
    rep = statistics.median(times)
    print(f"{forward:>5} forward, bucket {b:>4}: replay {rep:.3f} ms/step = {b / rep * 1e3:>9.0f} tok/s device-bound; "
          f"end-to-end {b * tokens / e2e:>9.0f} tok/s ({e2e / tokens * 1e3:.3f} ms/step incl. prefill); "
          f"graphs {eng.captures}, max_len {eng.max_len}")


if __name__ == "__main__":
    main()
