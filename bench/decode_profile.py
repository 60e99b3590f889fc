"""Where a static-path decode step's time goes on CUDA: the captured step's replay time per bucket
(device time, CUDA events, median of many replays) against the sampler's measured end-to-end rate,
and the floor the weights set (bytes of parameters read per step over the copy bandwidth).

    python bench/decode_profile.py --shape qwen2-0.5b --dtype bfloat16 --buckets 64 256

Prints a table; the difference between ``replay`` and ``end-to-end`` is host time not hidden
behind the GPU (stop checks, launches), the difference between ``replay`` and ``floor`` the kernels.
With ``--forwards fused model`` (the default) the static path's fused decode forward and the model's
own forward are profiled in the same run. Writes ``bench/results/decode_profile_gpu.json`` and
``.png`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from shapes import load_model  # noqa: E402

from rlcore.sampling.hf.sampler import HFSampler  # noqa: E402
from rlcore.types import SamplingParams  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="qwen2-0.5b")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--buckets", nargs="+", type=int, default=[64, 256])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--forwards", nargs="+", default=["fused", "model"], choices=["fused", "model"],
                    help="the static path's forward: the fused one (default) and/or the model's own")
    ap.add_argument("--out", default=str(RESULTS / "decode_profile_gpu"), help="JSON/PNG path without suffix")
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
    floor_ms = weight_bytes / bw * 1e3
    print(f"weights {weight_bytes / 1e9:.2f} GB, copy bandwidth {bw / 1e12:.2f} TB/s, floor {floor_ms:.3f} ms/step")
    prompt = tok.encode("what is 12 + 7? think step by step", add_special_tokens=False)
    result = {"shape": a.shape, "dtype": a.dtype, "tokens": a.tokens, "weights_gb": weight_bytes / 1e9,
              "bandwidth_tb_s": bw / 1e12, "floor_ms": floor_ms, "torch": torch.__version__,
              "device": torch.cuda.get_device_name(), "rows": []}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for forward in a.forwards:
        s = HFSampler(model, tok, max_batch_size=max(a.buckets), batch_window_ms=20, fused_decode=forward == "fused")
        for b in a.buckets:
            result["rows"].append(profile_bucket(s, prompt, b, a.tokens, forward))
            out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")  # kept if a time limit stops the run
        asyncio.run(s.close())
    plot(result, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


def plot(result: dict, path: Path) -> None:
    """Replay and end-to-end ms per step for each bucket and forward, with the weight-read floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    buckets = sorted({r["bucket"] for r in rows})
    forwards = list(dict.fromkeys(r["forward"] for r in rows))
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, 2 * len(forwards))
    for j, fwd in enumerate(forwards):
        for k, (field, hatch) in enumerate((("replay_ms", ""), ("end_to_end_ms", "//"))):
            xs = [i + width * (2 * j + k) for i in range(len(buckets))]
            ys = [next((r[field] for r in rows if r["bucket"] == b and r["forward"] == fwd), 0) for b in buckets]
            ax.bar(xs, ys, width, hatch=hatch, color=f"C{j}", alpha=0.6 if k else 1.0,
                   label=f"{fwd} forward, {'end-to-end' if k else 'graph replay'}")
    ax.axhline(result["floor_ms"], color="k", linestyle="--", label="weight-read floor")
    ax.set_xticks([i + width * (2 * len(forwards) - 1) / 2 for i in range(len(buckets))], [f"{b} rows" for b in buckets])
    ax.set_ylabel("ms per decode step")
    ax.set_title(f"{result['shape']} {result['dtype']} on {result.get('device', 'cuda')}: one static-path step")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def profile_bucket(s: HFSampler, prompt: list[int], b: int, tokens: int, forward: str) -> dict:
    params = [SamplingParams(max_tokens=tokens, seed=i, stop_token_ids=[-1]) for i in range(b)]

    async def run() -> float:
        t = time.perf_counter()
        await asyncio.gather(*(s.generate(prompt, p) for p in params))
        return time.perf_counter() - t

    asyncio.run(run())  # capture
    e2e = statistics.median(asyncio.run(run()) for _ in range(3))
    eng = s._engine
    key = max((k for k in eng.graphs if k[0] == b), key=lambda k: k[1])  # (rows, columns, flags): the widest
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
          f"graphs {eng.captures}, max_len {eng.max_len}, replayed over {key[1]} columns")
    return {"forward": forward, "bucket": b, "replay_ms": rep, "end_to_end_ms": e2e / tokens * 1e3,
            "device_bound_tok_s": b / rep * 1e3, "end_to_end_tok_s": b * tokens / e2e, "graphs": eng.captures,
            "fused": eng.fused is not None, "columns": key[1]}


if __name__ == "__main__":
    main()
