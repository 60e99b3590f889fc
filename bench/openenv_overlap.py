"""Does openenv_scheduler overlap slow environment steps? 64 trajectories x 4 turns against a real
OpenEnv server (rl-plugin-openenv's guess_number in a subprocess) whose every step takes 100 ms.

Reported (one run, side by side, because these machines are noisy):

* ``ideal``  = sum over turns of (time to generate that turn for all 64 as one batch, from the
  contexts the trajectories really had at that turn + 100 ms step). Contexts grow every turn (the
  observation and reply are appended), so turn 4 generates slower than turn 1;
  ``ideal_first_turn`` (turns x first-turn batch + 100 ms, the figure this bench used to report)
  understates generation and is kept for comparison;
* ``async``  = ``run_rollouts`` wall time with ``openenv_scheduler`` (one session per trajectory,
  64 in flight), median of ``--repeats`` runs, and ``async / ideal``;
* ``phases`` of the async runs: sessions opened and reset (until the last reset reply), step
  round-trips (vs the server's 100 ms), closes; the OpenEnv-specific part of the wall time;
* ``serial`` = one trajectory at a time (what a loop over episodes does), measured on a few
  trajectories and scaled to 64: the "64 x" a blocking client would cost;
* client counters (sessions opened/closed, capacity retries, timeouts).

Sampler: ``hf`` on the offline tiny model with every turn exactly ``--tokens`` tokens
(min_tokens = max_tokens), or ``--sampler scripted`` (a fixed ``--gen-delay`` per call).
The garbage collector is run and frozen after the warm-up (``gc.freeze``): with a model and a
tokenizer loaded, one full collection takes ~0.3 s and lands at random in a ~1.5 s run, which is
noise about the heap, not about the OpenEnv path (``gc_pauses_s`` reports any that still happen).
Writes bench/results/openenv_overlap.json and .png. Run: ``python bench/openenv_overlap.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RLCORE_PLUGINS", "rl-plugin-openenv")

from rlcore.rollout import encode_prompt, run_rollouts  # noqa: E402
from rlcore.types import Prompt, SamplingParams  # noqa: E402

from rl_plugin_openenv.scheduler import OpenEnvScheduler  # noqa: E402
from rl_plugin_openenv.testing import ServerProcess  # noqa: E402
from rollout_overlap import prefix_before_turn  # noqa: E402  (sibling script in bench/)

RESULTS = Path(__file__).parent / "results"
FIRST_OBS = "I am thinking of a number between 1 and 100. You have 8 guesses. Reply with JSON like {\"guess\": 50}."


class FixedTurns(OpenEnvScheduler):
    """Exactly ``max_turns`` turns: fixed-length replies end with "length", the episode goes on."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.t0 = time.perf_counter()
        self.calls: dict[str, list[tuple[float, float]]] = {"reset": [], "step": [], "close": []}

    def check_finished(self, infer_request: Any, response_choice: Any, current_turn: int) -> bool:
        return current_turn >= self.max_turns

    async def _env_call(self, what: str, fn: Any, *args: Any) -> Any:
        """Timestamps every reset / step / close (seconds since the run started)."""
        start = time.perf_counter()
        try:
            return await super()._env_call(what, fn, *args)
        finally:
            self.calls.setdefault(what, []).append((start - self.t0, time.perf_counter() - self.t0))

    def phases(self) -> dict[str, float]:
        resets, steps, closes = self.calls["reset"], self.calls["step"], self.calls["close"]
        rtts = [b - a for a, b in steps]
        return {
            "sessions_open_and_reset_s": max(b for _, b in resets),
            "step_round_trip_median_s": statistics.median(rtts),
            "step_round_trip_max_s": max(rtts),
            # after the last step reply: what closing the sessions adds to the wall time
            "close_tail_s": max(b for _, b in closes) - max(b for _, b in steps),
        }


def make_sampler(kind: str, tokens: int, gen_delay: float) -> Any:
    from rlcore.testing import ScriptedSampler, build_tokenizer, tiny_model_path

    if kind == "scripted":
        return ScriptedSampler(['{"guess": 1}'], build_tokenizer(), delay=gen_delay)
    import rlcore

    return rlcore.get("sampler", "hf")(model=tiny_model_path(), seed=0)


async def batch_time(sampler: Any, prompts: list[list[int]], params: SamplingParams, repeats: int = 3) -> float:
    """Time to generate one turn for all ``prompts`` at once (the sampler batches them)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        await asyncio.gather(*(sampler.generate(list(ids), params) for ids in prompts))
        best = min(best, time.perf_counter() - t0)
    return best


async def rollout(sampler: Any, url: str, n: int, turns: int, params: SamplingParams, concurrency: int) -> tuple[float, Any, Any, Any]:
    sched = FixedTurns(sampler, env_url=url, max_turns=turns, stop_on_truncation=False)
    prompts = [Prompt([], [], data={"env_config": {"target": 100, "max_attempts": turns + 2}}) for _ in range(n)]
    t0 = time.perf_counter()
    res = await run_rollouts(sched, prompts, sampling_params=params, concurrency=concurrency, progress=True)
    wall = time.perf_counter() - t0
    assert res.stats["failed"] == 0, res.stats["failure_reasons"]
    assert all(t.num_turns == turns for t in res.trajectories)
    return wall, sched.metrics(), sched.phases(), res.trajectories


def _gc_pause_recorder(pauses: list[float]) -> Any:
    started: list[float] = []

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[:] = [time.perf_counter()]
        elif started:
            pauses.append(time.perf_counter() - started[0])

    return callback


async def main_async(a: argparse.Namespace) -> dict[str, Any]:
    sampler = make_sampler(a.sampler, a.tokens, a.gen_delay)
    params = SamplingParams(max_tokens=a.tokens, min_tokens=a.tokens, temperature=1.0)
    pauses: list[float] = []
    rounds: list[dict[str, Any]] = []
    with ServerProcess(step_delay=a.step_delay, max_concurrent_envs=a.trajectories) as server:
        await rollout(sampler, server.url, 4, 1, params, a.trajectories)  # warm-up: sessions, kernels
        first_obs = encode_prompt(sampler.tokenizer, [{"role": "user", "content": FIRST_OBS}])
        await batch_time(sampler, [first_obs] * a.trajectories, params, repeats=1)
        gc.collect()
        gc.freeze()
        gc.callbacks.append(recorder := _gc_pause_recorder(pauses))
        try:
            for _ in range(a.repeats):
                wall, counters, phases, trajs = await rollout(sampler, server.url, a.trajectories, a.turns, params, a.trajectories)
                first = await batch_time(sampler, [first_obs] * a.trajectories, params)
                per_turn = [await batch_time(sampler, [prefix_before_turn(t, k) for t in trajs], params, repeats=2)
                            for k in range(a.turns)]
                ideal = sum(g + a.step_delay for g in per_turn)
                rounds.append({
                    "async_s": wall, "ideal_s": ideal, "async_over_ideal": wall / ideal,
                    "ideal_first_turn_s": a.turns * (first + a.step_delay), "batch_generation_s_per_turn": per_turn,
                    "phases": phases,
                })
            serial_wall, _, _, _ = await rollout(sampler, server.url, a.serial_sample, a.turns, params, 1)
        finally:
            gc.callbacks.remove(recorder)
            gc.unfreeze()
    await sampler.close()
    med = statistics.median
    wall, ideal = med(r["async_s"] for r in rounds), med(r["ideal_s"] for r in rounds)
    ideal_first = med(r["ideal_first_turn_s"] for r in rounds)
    serial_64 = serial_wall / a.serial_sample * a.trajectories
    return {
        "trajectories": a.trajectories, "turns": a.turns, "step_delay_s": a.step_delay, "sampler": a.sampler,
        "tokens_per_turn": a.tokens, "repeats": a.repeats,
        "ideal_s": ideal, "async_s": wall, "async_over_ideal": med(r["async_over_ideal"] for r in rounds),
        "ideal_first_turn_s": ideal_first, "async_over_ideal_first_turn": wall / ideal_first,
        "phases_median": {k: med(r["phases"][k] for r in rounds) for k in rounds[0]["phases"]},
        "serial_estimate_s": serial_64, "serial_measured_on": a.serial_sample,
        "serial_over_async": serial_64 / wall,
        "naive_64x_s": a.trajectories * ideal, "gc_pauses_s": [round(p, 4) for p in pauses if p > 0.01],
        "counters": counters, "rounds": rounds,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["ideal, first-turn\ncontexts (old)", "ideal\nΣ turns (gen+step)", "openenv_scheduler\n(async, 64 sessions)",
             f"serial\n(×{result['trajectories']} est.)"]
    values = [result["ideal_first_turn_s"], result["ideal_s"], result["async_s"], result["serial_estimate_s"]]
    fig, ax = plt.subplots(figsize=(8, 4))
    bars = ax.bar(names, values, color=["#cccccc", "#999999", "#2b7bba", "#d9534f"])
    ax.set_yscale("log")
    for b, v in zip(bars, values):
        ax.text(b.get_x() + b.get_width() / 2, v, f"{v:.2f}s", ha="center", va="bottom")
    ax.set_ylabel("wall time (s)")
    ax.set_title(f"{result['trajectories']} trajectories × {result['turns']} turns, "
                 f"OpenEnv step {result['step_delay_s'] * 1000:.0f} ms: async/ideal = {result['async_over_ideal']:.2f}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trajectories", type=int, default=64)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--step-delay", type=float, default=0.1)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--sampler", choices=("hf", "scripted"), default="hf")
    p.add_argument("--gen-delay", type=float, default=0.05, help="scripted sampler: seconds per generate call")
    p.add_argument("--repeats", type=int, default=5, help="async runs; medians are reported")
    p.add_argument("--serial-sample", type=int, default=4, help="trajectories run one at a time for the serial estimate")
    p.add_argument("--out", default=str(RESULTS / "openenv_overlap"))
    a = p.parse_args()
    result = asyncio.run(main_async(a))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out.with_suffix(".png"))
    print(json.dumps({k: v for k, v in result.items() if k not in ("counters", "rounds")}, indent=2))


if __name__ == "__main__":
    main()
