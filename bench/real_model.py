"""Benchmarks on a real pretrained model, SmolLM2-135M-Instruct (float32, CPU), rlcore vs TRL 1.16 and
the hf sampler vs ``model.generate``, each side by side in one run (these machines are noisy: ratios
hold, absolute seconds do not). Four parts, one subcommand each:

- ``step``     — one GRPO step, rlcore's GRPOTrainer vs TRL's, in lock-step (grpo_step.py's baton):
  2 prompts × 8 generations × 128 tokens, the same weights (both loaded from the same directory),
  prompts, reward and seed; the median step time of each and their ratio, plus a profile of both
  steps (generation, rewards, each logprob pass — old / ref —, the loss forward, backward, optimizer).
  Writes ``bench/results/real_model_step.json`` / ``.png``.
- ``learning`` — GRPO on a task where the model starts low but not at zero (see ``base``): rlcore and
  TRL with the same hyper-parameters, model, prompts and seeds (2 prompts × 8 × ≤16 tokens, lr 3e-5,
  40 steps), 2 seeds, each seed's two runs in lock-step;
  the reward curves in one plot, first/last-10% rewards and wall time. The JSON is rewritten after
  every step, so a run cut short keeps what it measured.
  Writes ``bench/results/real_model_learning.json`` / ``.png``.
- ``sampler``  — the hf sampler vs ``model.generate`` on the left-padded batch, 64 prompts × 128
  tokens, alternating runs at the same threads; generated tokens / s on two workloads: ``eos`` (rows
  stop at EOS, as in a rollout: the sampler drops a finished row, ``generate`` pads it) and ``fixed``
  (every row 128 tokens: the raw decode loop).
  Writes ``bench/results/real_model_sampler.json`` / ``.png``.
- ``packing``  — the loss's logprob pass + backward on a ragged batch shaped like a real step's, with
  the rows packed (rlcore's default) and unpacked. Writes ``bench/results/real_model_packing.json``.
- ``base``     — base rewards of candidate tasks (the model as it comes, the sampler's sampling):
  what picked the learning task. Writes ``bench/results/real_model_base.json``.

    python -m rlcore.testing.smollm2                       # once: fetch + convert the model
    python bench/real_model.py step     [--steps 3 --warmup 1]
    python bench/real_model.py learning [--steps 40 --seeds 0 1]
    python bench/real_model.py sampler  [--work 64x128 --repeats 2]
    python bench/real_model.py packing
    python bench/real_model.py base

Every JSON says how loaded the machine was (``os.getloadavg()`` before and after).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import Any, Iterator

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
sys.path.insert(0, HERE)

from grpo_step import Baton, plot_steps, run_in_lockstep, timing_callback  # noqa: E402  (the lock-step scheduler)


# --- shared -----------------------------------------------------------------------------------------
def model_dir() -> str:
    from rlcore.testing.smollm2 import PREPARE_COMMAND, smollm2_path

    path = smollm2_path()
    if path is None:
        raise SystemExit(f"SmolLM2-135M-Instruct is not on this machine; run `{PREPARE_COMMAND}` first")
    return path


def load(path: str, train: bool = True) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return (model.train() if train else model.eval()), AutoTokenizer.from_pretrained(path)


def digits_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """The built-in digits questions as conversational rows (both trainers apply the chat template)."""
    from rlcore.data.tasks import digits_dataset

    return [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in digits_dataset(n, seed=seed)]


def digits_reward(completions: list[Any], answer: list[Any], **kwargs: Any) -> list[float]:
    """rlcore's ``digits`` reward as a TRL-style function, handed to both trainers (so they score alike)."""
    from rlcore.data.tasks import digits_reward as score

    return score([c[-1]["content"] if isinstance(c, list) else c for c in completions], answer)


def machine() -> dict[str, Any]:
    import torch
    import transformers
    import trl

    return {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
            "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "device": "cpu", "precision": "float32",
            "model": "SmolLM2-135M-Instruct (GGUF Q4_1 de-quantised to float32)", "load_average_start": os.getloadavg()}


def save(out: str, result: dict[str, Any]) -> None:
    result.setdefault("meta", {})["load_average_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + ".json.tmp", "w") as f:
        json.dump(result, f, indent=2)
    os.replace(out + ".json.tmp", out + ".json")


def common_config(a: argparse.Namespace, seed: int, steps: int) -> dict[str, Any]:
    """The GRPOConfig fields both trainers get (TRL's defaults otherwise: beta 0, loss dapo, μ=1)."""
    return dict(per_device_train_batch_size=a.prompts * a.num_generations, num_generations=a.num_generations,
                max_completion_length=a.max_completion_length, max_steps=steps, learning_rate=a.learning_rate,
                temperature=1.0, logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, seed=seed,
                bf16=False,  # fp32 on both (TRL defaults to bf16)
                # the rows in dataset order on both (digits_rows is already a seeded random draw): with shuffling,
                # each framework's own seeded order gave the two runs of a seed different prompts at every step
                shuffle_dataset=False)


def make_trainers(a: argparse.Namespace, path: str, rows: list[dict[str, Any]], out: str, seed: int, steps: int,
                  callbacks: dict[str, list[Any]], profile: dict[str, "Profile"] | None = None) -> dict[str, Any]:
    """An rlcore and a TRL GRPOTrainer, each on its own copy of the model loaded from ``path``."""
    import datasets
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    from rlcore.trainer.grpo import GRPOConfig, GRPOTrainer

    ours_cls, theirs_cls = GRPOTrainer, TRLTrainer
    if profile is not None:
        ours_cls, theirs_cls = profiled_rlcore(GRPOTrainer, profile["rlcore"]), profiled_trl(TRLTrainer, profile["trl"])
    model, tok = load(path)
    ours = ours_cls(model, args=GRPOConfig(output_dir=os.path.join(out, f"rlcore{seed}"), plots=False,
                                           **common_config(a, seed, steps)),
                    reward_funcs=digits_reward, train_dataset=rows, processing_class=tok,
                    callbacks=callbacks["rlcore"])
    twin, tok2 = load(path)
    theirs = theirs_cls(model=twin, reward_funcs=digits_reward,
                        args=TRLConfig(output_dir=os.path.join(out, f"trl{seed}"), **common_config(a, seed, steps)),
                        train_dataset=datasets.Dataset.from_list(rows), processing_class=tok2,
                        callbacks=callbacks["trl"])
    return {"rlcore": ours, "trl": theirs}


# --- profiling: where a step's time goes ------------------------------------------------------------
class Profile:
    """Seconds per phase per step (a phase entered several times in a step adds up; ``calls`` counts them)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []
        self.calls: list[dict[str, int]] = []
        self.new_step()

    def new_step(self) -> None:
        self.steps.append({})
        self.calls.append({})

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            cur = self.steps[-1]
            cur[name] = cur.get(name, 0.0) + time.perf_counter() - t0
            self.calls[-1][name] = self.calls[-1].get(name, 0) + 1


def profile_callback(prof: Profile) -> Any:
    """Optimizer time (transformers' pre/post optimizer-step events) and step boundaries."""
    from transformers import TrainerCallback

    class Marks(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            prof.new_step()
            self.t_step = time.perf_counter()

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t_opt = time.perf_counter()

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            cur = prof.steps[-1]
            cur["optimizer"] = cur.get("optimizer", 0.0) + time.perf_counter() - self.t_opt

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            prof.steps[-1]["step"] = time.perf_counter() - self.t_step

    return Marks()


def profiled_rlcore(base: type, prof: Profile) -> type:
    """rlcore's trainer with timers around its phases (subclassed here: the product carries no timers)."""

    class Profiled(base):  # type: ignore[misc, valid-type]
        def rollout(self, *args: Any, **kw: Any) -> Any:
            with prof.phase("generation"):
                return super().rollout(*args, **kw)

        def _score(self, *args: Any, **kw: Any) -> Any:
            with prof.phase("rewards+advantages"):
                return super()._score(*args, **kw)

        def _attach_logps(self, batch: Any) -> None:
            a = self.args
            self._old_pass = a.num_iterations > 1 or int(a.steps_per_generation) > a.gradient_accumulation_steps \
                or a.is_correction is not None
            super()._attach_logps(batch)

        def _logps_in_chunks(self, model: Any, *args: Any, **kw: Any) -> Any:
            name = "logprob pass (old)" if self._old_pass else "logprob pass (ref)"
            self._old_pass = False  # _attach_logps computes old first, then ref
            with prof.phase(name):
                return super()._logps_in_chunks(model, *args, **kw)

        def compute_loss(self, *args: Any, **kw: Any) -> Any:
            with prof.phase("loss forward (policy logprobs + loss)"):
                return super().compute_loss(*args, **kw)

        def training_step(self, *args: Any, **kw: Any) -> Any:
            with prof.phase("_training_step"):
                return super().training_step(*args, **kw)

    return Profiled


def profiled_trl(base: type, prof: Profile) -> type:
    """TRL's trainer with the same timers: a logprob pass outside ``compute_loss`` is old (the policy)
    or ref (the reference model)."""

    class Profiled(base):  # type: ignore[misc, valid-type]
        _in_loss = False

        def _generate(self, *args: Any, **kw: Any) -> Any:
            with prof.phase("generation"):
                return super()._generate(*args, **kw)

        def _calculate_rewards(self, *args: Any, **kw: Any) -> Any:
            with prof.phase("rewards+advantages"):
                return super()._calculate_rewards(*args, **kw)

        def _get_per_token_logps_and_entropies(self, model: Any, *args: Any, **kw: Any) -> Any:
            if self._in_loss:
                return super()._get_per_token_logps_and_entropies(model, *args, **kw)
            name = "logprob pass (ref)" if model is getattr(self, "ref_model", None) else "logprob pass (old)"
            with prof.phase(name):
                return super()._get_per_token_logps_and_entropies(model, *args, **kw)

        def compute_loss(self, *args: Any, **kw: Any) -> Any:
            self._in_loss = True
            try:
                with prof.phase("loss forward (policy logprobs + loss)"):
                    return super().compute_loss(*args, **kw)
            finally:
                self._in_loss = False

        def training_step(self, *args: Any, **kw: Any) -> Any:
            with prof.phase("_training_step"):
                return super().training_step(*args, **kw)

    return Profiled


def summarise_profile(prof: Profile, warmup: int) -> dict[str, Any]:
    """Median seconds per phase over the timed steps; backward = training_step − its loss forward −
    the generation/scoring it triggered (both trainers generate inside the first micro-step)."""
    rows = []
    for cur, calls in zip(prof.steps, prof.calls):
        if "step" not in cur:
            continue
        row = dict(cur)
        inner = sum(row.get(k, 0.0) for k in row if k not in ("_training_step", "step", "optimizer"))
        ts = row.pop("_training_step", 0.0)
        row["backward"] = max(0.0, ts - inner)
        row["other"] = max(0.0, row["step"] - ts - row.get("optimizer", 0.0))
        row["calls"] = {k: v for k, v in calls.items() if k != "_training_step"}
        rows.append(row)
    timed = rows[warmup:] or rows
    keys = [k for k in dict.fromkeys(k for r in timed for k in r) if k != "calls"]
    med = {k: round(statistics.median(r.get(k, 0.0) for r in timed), 3) for k in keys}
    return {"median_s": med, "calls_per_step": timed[-1]["calls"] if timed else {}, "per_step": rows}


# --- 1. step time -----------------------------------------------------------------------------------
def cmd_step(a: argparse.Namespace) -> None:
    path = model_dir()
    rows = digits_rows(256)
    baton = Baton(["rlcore", "trl"])
    times: dict[str, list[float]] = {"rlcore": [], "trl": []}
    profile = {"rlcore": Profile(), "trl": Profile()}
    result: dict[str, Any] = {"meta": machine(), "setup": vars(a) | {"func": None}}
    steps = a.steps + a.warmup

    def partial() -> Any:  # the JSON after every step: a run stopped by a time limit keeps what it measured
        from transformers import TrainerCallback

        class Save(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                save(a.out, {**result, "partial": True, "step_times": times,
                             "profile": {n: summarise_profile(profile[n], 0) for n in profile}})

        return Save()

    with tempfile.TemporaryDirectory() as out:
        trainers = make_trainers(a, path, rows, out, seed=0, steps=steps, profile=profile,
                                 callbacks={n: [timing_callback(n, baton, times[n]), profile_callback(profile[n]), partial()]
                                            for n in ("rlcore", "trl")})
        run_in_lockstep(baton, {n: trainers[n].train for n in ("rlcore", "trl")})
    med = {k: statistics.median(v[a.warmup:]) for k, v in times.items()}
    ratio = med["rlcore"] / med["trl"]
    result.update(median_step_s=med, ratio=ratio, goal=0.7, step_times=times,
                  profile={n: summarise_profile(profile[n], a.warmup) for n in profile})
    for n in ("rlcore", "trl"):
        hist = trainers[n].state.log_history
        result.setdefault("reward", {})[n] = [h["reward"] for h in hist if "reward" in h]
        result.setdefault("completion_length", {})[n] = [h.get("completions/mean_length") for h in hist if "reward" in h]
    save(a.out, result)
    print(f"median step: rlcore {med['rlcore']:.2f}s  TRL {med['trl']:.2f}s  ratio {ratio:.3f} (goal <= 0.7)")
    for n in ("rlcore", "trl"):
        print(f"  {n:6} profile (median s): {result['profile'][n]['median_s']}")
    plot_steps(times, med, [("rlcore", "tab:blue", "rlcore"), ("trl", "tab:gray", "TRL")], a.warmup,
               f"GRPO step, SmolLM2-135M fp32 CPU, {a.prompts}×{a.num_generations} × ≤{a.max_completion_length} tok: "
               f"ratio {ratio:.2f}", a.out + ".png")


# --- 2. learning ------------------------------------------------------------------------------------
def cmd_learning(a: argparse.Namespace) -> None:
    path = model_dir()
    rows = digits_rows(512, seed=a.data_seed)
    order = [f"{fw}{s}" for s in a.seeds for fw in ("rlcore", "trl")]
    times: dict[str, list[float]] = {n: [] for n in order}
    curves: dict[str, dict[str, list[Any]]] = {n: {"reward": [], "completion_length": [], "reward_std": []} for n in order}
    result: dict[str, Any] = {"meta": machine(), "setup": vars(a) | {"func": None}, "task": TASK_NOTE}
    t_start = time.perf_counter()

    def record(name: str) -> Any:
        from transformers import TrainerCallback

        class Log(TrainerCallback):
            def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
                if logs and "reward" in logs:
                    curves[name]["reward"].append(float(logs["reward"]))
                    curves[name]["reward_std"].append(float(logs.get("reward_std", float("nan"))))
                    curves[name]["completion_length"].append(logs.get("completions/mean_length"))
                    save(a.out, {**result, "curves": curves, "step_times": times})  # the step's reward is logged after on_step_end

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                result.update(curves=curves, step_times=times, wall_s=time.perf_counter() - t_start,
                              summary=learning_summary(curves, times, a))
                save(a.out, result)

        return Log()

    with tempfile.TemporaryDirectory() as out:
        for s in a.seeds:  # one seed at a time (a run cut short has whole seeds), rlcore and TRL in lock-step
            baton = Baton([f"rlcore{s}", f"trl{s}"])
            cbs = {fw: [timing_callback(f"{fw}{s}", baton, times[f"{fw}{s}"]), record(f"{fw}{s}")] for fw in ("rlcore", "trl")}
            built = make_trainers(a, path, rows, out, seed=s, steps=a.steps, callbacks=cbs)
            run_in_lockstep(baton, {f"{fw}{s}": built[fw].train for fw in ("rlcore", "trl")})
            del built
    result.update(curves=curves, step_times=times, wall_s=time.perf_counter() - t_start,
                  summary=learning_summary(curves, times, a))
    save(a.out, result)
    print(json.dumps(result["summary"], indent=2))
    plot_learning(curves, result["summary"], a)


TASK_NOTE = ("the built-in digits questions ('What is a + b? Reply with digits only.', a, b in 0..20) as chat "
             "prompts; reward: the share of digit characters in the reply (0-1) plus 1 when its first number is "
             "the sum (0-2). SmolLM2-135M starts low (it writes sentences around the number) and learns to "
             "answer with the number alone; see real_model_base.json for the other candidates' base rates.")


def learning_summary(curves: dict[str, dict[str, list[Any]]], times: dict[str, list[float]],
                     a: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": {}}
    for name, c in curves.items():
        r = c["reward"]
        if not r:
            continue
        k = max(1, round(0.1 * a.steps))
        # a run stopped a step short still has a last 10% (of the steps it logged: "steps" says how many)
        lens = [float(x) for x in c.get("completion_length", []) if x is not None]
        out["runs"][name] = {"steps": len(r), "first_10pct": statistics.mean(r[:k]),
                             "last_10pct": statistics.mean(r[-k:]) if len(r) >= a.steps - 1 else None,
                             "completion_length_first_10pct": statistics.mean(lens[:k]) if lens else None,
                             "completion_length_last_10pct": statistics.mean(lens[-k:]) if lens else None,
                             "wall_s": round(sum(times[name]), 1),
                             "median_step_s": round(statistics.median(times[name]), 2) if times[name] else None}
    for fw in ("rlcore", "trl"):
        runs = [v for n, v in out["runs"].items() if n.startswith(fw)]
        if runs and all(v["last_10pct"] is not None for v in runs) and len(runs) == len(a.seeds):
            out[fw] = {"first_10pct_mean": statistics.mean(v["first_10pct"] for v in runs),
                       "last_10pct_mean": statistics.mean(v["last_10pct"] for v in runs),
                       "wall_s": round(sum(v["wall_s"] for v in runs), 1)}
            if len(runs) > 1:  # the seed-to-seed spread: the yardstick "within noise" is read against
                out[fw]["first_10pct_sd"] = statistics.stdev(v["first_10pct"] for v in runs)
                out[fw]["last_10pct_sd"] = statistics.stdev(v["last_10pct"] for v in runs)
            if all(v["completion_length_last_10pct"] is not None for v in runs):
                out[fw]["completion_length_first_10pct_mean"] = statistics.mean(v["completion_length_first_10pct"] for v in runs)
                out[fw]["completion_length_last_10pct_mean"] = statistics.mean(v["completion_length_last_10pct"] for v in runs)
    if "rlcore" in out and "trl" in out:
        out["goal_last_10pct_rlcore_ge_trl"] = out["rlcore"]["last_10pct_mean"] >= out["trl"]["last_10pct_mean"]
        out["learnt"] = learnt_sentence(out)
    return out


#: a reply of at most this many tokens (last 10% of steps, mean) is the number alone and its EOS
SHORT_REPLY_TOKENS = 4.5


def learnt_sentence(summary: dict[str, Any]) -> str:
    """What the runs learnt, in words: each framework's reward move (first -> last 10% of steps, mean
    of the seeds) and, per run, which of the task's two optima it reached — the sum alone (a reply of
    a few tokens ending in EOS) or a reply running to the length cap with mostly digits (the share of
    digits pays without the right first number)."""
    parts = []
    for fw, label in (("rlcore", "rlcore"), ("trl", "TRL")):
        s = summary[fw]
        runs = {n[len(fw):]: v for n, v in summary["runs"].items() if n.startswith(fw)}
        modes = []
        for seed, v in sorted(runs.items()):
            length = v.get("completion_length_last_10pct")
            kind = ("the number alone" if length is not None and length <= SHORT_REPLY_TOKENS
                    else "long replies of mostly digits")
            modes.append(f"seed {seed}: {kind}, {length:.1f} tokens, reward {v['last_10pct']:.2f}"
                         if length is not None else f"seed {seed}: reward {v['last_10pct']:.2f}")
        parts.append(f"{label} mean reward {s['first_10pct_mean']:.2f} -> {s['last_10pct_mean']:.2f} ("
                     + "; ".join(modes) + ")")
    gained = all(summary[fw]["last_10pct_mean"] > summary[fw]["first_10pct_mean"] for fw in ("rlcore", "trl"))
    verdict = ("both learnt the format (the reward rose on every framework)" if gained
               else "the reward did not rise on both: no learning to report")
    return "; ".join(parts) + f". First/last 10% of steps: {verdict}"


def plot_learning(curves: dict[str, dict[str, list[Any]]], summary: dict[str, Any], a: argparse.Namespace) -> None:
    """Three panels: every run's reward per step; each framework's mean over its seeds (5-step rolling
    mean); each framework's mean reply length (what the model learnt to do with its replies)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5), dpi=110)
    styles = {"rlcore": "tab:blue", "trl": "tab:gray"}
    seeds = [str(x) for x in a.seeds]
    for name, c in curves.items():
        fw = "rlcore" if name.startswith("rlcore") else "trl"
        seed = name[len(fw):]
        run = summary["runs"].get(name, {})
        axes[0].plot(range(1, len(c["reward"]) + 1), c["reward"], color=styles[fw], alpha=0.8, lw=1,
                     ls=["-", "--", ":", "-."][seeds.index(seed) % 4] if seed in seeds else "-",
                     label=f"{'rlcore' if fw == 'rlcore' else 'TRL'} seed {seed}: {run.get('first_10pct', 0):.2f} → "
                           f"{(run.get('last_10pct') or 0):.2f}")

    def mean_curve(fw: str, key: str) -> list[float]:
        runs = [[float(x) if x is not None else float("nan") for x in c[key]] for n, c in curves.items() if n.startswith(fw) and c[key]]
        n = min((len(r) for r in runs), default=0)
        return [statistics.mean(r[k] for r in runs) for k in range(n)]

    for fw, label in (("rlcore", "rlcore"), ("trl", "TRL")):
        m = mean_curve(fw, "reward")
        rolled = [statistics.mean(m[max(0, k - 4):k + 1]) for k in range(len(m))]
        s = summary.get(fw, {})
        axes[1].plot(range(1, len(m) + 1), rolled, color=styles[fw], lw=2,
                     label=f"{label}, mean of {len(seeds)} seeds: {s.get('first_10pct_mean', 0):.2f} → {s.get('last_10pct_mean', 0):.2f}")
        lens = mean_curve(fw, "completion_length")
        axes[2].plot(range(1, len(lens) + 1), lens, color=styles[fw], lw=2, label=label)
    axes[0].set_ylabel("mean reward (digits, 0-2)")
    axes[0].set_title(f"every run: SmolLM2-135M fp32 CPU, {a.prompts}×{a.num_generations} × ≤{a.max_completion_length} tok, "
                      f"lr {a.learning_rate:g}", fontsize=9)
    axes[1].set_title("mean over seeds, 5-step rolling mean", fontsize=9)
    axes[2].set_ylabel("mean reply length (tokens)")
    axes[2].set_title("mean reply length over seeds", fontsize=9)
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(a.out + ".png")


def cmd_merge(a: argparse.Namespace) -> None:
    """One learning result from runs made in several processes (e.g. one seed each, side by side)."""
    parts = [json.load(open(p)) for p in a.parts]
    merged: dict[str, Any] = {"meta": {"parts": [p["meta"] for p in parts]}, "setup": parts[0]["setup"],
                              "task": parts[0].get("task"), "curves": {}, "step_times": {},
                              "wall_s": max(p.get("wall_s", 0.0) for p in parts)}
    for p in parts:
        for name, c in p["curves"].items():
            if c["reward"]:
                merged["curves"][name] = c
                merged["step_times"][name] = p["step_times"][name]
    args = argparse.Namespace(**{**parts[0]["setup"], "out": a.out})
    args.seeds = sorted({int(n[len("rlcore"):]) if n.startswith("rlcore") else int(n[len("trl"):]) for n in merged["curves"]})
    merged["setup"]["seeds"] = args.seeds
    merged["summary"] = learning_summary(merged["curves"], merged["step_times"], args)
    save(a.out, merged)
    print(json.dumps(merged["summary"], indent=2))
    plot_learning(merged["curves"], merged["summary"], args)


# --- 3. sampler -------------------------------------------------------------------------------------
def generate_until_eos(model: Any, tok: Any, prompts: list[list[int]], max_tokens: int, stop_ids: list[int]) -> tuple[int, float, int]:
    """``model.generate`` as a trainer without a sampler calls it (TRL's transformers path): the
    left-padded batch, sampling at temperature 1, each row stopping at its EOS. A finished row stays in
    the batch as padding until the longest is done; the tokens counted are the ones a trainer gets
    (up to and including each row's EOS). Returns (tokens, seconds, decode steps run)."""
    import torch
    from transformers import GenerationConfig

    L = max(len(p) for p in prompts)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (L - len(p)) + p for p in prompts])
    attn = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
    gen = GenerationConfig(max_new_tokens=max_tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                           eos_token_id=list(stop_ids), pad_token_id=pad, bos_token_id=None)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=attn, generation_config=gen)
    seconds = time.perf_counter() - start
    tokens = 0
    for row in out[:, L:].tolist():
        n = next((i + 1 for i, t in enumerate(row) if t in stop_ids), len(row))
        tokens += n
    return tokens, seconds, out.shape[1] - L


async def sample_until_eos(sampler: Any, prompts: list[list[int]], max_tokens: int) -> tuple[int, float]:
    """The sampler as the trainer calls it: every row stops at its EOS (the model's stop tokens)."""
    from rlcore.types import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=1.0)
    start = time.perf_counter()
    outs = await asyncio.gather(*(sampler.generate(p, params.replace(seed=i)) for i, p in enumerate(prompts)))
    return sum(len(o.token_ids) for o in outs), time.perf_counter() - start


def cmd_sampler(a: argparse.Namespace) -> None:
    """Two workloads, each sampler and generate alternating on the same prompts and threads:

    - ``eos``: sampling as a GRPO rollout samples (rows stop at EOS; tokens = what the trainer gets).
      The sampler answers a finished row and drops it from the batch; ``generate`` pads it until the
      batch's longest row is done. This is the workload the goal is about.
    - ``fixed``: every row exactly ``max_tokens`` (EOS ignored): the decode loop's raw speed, where
      both do the same arithmetic (the same prompts, the same batch for every step).
    """
    import torch

    from rlcore.sampling.hf.sampler import HFSampler
    from sampler_throughput import make_prompts, run_generate, run_sampler

    model, tok = load(model_dir(), train=False)
    result: dict[str, Any] = {"meta": machine(), "setup": vars(a) | {"func": None}, "results": []}
    threads = torch.get_num_threads()
    for work in a.work:
        c, t = (int(x) for x in work.lower().split("x"))
        prompts = make_prompts(tok, c)
        # the same intra-op threads as generate (as shipped it would keep one core for the event loop)
        sampler = HFSampler(model, tok, max_batch_size=c, seed=0, num_threads=threads)
        stop_ids = list(sampler.default_stop_token_ids)
        modes: dict[str, Any] = {}
        if "eos" in a.workloads:
            modes["eos/hf_sampler"] = lambda n: asyncio.run(sample_until_eos(sampler, prompts, n))
            modes["eos/generate"] = lambda n: generate_until_eos(model, tok, prompts, n, stop_ids)
        if "fixed" in a.workloads:
            modes["fixed/hf_sampler"] = lambda n: asyncio.run(run_sampler(sampler, prompts, n))
            modes["fixed/generate"] = lambda n: run_generate(model, tok, prompts, n)
        asyncio.run(run_sampler(sampler, prompts, 4))  # warm-up of both, on the same work shortened to 4 tokens
        run_generate(model, tok, prompts, 4)
        runs: dict[str, list[tuple[Any, ...]]] = {m: [] for m in modes}
        for _ in range(a.repeats):  # alternating: every mode sees the same load
            for m, fn in modes.items():
                torch.manual_seed(len(runs[m]))  # generate's draws (the sampler's come from its row seeds)
                runs[m].append(fn(t))
                r = runs[m][-1]
                print(f"{c}x{t} {m}: {r[0]} tokens in {r[1]:.1f} s, {r[0] / r[1]:.1f} tok/s", flush=True)
        asyncio.run(sampler.close())
        rows = {m: {"tokens": [r[0] for r in rs], "seconds": [round(r[1], 2) for r in rs],
                    "tokens_per_s": round(statistics.median(r[0] / r[1] for r in rs), 1)}
                for m, rs in runs.items()}
        for m, rs in runs.items():
            if m == "eos/generate":
                rows[m]["decode_steps"] = [r[2] for r in rs]
        ratios = {w: round(rows[f"{w}/hf_sampler"]["tokens_per_s"] / rows[f"{w}/generate"]["tokens_per_s"], 3)
                  for w in ("eos", "fixed") if w in a.workloads}
        entry = {"concurrency": c, "max_tokens": t, "threads": threads, "modes": rows,
                 "ratio_sampler_over_generate": ratios,
                 "sampler_decode": "cuda_graph" if getattr(sampler, "_engine", None) is not None and sampler._engine.use_graphs
                 else ("static" if getattr(sampler, "_engine", None) is not None else "dynamic")}
        if "eos" in a.workloads:
            entry["mean_completion_tokens"] = {m: round(statistics.mean(r[0] for r in runs[m]) / c, 1)
                                               for m in ("eos/hf_sampler", "eos/generate")}
        result["results"].append(entry)
        save(a.out, result)
        print(f"{c}x{t}: sampler / generate = {ratios} (goal >= 1.5 on the eos workload)")
    result["goal"] = {"eos": 1.5}
    save(a.out, result)
    plot_sampler(result, a.out + ".png")


def plot_sampler(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    entries = result["results"]
    modes = list(entries[0]["modes"])
    label = lambda e: ", ".join(f"{w} ×{r:.2f}" for w, r in e["ratio_sampler_over_generate"].items())
    width = 0.8 / len(modes)
    for j, m in enumerate(modes):
        ax.bar([i + j * width for i in range(len(entries))], [e["modes"][m]["tokens_per_s"] for e in entries], width, label=m)
    ax.set_xticks([i + width * (len(modes) - 1) / 2 for i in range(len(entries))],
                  [f"{e['concurrency']}×{e['max_tokens']}: {label(e)}" for e in entries])
    ax.set_ylabel("generated tokens / s")
    ax.set_title("hf sampler vs model.generate, SmolLM2-135M fp32 CPU", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


# --- packing: the training forward with and without it ---------------------------------------------
def cmd_packing(a: argparse.Namespace) -> None:
    """The loss's logprob pass + backward on a ragged batch shaped like a real step's (prompts of
    the chat template's length, completion lengths drawn from ``--lengths``), with the rows packed
    (rlcore's default) and as they are, alternating."""
    import random

    import torch

    from rlcore.algorithms.logprobs import completion_logprobs, packing_plan

    model, tok = load(model_dir())
    rng = random.Random(0)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 7 + 12? Reply with digits only."}],
                                     tokenize=False, add_generation_prompt=True)
    P = len(tok.encode(prompt, add_special_tokens=False))
    lengths = [rng.choice(a.lengths) for _ in range(a.rows)]
    T = P + max(lengths)
    ids = torch.randint(100, 40000, (a.rows, T), generator=torch.Generator().manual_seed(0))
    attn = torch.zeros(a.rows, T, dtype=torch.long)
    cmask = torch.zeros(a.rows, T)
    for i, n in enumerate(lengths):
        attn[i, : P + n] = 1
        cmask[i, P : P + n] = 1
    plan = packing_plan(model, attn, cmask)
    result: dict[str, Any] = {"meta": machine(), "setup": vars(a) | {"func": None, "prompt_tokens": P, "T": T},
                              "completion_lengths": lengths, "rows_packed": plan.rows if plan else a.rows,
                              "tokens": int(attn.sum()), "positions_unpacked": a.rows * T,
                              "positions_packed": (plan.rows if plan else a.rows) * T}

    def once(pack: bool) -> float:
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        lp, _ = completion_logprobs(model, ids, attn, cmask, entropy=True, pack=pack)
        (lp * cmask).sum().backward()
        return time.perf_counter() - t0

    once(True)  # warm-up
    runs: dict[str, list[float]] = {"packed": [], "unpacked": []}
    for _ in range(a.repeats):
        for name, pack in (("packed", True), ("unpacked", False)):
            runs[name].append(round(once(pack), 2))
            print(name, runs[name][-1], flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    result.update(seconds=runs, median_s=med, ratio_packed_over_unpacked=round(med["packed"] / med["unpacked"], 3))
    save(a.out, result)
    print(f"forward+backward: packed {med['packed']:.2f}s, unpacked {med['unpacked']:.2f}s, "
          f"ratio {result['ratio_packed_over_unpacked']} ({result['rows_packed']} rows instead of {a.rows})")


# --- 4. base rates ----------------------------------------------------------------------------------
def cmd_base(a: argparse.Namespace) -> None:
    """Mean reward of the untrained model on candidate tasks: ``a.prompts_per_task`` prompts × 4 samples."""
    from rlcore import SamplingParams
    from rlcore.loop import Rollout, make_prompts
    from rlcore.sampling.hf.sampler import HFSampler

    model, tok = load(model_dir(), train=False)
    sampler = HFSampler(model, tok, seed=0)
    rollout = Rollout(sampler, SamplingParams(max_tokens=a.max_completion_length, temperature=1.0))
    result: dict[str, Any] = {"meta": machine(), "setup": vars(a) | {"func": None}, "tasks": {}}
    for name, (rows, reward) in base_candidates(a.prompts_per_task).items():
        t0 = time.perf_counter()
        trajs = rollout(make_prompts(rows, tok), num_generations=4)
        texts = [tok.decode(t.completion_ids, skip_special_tokens=True) for t in trajs]
        data = [t.data for t in trajs]
        scores = reward(texts, data)
        result["tasks"][name] = {"samples": len(scores), "mean_reward": round(statistics.mean(scores), 3),
                                 "nonzero_share": round(sum(s > 0 for s in scores) / len(scores), 3),
                                 "seconds": round(time.perf_counter() - t0, 1), "example": texts[0][:200]}
        print(name, result["tasks"][name], flush=True)
        save(a.out, result)
    asyncio.run(sampler.close())


def base_candidates(n: int) -> dict[str, tuple[list[dict[str, Any]], Any]]:
    from rlcore.data.tasks import digits_reward as digits

    out: dict[str, tuple[list[dict[str, Any]], Any]] = {}
    rows = digits_rows(n)
    out["digits (format + correct, 0-2)"] = (rows, lambda texts, data: digits(texts, [d["answer"] for d in data]))
    out["digits, correct sum only (0-1)"] = (rows, lambda texts, data: [float(s >= 1) for s in digits(texts, [d["answer"] for d in data])])
    try:
        from rl_plugin_reasoning_gym.reward import ReasoningGymReward
        from rl_plugin_reasoning_gym.source import reasoning_gym_source
    except Exception:  # noqa: BLE001 - the plugin (and reasoning-gym) are optional here
        return out
    scorer = ReasoningGymReward()
    for task in ("basic_arithmetic", "leg_counting"):
        rg_rows = list(reasoning_gym_source(task, size=n, seed=0, progress=False))
        out[f"reasoning_gym:{task} (its scorer, 0-1)"] = (
            rg_rows, lambda texts, data: [s or 0.0 for s in scorer.score(texts, [d["reasoning_gym"] for d in data])])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=0,
                    help="torch CPU threads for everything (0: torch's default); 1 is steadier on a busy shared machine")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def shape(p: argparse.ArgumentParser, prompts: int, gens: int, tokens: int, lr: float) -> None:
        p.add_argument("--prompts", type=int, default=prompts)
        p.add_argument("--num-generations", type=int, default=gens)
        p.add_argument("--max-completion-length", type=int, default=tokens)
        p.add_argument("--learning-rate", type=float, default=lr)

    p = sub.add_parser("step", help="GRPO step time rlcore / TRL, with a profile")
    shape(p, 2, 8, 128, 1e-5)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--out", default=os.path.join(RESULTS, "real_model_step"))
    p.set_defaults(func=cmd_step)

    p = sub.add_parser("learning", help="reward curves of rlcore and TRL, 2 seeds")
    # 2 prompts x 8 (TRL's default group size): a step's mean reward over 16 completions, not 4 — at 1 x 4
    # the first/last 10% (4 steps) rested on 16 samples and seed noise swamped any difference
    shape(p, 2, 8, 16, 3e-5)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join(RESULTS, "real_model_learning"))
    p.set_defaults(func=cmd_learning)

    p = sub.add_parser("merge-learning", help="one learning JSON/PNG from several processes' JSONs")
    p.add_argument("parts", nargs="+")
    p.add_argument("--out", default=os.path.join(RESULTS, "real_model_learning"))
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser("sampler", help="hf sampler vs model.generate tok/s")
    p.add_argument("--work", nargs="+", default=["64x128"], metavar="CxT")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--workloads", nargs="+", choices=["eos", "fixed"], default=["eos", "fixed"])
    p.add_argument("--out", default=os.path.join(RESULTS, "real_model_sampler"))
    p.set_defaults(func=cmd_sampler)

    p = sub.add_parser("packing", help="the loss's logprob pass + backward, rows packed vs not")
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--lengths", type=int, nargs="+", default=[8, 12, 20, 30, 40, 60, 110, 128],
                   help="completion lengths to draw from (SmolLM2 ends early and rambles to the cap)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default=os.path.join(RESULTS, "real_model_packing"))
    p.set_defaults(func=cmd_packing)

    p = sub.add_parser("base", help="base rewards of candidate tasks")
    p.add_argument("--prompts-per-task", type=int, default=8)
    p.add_argument("--max-completion-length", type=int, default=32)
    p.add_argument("--out", default=os.path.join(RESULTS, "real_model_base"))
    p.set_defaults(func=cmd_base)

    a = ap.parse_args()
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)  # both sides alike (new threads inherit it: OMP_NUM_THREADS too)
    a.func(a)


if __name__ == "__main__":
    main()
