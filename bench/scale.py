"""Scale-out on Ray, side by side in one run: sampler workers (1 vs 2), policy workers (1 vs 2),
and weight-sync time against model size.

**Sampler scale-out** (``--what sampler``). One local Ray instance, two sampler actors (one torch
thread each) hosting the same model. The same rollout — ``--trajectories`` single-turn
trajectories of exactly ``--max-tokens`` tokens through ``run_rollouts`` and a ``RemoteSampler`` —
is timed over a pool of worker 0 and over a pool of both (``ratio``: strong scaling, the same work
split in two), and twice the trajectories over both (``ratio_weak``: each worker holding the batch
one worker held, the way a sampler pool is sized for throughput), alternating ``--repeats`` times so
machine noise hits all alike. Beside the ratios it records what bounds them:

* ``ceiling``: one worker's time for all the trajectories over its time for half of them — what two
  perfectly independent workers (each doing half) could reach at best. The ``hf`` sampler decodes
  every concurrent request in one batch, and a batch of N costs less than twice a batch of N/2
  (the per-step Python and kernel-launch overhead is shared), so the ceiling is below 2.0 unless
  the forward pass dominates;
* ``efficiency``: the half-batch time of one worker over the time of two workers on the whole —
  1.0 when the second worker costs the first nothing (cores of their own, a light driver);
* ``driver_cpu``: the driver process's CPU seconds per rollout second (routing, serialisation,
  the scheduler and the invariant checks), and how the requests split between the workers.

**Policy scale-out** (``--what policy``): ``forward_backward`` + ``clip_grad_and_step`` of the loop
API on one fixed batch, a policy group of 1 worker against one of 2 (data-parallel, gloo):
trained tokens per second.

**Weight sync** (``--what sync``): one ``update_weights`` to 2 sampler workers from this process,
through the object store and through a gloo broadcast in buckets, for each model size.

    python bench/scale.py                               # everything, tiny and small models
    python bench/scale.py --what sampler --sizes tiny,smollm2 --trajectories 32
    python bench/scale.py --what sync --sizes tiny,small,smollm2
    python bench/scale.py --what policy --sizes smollm2 --policy-sequential    # one group alive at a time

The committed ``bench/results/scale.json`` merges five such runs (their commands are in its
``meta.parts``; docs/distributed.md lists them).

Writes ``bench/results/scale.json`` and ``.png`` (``--out``). ``meta.load_avg`` is the machine's
load during the run: on a shared 2-core box every ratio here is a lower bound.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def model_path(size: str) -> str:
    if size == "smollm2":
        from rlcore.testing.smollm2 import smollm2_path

        path = smollm2_path()
        if path is None:
            raise SystemExit("SmolLM2-135M-Instruct is not on this machine: run `python -m rlcore.testing.smollm2` once")
        return path
    from rlcore.testing import tiny_model_path

    return tiny_model_path(size=size)


def make_prompts(tokenizer: Any, n: int) -> list[Any]:
    from rlcore.types import Prompt

    out = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"Question {i}: what is {i} + {i * 3 % 17}? " + "think step by step " * (i % 4)}]
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        out.append(Prompt(messages=msgs, prompt_ids=tokenizer.encode(text, add_special_tokens=False)))
    return out


async def timed_rollout(pool: Any, prompts: list[Any], max_tokens: int) -> dict[str, float]:
    from rlcore.rollout import RolloutScheduler, run_rollouts
    from rlcore.types import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, stop_token_ids=[-1])  # never stops early
    sched = RolloutScheduler(pool, sampling_params=params)
    cpu0, start = time.process_time(), time.perf_counter()
    # check=False: the tiny random model samples <|im_end|> mid-reply (no stop token is the point here);
    # throughput, not training data, is measured
    result = await run_rollouts(sched, prompts, num_generations=1, progress=False, check=False)
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    bad = [t.reason for t in result.trajectories if t.status == "failed"]
    if bad:
        raise RuntimeError(f"rollout failed: {bad[0]}")
    tokens = sum(t.num_completion_tokens for t in result.trajectories)
    return {"tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall, "driver_cpu_s": cpu}


def bench_sampler(size: str, args: argparse.Namespace) -> dict[str, Any]:
    from rlcore.distributed import DistributedConfig, WorkerGroupConfig
    from rlcore.distributed.cluster import start_samplers
    from rlcore.distributed.pool import RemoteSampler

    model = model_path(size)
    cfg = DistributedConfig(sampler=WorkerGroupConfig(num_workers=2, num_cpus=1.0, torch_threads=1), worker_timeout_s=900)
    placed, both = start_samplers(cfg, model, seed=0)
    one = RemoteSampler(both.workers[:1], both.tokenizer, timeout_s=900)
    doubled = make_prompts(both.tokenizer, 2 * args.trajectories)
    prompts = doubled[: args.trajectories]
    half = prompts[: len(prompts) // 2]
    rows: list[dict[str, Any]] = []
    try:
        asyncio.run(timed_rollout(both, prompts[:4], 2))  # warm both workers up
        for r in range(args.repeats):
            for label, pool, batch in (("1", one, prompts), ("2", both, prompts), ("1_half", one, half),
                                       ("2_doubled", both, doubled)):
                before = {i["rank"]: i for i in pool.infos()}
                load = os.getloadavg()[0]
                row = asyncio.run(timed_rollout(pool, batch, args.max_tokens))
                after = {i["rank"]: i for i in pool.infos()}
                row.update(workers=label, repeat=r, load_avg=load,
                           requests={k: after[k]["requests"] - before[k]["requests"] for k in after},
                           mean_batch={k: _mean(after[k]["batch_sizes"][len(before[k]["batch_sizes"]):]) for k in after})
                rows.append(row)
                print(f"  sampler {size}: {label} worker(s) {row['tokens_per_s']:.0f} tok/s (load {load:.1f})", flush=True)
    finally:
        placed.remove()

    def med(label: str, key: str = "tokens_per_s") -> float:
        return statistics.median(x[key] for x in rows if x["workers"] == label)

    t1, t2, t_half = med("1", "seconds"), med("2", "seconds"), med("1_half", "seconds")
    return {
        "size": size, "tokens_per_s_1": med("1"), "tokens_per_s_2": med("2"), "ratio": med("2") / med("1"),
        # weak scaling: each of 2 workers holds the batch one worker held (2x the trajectories) — what a
        # sampler pool adds per worker at the same load, free of the batching economics the ceiling measures
        "tokens_per_s_2_doubled": med("2_doubled"), "ratio_weak": med("2_doubled") / med("1"),
        "ceiling": t1 / t_half, "efficiency": t_half / t2,
        "driver_cpu_per_s_1": med("1", "driver_cpu_s") / t1, "driver_cpu_per_s_2": med("2", "driver_cpu_s") / t2,
        "runs": rows,
    }


def _mean(xs: list[int]) -> float:
    return float(sum(xs)) / len(xs) if xs else 0.0


def bench_policy(size: str, args: argparse.Namespace) -> dict[str, Any]:
    import rlcore
    from rlcore import SamplingParams
    from rlcore.distributed import DeviceGroup, initialize, shutdown
    from rlcore.loop import Policy, sample

    model = model_path(size)
    local = Policy(model)
    sampler = rlcore.get("sampler", "hf")(local.model, local.tokenizer, seed=0)
    prompts = make_prompts(local.tokenizer, args.policy_trajectories)
    trajs = sample(sampler, prompts, SamplingParams(max_tokens=args.max_tokens, temperature=1.0, stop_token_ids=[-1]),
                   num_generations=1)
    adv = [float(i % 3) - 1.0 for i in range(len(trajs))]
    del local, sampler
    rows: list[dict[str, Any]] = []

    def one_run(workers: int, policy: Any, r: int) -> None:
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        m = policy.forward_backward(trajs, adv)
        policy.clip_grad_and_step()
        wall = time.perf_counter() - t0
        rows.append({"workers": workers, "repeat": r, "tokens": m["num_tokens"], "seconds": wall,
                     "tokens_per_s": m["num_tokens"] / wall, "load_avg": load})
        print(f"  policy {size}: {workers} worker(s) {m['num_tokens'] / wall:.0f} tok/s (load {load:.1f})", flush=True)

    def start(workers_list: list[int]) -> dict[int, Any]:
        initialize(mode="ray", groups=[DeviceGroup(f"p{w}", num_workers=w, num_cpus=1.0) for w in workers_list])
        policies = {w: Policy(model, loss="dapo", remote_group=f"p{w}") for w in workers_list}
        for p in policies.values():  # warm-up
            p.forward_backward(trajs[:4], adv[:4])
            p.clip_grad_and_step()
        return policies

    try:
        if args.policy_sequential:
            # One group alive at a time (a model this size times 3 workers with Adam state may not fit
            # beside the driver on a small box); the repeats of a group run back to back.
            for workers in (1, 2):
                policies = start([workers])
                for r in range(args.repeats):
                    one_run(workers, policies[workers], r)
                del policies
                shutdown()
        else:
            policies = start([1, 2])
            for r in range(args.repeats):
                for workers, policy in policies.items():
                    one_run(workers, policy, r)
    finally:
        shutdown()
        initialize(mode="local")

    def med(w: int) -> float:
        return statistics.median(x["tokens_per_s"] for x in rows if x["workers"] == w)

    return {"size": size, "tokens_per_s_1": med(1), "tokens_per_s_2": med(2), "ratio": med(2) / med(1), "runs": rows}


def bench_sync(sizes: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    from transformers import AutoModelForCausalLM

    from rlcore.distributed import DistributedConfig, WorkerGroupConfig
    from rlcore.distributed.cluster import start_samplers
    from rlcore.distributed.pool import RemoteSampler

    out = []
    for size in sizes:
        model = model_path(size)
        cfg = DistributedConfig(sampler=WorkerGroupConfig(num_workers=2, num_cpus=1.0, torch_threads=1), worker_timeout_s=900)
        placed, store = start_samplers(cfg, model, seed=0)
        bcast = RemoteSampler(store.workers, store.tokenizer, timeout_s=900)
        bcast.setup_broadcast("gloo")
        weights = dict(AutoModelForCausalLM.from_pretrained(model).named_parameters())
        rows = []
        try:
            for r in range(args.repeats):
                for mode, pool in (("object_store", store), ("broadcast", bcast)):
                    m = pool.update_weights(weights)
                    rows.append({"mode": mode, "repeat": r, **m})
                    print(f"  sync {size} {mode}: {m['sync/seconds']:.3f}s for {m['sync/bytes'] / 1e6:.1f} MB", flush=True)
        finally:
            placed.remove()
        for mode in ("object_store", "broadcast"):
            secs = statistics.median(x["sync/seconds"] for x in rows if x["mode"] == mode)
            size_b = rows[0]["sync/bytes"]
            out.append({"size": size, "mode": mode, "bytes": size_b, "seconds": secs, "mb_per_s": size_b / 1e6 / secs,
                        "runs": [x for x in rows if x["mode"] == mode]})
    return out


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [k for k in ("sampler", "policy", "sync") if results.get(k)]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, key in zip(axes[0], panels):
        if key in ("sampler", "policy"):
            done = [r for r in results[key] if "ratio" in r]
            labels, ratios = [r["size"] for r in done], [r["ratio"] for r in done]
            bars = ax.bar(labels, ratios, color="#2a7ab9", label="2 workers / 1" + (" (same work)" if key == "sampler" else ""))
            if key == "sampler":
                ax.scatter(labels, [r["ceiling"] for r in done], color="k", zorder=3, label="batching ceiling (same work)")
                weak = [r.get("ratio_weak") for r in done]
                if all(w is not None for w in weak):
                    ax.scatter(labels, weak, color="#d95f02", marker="D", zorder=3, label="2 workers, 2x work / 1")
                    for x, w in zip(labels, weak):
                        ax.annotate(f"{w:.2f}x", (x, w), textcoords="offset points", xytext=(8, 0), fontsize=8, color="#d95f02")
            for b, v in zip(bars, ratios):
                ax.text(b.get_x() + b.get_width() / 2, v, f"{v:.2f}x", ha="center", va="bottom")
            ax.axhline(2.0, color="#888888", ls="--", lw=1)
            ax.set_ylim(0, 2.3)
            ax.set_title(f"{key} scale-out (CPU)")
            ax.legend(loc="lower right", fontsize=8)
        else:
            for mode, color in (("object_store", "#2a7ab9"), ("broadcast", "#d95f02")):
                pts = [r for r in results["sync"] if r["mode"] == mode]
                ax.plot([p["bytes"] / 1e6 for p in pts], [p["seconds"] for p in pts], "o-", color=color, label=mode)
            ax.set_xlabel("model size (MB)")
            ax.set_ylabel("sync seconds (median)")
            ax.set_title("weight sync to 2 sampler workers")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--what", default="sampler,policy,sync", help="comma-separated: sampler, policy, sync")
    ap.add_argument("--sizes", default="tiny,small", help="comma-separated: tiny, small, smollm2")
    ap.add_argument("--policy-sizes", default=None, help="sizes for --what policy (default: --sizes)")
    ap.add_argument("--trajectories", type=int, default=32)
    ap.add_argument("--policy-trajectories", type=int, default=32)
    ap.add_argument("--policy-sequential", action="store_true",
                    help="policy: start the 1-worker group, measure it, stop it, then the 2-worker group "
                         "(default: both alive, runs alternating)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS / "scale"))
    args = ap.parse_args()

    import ray

    from rlcore.distributed.runtime import ensure_ray

    what = [w.strip() for w in args.what.split(",") if w.strip()]
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    policy_sizes = [s.strip() for s in (args.policy_sizes or args.sizes).split(",") if s.strip()]
    ensure_ray(num_cpus=max(4, os.cpu_count() or 1))
    load0 = os.getloadavg()
    results: dict[str, Any] = {}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def each(fn: Any, size: str) -> dict[str, Any]:
        """One size's measurement; a failure (a worker killed for memory on a shared box) is recorded."""
        try:
            return fn(size, args)
        except Exception as exc:  # noqa: BLE001 - the other sizes still run; the JSON says what failed
            print(f"  {fn.__name__} {size} failed: {str(exc).splitlines()[0][:300]}", flush=True)
            return {"size": size, "error": str(exc).splitlines()[0][:300]}

    try:
        if "sampler" in what:
            results["sampler"] = [each(bench_sampler, s) for s in sizes]
            out.with_suffix(".partial.json").write_text(json.dumps(results, indent=2))
        if "policy" in what:
            results["policy"] = [each(bench_policy, s) for s in policy_sizes]
            out.with_suffix(".partial.json").write_text(json.dumps(results, indent=2))
        if "sync" in what:
            results["sync"] = bench_sync(sizes, args)
    finally:
        ray.shutdown()
    out.with_suffix(".partial.json").unlink(missing_ok=True)
    meta = {
        "cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
        "trajectories": args.trajectories, "policy_trajectories": args.policy_trajectories, "max_tokens": args.max_tokens,
        "repeats": args.repeats, "policy_sequential": args.policy_sequential, "torch_threads_per_worker": 1, "load_avg_at_start": load0[0],
        "load_avg_at_end": os.getloadavg()[0],
    }
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, **results}, indent=2))
    plot(results, out.with_suffix(".png"))
    summary = {k: [{x: v for x, v in r.items() if x != "runs"} for r in rs] for k, rs in results.items()}
    print(json.dumps({"meta": meta, **summary}, indent=2))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
