"""TRL 1.16 GRPOConfig options rlcore implements with TRL's meaning, proven in lock-step against the
real ``trl.GRPOTrainer``: ``multi_objective_aggregation``, ``off_policy_mask_threshold``,
``cast_lm_head_to_fp32``, ``router_aux_loss_coef``, ``pad_to_multiple_of``, ``log_unique_prompts``,
``vllm_model_impl``.

Both trainers get the same tiny model, the same TRL ``rollout_func`` (fixed completions and fixed
sampler logprobs, so both score exactly the same tokens), the same rewards and seed; the numbers
each option changes — advantages, per-micro-step losses, logged keys, logprobs — must agree to
float rounding. Each comparison also checks that the option changed the numbers, so an
implementation that ignored it (or computed it another way) fails.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import pytest

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
torch = pytest.importorskip("torch")

import rlcore  # noqa: E402
from rlcore.testing import tiny_model_path  # noqa: E402

LIBS = {"trl": trl, "rlcore": rlcore}
COMMON = dict(
    per_device_train_batch_size=8, num_generations=4, max_completion_length=8, max_steps=2, logging_steps=1,
    report_to="none", use_cpu=True, bf16=False, save_strategy="no", disable_tqdm=True, seed=0,
    gradient_checkpointing=False,
)
#: sampler logprobs handed out, by position in the group: KL(sampler || policy) per token of the
#: random tiny model (whose logprobs are about -6.9) is then about -2, 0, +2 and +4
SAMPLER_LPS = (-9.0, -6.9, -5.0, -3.0)


class FixedRollout:
    """A TRL ``rollout_func`` whose completion ``i`` of each call is fixed: random token ids of
    3–8 tokens (seeded per call) with constant sampler logprobs ``SAMPLER_LPS[i % 4]``."""

    def __init__(self) -> None:
        self.__name__ = "fixed_rollout"
        self.calls = 0

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        tok = trainer.processing_class
        out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        gen = torch.Generator().manual_seed(1234 + self.calls)
        self.calls += 1
        for i, p in enumerate(prompts):
            n = 3 + (i * 5) % 6
            out["prompt_ids"].append(list(tok.encode(p)))
            out["completion_ids"].append(torch.randint(10, 900, (n,), generator=gen).tolist())
            out["logprobs"].append([SAMPLER_LPS[i % len(SAMPLER_LPS)]] * n)
        return out


def r_len(completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
    return [float(len(c) % 4) for c in completion_ids]


def r_big(completion_ids: list[list[int]], **kwargs: Any) -> list[float | None]:
    """A wide-range reward that cannot score every fifth sample (None: TRL's NaN)."""
    return [None if i % 5 == 4 else float(sum(c) % 97) for i, c in enumerate(completion_ids)]


def _prompt(trainer: Any, text: str = "What is 1 + 1?") -> Any:
    """One rollout prompt from a TRL standard row, built the way the trainer builds its own."""
    from rlcore.data.cursor import make_prompt

    return make_prompt({"prompt": text}, trainer.processing_class, True, None, None, None)


def same_prompt_rows(n: int = 8) -> Any:
    return datasets.Dataset.from_list([{"prompt": "What is 1 + 1?", "solution": "2"}] * n)


def lockstep(tmp: Any, over: dict[str, Any], *, model: str | None = None, rewards: tuple = (r_len, r_big),
             rows: Any = same_prompt_rows, libs: tuple[str, ...] = ("trl", "rlcore")) -> dict[str, dict[str, Any]]:
    """Train on each library with the same config; record each generation's advantages (TRL's
    ``_generate_and_score_completions`` output, rlcore's estimator output), each micro-step's loss
    and the logged steps."""
    res: dict[str, dict[str, Any]] = {}
    for name in libs:
        lib = LIBS[name]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args = lib.GRPOConfig(**{**COMMON, "output_dir": str(tmp / name), **over})
            t = lib.GRPOTrainer(model or tiny_model_path(), reward_funcs=list(rewards), args=args, train_dataset=rows(),
                                rollout_func=FixedRollout())
        cap: dict[str, Any] = {"adv": [], "loss": [], "batches": []}
        if name == "trl":
            gen = t._generate_and_score_completions

            def record_trl(inputs: Any, gen: Any = gen, cap: dict = cap) -> Any:
                out = gen(inputs)
                cap["adv"].append(out["advantages"].detach().float().flatten().clone())
                return out

            t._generate_and_score_completions = record_trl
        else:
            score = t._score

            def record_rlcore(trajs: Any, score: Any = score, cap: dict = cap) -> Any:
                scored = score(trajs)
                cap["adv"].append(torch.as_tensor(scored.advantages, dtype=torch.float32).flatten().clone())
                return scored

            t._score = record_rlcore
        compute = t.compute_loss

        def record_loss(model: Any, inputs: Any, *a: Any, compute: Any = compute, cap: dict = cap, **k: Any) -> Any:
            if "batch" in inputs:
                cap["batches"].append(inputs["batch"])
            loss = compute(model, inputs, *a, **k)
            cap["loss"].append(float((loss[0] if isinstance(loss, tuple) else loss).detach()))
            return loss

        t.compute_loss = record_loss
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t.train()
        cap["logs"] = [h for h in t.state.log_history if "loss" in h and "train_runtime" not in h]
        cap["trainer"] = t
        res[name] = cap
    return res


def assert_same(res: dict[str, dict[str, Any]], atol: float = 2e-6) -> None:
    t, r = res["trl"], res["rlcore"]
    assert len(t["adv"]) == len(r["adv"]) >= 1
    for a, b in zip(t["adv"], r["adv"]):
        assert torch.allclose(a, b, atol=1e-5), (a.tolist(), b.tolist())
    assert len(t["loss"]) == len(r["loss"]) >= 2
    assert r["loss"] == pytest.approx(t["loss"], abs=atol), (t["loss"], r["loss"])


# --- 1. multi_objective_aggregation="normalize_then_sum" (GDPO) ---------------------------------------
@pytest.mark.parametrize("over", [
    dict(),
    dict(reward_weights=[2.0, 0.5], scale_rewards="batch"),
])
def test_normalize_then_sum_matches_trl(tmp_path: Any, over: dict[str, Any]) -> None:
    gdpo = lockstep(tmp_path / "gdpo", dict(over, multi_objective_aggregation="normalize_then_sum"))
    assert_same(gdpo)
    for t, r in zip(gdpo["trl"]["logs"], gdpo["rlcore"]["logs"]):
        assert r["frac_reward_zero_std"] == t["frac_reward_zero_std"]
        assert r["reward"] == pytest.approx(t["reward"], abs=1e-5)  # logged reward: the weighted sum of raw rewards, as TRL
    plain = lockstep(tmp_path / "sum", over, libs=("rlcore",))
    assert not torch.allclose(plain["rlcore"]["adv"][0], gdpo["rlcore"]["adv"][0], atol=1e-2)  # the option changed them


def test_normalize_then_sum_composes_with_other_estimators(tmp_path: Any) -> None:
    """Any estimator but grpo gets the GDPO aggregate as the trajectory's reward (rloo's baseline
    is then taken over it); scale_rewards='none' cannot hold under GDPO's grpo: one line."""
    from rlcore.algorithms.advantages import rloo_advantages
    from rlcore.rewards import normalize_then_sum

    res = lockstep(tmp_path, dict(multi_objective_aggregation="normalize_then_sum", advantage="rloo", max_steps=1),
                   libs=("rlcore",))
    trainer = res["rlcore"]["trainer"]
    trajs = trainer.rollout([_prompt(trainer), _prompt(trainer)])
    scored = trainer._score(trajs)
    adv, columns = scored.advantages, scored.columns
    groups = [t.group_id for t in trajs]
    expected, _ = rloo_advantages(normalize_then_sum(columns, trainer.reward_weights, groups), groups)
    assert torch.allclose(torch.as_tensor(adv), expected.float(), atol=1e-5) and expected.abs().sum() > 0
    with pytest.raises(rlcore.ConfigError, match="^multi_objective_aggregation='normalize_then_sum' always divides") as info:
        rlcore.GRPOConfig(output_dir=str(tmp_path / "x"), multi_objective_aggregation="normalize_then_sum", scale_rewards=False)
    assert "\n" not in str(info.value)
    with pytest.raises(rlcore.ConfigError, match="^multi_objective_aggregation='mean' is not one of"):
        rlcore.GRPOConfig(output_dir=str(tmp_path / "y"), multi_objective_aggregation="mean")


# --- 2. off_policy_mask_threshold (OPSM) --------------------------------------------------------------
@pytest.mark.parametrize("over", [
    dict(),                                     # on policy: only the sampler/trainer mismatch is off-policy
    dict(num_iterations=2, learning_rate=1e-3),  # second pass: the policy moved since the rollout too
    dict(loss_type="grpo", beta=0.04),           # the KL term is added after the mask (masked rows keep it)
])
def test_off_policy_mask_matches_trl(tmp_path: Any, over: dict[str, Any]) -> None:
    masked = lockstep(tmp_path / "opsm", dict(over, off_policy_mask_threshold=0.5))
    assert_same(masked)
    dropped = [h["off_policy_mask/dropped_frac"] for h in masked["rlcore"]["logs"]]
    assert max(dropped) > 0  # some negative-advantage trajectories were far enough off policy
    plain = lockstep(tmp_path / "plain", over, libs=("rlcore",))
    assert plain["rlcore"]["loss"][0] != pytest.approx(masked["rlcore"]["loss"][0], abs=1e-3)


def test_off_policy_mask_keeps_positive_advantages_and_reads_sampler_logprobs() -> None:
    """The rule itself, on numbers chosen by hand: a negative-advantage row is dropped only when
    its mean KL(sampler || current) is above the threshold; a row without complete sampler
    logprobs falls back to the old policy's."""
    from rlcore.algorithms.losses import off_policy_mask

    logps = torch.full((4, 3), -2.0)
    sampler = torch.tensor([[-1.0] * 3, [-1.0] * 3, [-1.9] * 3, [-1.0] * 3])  # KL 1, 1, 0.1, 1
    adv = torch.tensor([[1.0], [-1.0], [-1.0], [-1.0]])
    mask = torch.ones(4, 3)
    valid = torch.tensor([True, True, True, False])
    keep = off_policy_mask(adv, logps, sampler, logps.clone(), mask, 0.5, valid)
    assert keep.flatten().tolist() == [1.0, 0.0, 1.0, 1.0]
    with pytest.raises(rlcore.ConfigError, match="^off_policy_mask_threshold must be"):
        rlcore.GRPOConfig(output_dir="/tmp/rlcore-opsm-x", off_policy_mask_threshold=-1.0)


# --- 3. cast_lm_head_to_fp32 --------------------------------------------------------------------------
def _bf16_trainers(tmp: Any, cast: bool) -> dict[str, Any]:
    out = {}
    for name, lib in LIBS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args = lib.GRPOConfig(**{**COMMON, "output_dir": str(tmp / f"{name}-{cast}"), "beta": 0.04,
                                     "model_init_kwargs": {"dtype": "bfloat16"}, "cast_lm_head_to_fp32": cast})
            out[name] = lib.GRPOTrainer(tiny_model_path(), reward_funcs=[r_len], args=args, train_dataset=same_prompt_rows(),
                                        rollout_func=FixedRollout())
    return out


def test_cast_lm_head_to_fp32_logprobs_match_trl(tmp_path: Any) -> None:
    """Policy and reference logprobs of a bf16 model with the float32 head equal TRL's, and differ
    from the bf16 head's by far more than that agreement (so the cast is what they measure)."""
    from rlcore.loop.loss import batch_logprobs, pack

    trainers = _bf16_trainers(tmp_path, cast=True)
    ours, theirs = trainers["rlcore"], trainers["trl"]
    for m in (ours.model, ours.ref_model):
        assert m.lm_head.weight.dtype == torch.float32 and m.model.layers[0].mlp.gate_proj.weight.dtype == torch.bfloat16
        assert m.get_input_embeddings()(torch.tensor([[3]])).dtype == torch.bfloat16  # tied: the body still runs in bf16
    trajs = ours.rollout([_prompt(ours)])
    batch = pack(trajs, [0.0] * len(trajs), ours.pad_token_id)
    P = len(trajs[0].prompt_ids)
    C = batch.input_ids.shape[1] - P
    comp_mask = batch.completion_mask[:, P:]
    for our_model, their_model in ((ours.model, theirs.model), (ours.ref_model, theirs.ref_model)):
        mine = batch_logprobs(our_model, batch)[:, P:]
        with torch.no_grad():
            trl_lp, _, _ = theirs._get_per_token_logps_and_entropies(their_model, batch.input_ids, batch.attention_mask, C)
        diff = ((mine - trl_lp.float()) * comp_mask).abs().max()
        assert diff < 1e-4, float(diff)
    plain = _bf16_trainers(tmp_path, cast=False)["rlcore"]
    bf16_head = batch_logprobs(plain.model, batch)[:, P:]
    assert ((bf16_head - mine) * comp_mask).abs().max() > 20 * max(float(diff), 1e-5)


@pytest.mark.parametrize("decode", ["dynamic", "static"])
def test_cast_lm_head_to_fp32_hf_sampler_draws_from_the_float32_head(tmp_path: Any, decode: str) -> None:
    """The colocated hf sampler shares the module: it samples from the float32 head's logits and
    reports their logprobs, which are the trainer's to bf16-body rounding (the rollout invariants
    hold: nothing is counted as a violation) on both decode paths."""
    from rlcore.loop.loss import batch_logprobs, pack

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = rlcore.GRPOConfig(**{**COMMON, "output_dir": str(tmp_path), "cast_lm_head_to_fp32": True, "max_steps": 1,
                                    "model_init_kwargs": {"dtype": "bfloat16"}, "sampler_options": {"decode": decode}})
        t = rlcore.GRPOTrainer(tiny_model_path(), reward_funcs=[r_len], args=args, train_dataset=same_prompt_rows())
    assert t.sampler.model is t.model or getattr(t.sampler.model, "lm_head", None) is t.model.lm_head
    trajs = t.rollout([_prompt(t)])
    assert all(x.status != "failed" for x in trajs), trajs[0].reason
    assert t._invariant_failures == 0
    batch = pack(trajs, [0.0] * len(trajs), t.pad_token_id)
    trainer_lp = batch_logprobs(t.model, batch)
    m = batch.completion_mask
    assert ((trainer_lp - batch.sampler_logps) * m).abs().max() < 0.1  # bf16 body, float32 head on both sides
    t.train()
    assert t.state.global_step == 1


def test_cast_lm_head_to_fp32_refuses_an_adapter_on_lm_head(tmp_path: Any) -> None:
    pytest.importorskip("peft")
    args = rlcore.GRPOConfig(**{**COMMON, "output_dir": str(tmp_path), "cast_lm_head_to_fp32": True, "use_peft": True,
                                "lora_target_modules": ["q_proj", "lm_head"]})
    with pytest.raises(rlcore.ConfigError, match="^cast_lm_head_to_fp32=True is not supported when the lm_head carries"):
        rlcore.GRPOTrainer(tiny_model_path(), reward_funcs=[r_len], args=args, train_dataset=same_prompt_rows())


# --- 4. router_aux_loss_coef (MoE load balancing) ------------------------------------------------------
@pytest.mark.parametrize("over", [dict(), dict(router_aux_loss_coef=0.5)])
def test_router_aux_loss_matches_trl(tmp_path: Any, over: dict[str, Any]) -> None:
    moe = tiny_model_path(arch="qwen2_moe")
    res = lockstep(tmp_path / "aux", over, model=moe)
    assert_same(res, atol=1e-6)
    for t, r in zip(res["trl"]["logs"], res["rlcore"]["logs"]):
        assert r["aux_loss"] == pytest.approx(t["aux_loss"], abs=1e-6) and r["aux_loss"] > 0
    # the term added is coef × aux: the loss without it differs by exactly that
    off = lockstep(tmp_path / "off", dict(router_aux_loss_coef=0.0), model=moe, libs=("rlcore",))
    coef = over.get("router_aux_loss_coef", 0.001)  # None: the config's own (the tiny MoE declares 0.001)
    aux = res["rlcore"]["logs"][0]["aux_loss"]
    assert res["rlcore"]["loss"][0] - off["rlcore"]["loss"][0] == pytest.approx(coef * aux, rel=1e-3, abs=1e-7)
    assert "aux_loss" not in off["rlcore"]["logs"][0]


def test_router_aux_loss_trains_a_tiny_moe_with_the_hf_sampler(tmp_path: Any) -> None:
    moe = tiny_model_path(arch="qwen2_moe")
    args = rlcore.GRPOConfig(**{**COMMON, "output_dir": str(tmp_path), "router_aux_loss_coef": 0.1, "learning_rate": 1e-3})
    t = rlcore.GRPOTrainer(moe, reward_funcs=[r_len], args=args, train_dataset=same_prompt_rows())
    gate = t.model.model.layers[0].mlp.gate.weight.detach().clone()
    t.train()
    logs = [h for h in t.state.log_history if "loss" in h and "train_runtime" not in h]
    assert len(logs) == 2 and all(h["aux_loss"] > 0 and h["invariant_violations"] == 0 for h in logs)
    assert not torch.equal(gate, t.model.model.layers[0].mlp.gate.weight)  # the router trained


def test_router_aux_loss_coef_on_a_dense_model_fails_like_trl(tmp_path: Any) -> None:
    args = rlcore.GRPOConfig(**{**COMMON, "output_dir": str(tmp_path), "router_aux_loss_coef": 0.01})
    with pytest.raises(ValueError, match="not a Mixture-of-Experts"):
        trl.GRPOTrainer(tiny_model_path(), reward_funcs=[r_len], args=trl.GRPOConfig(**{**COMMON, "output_dir": str(tmp_path / "t"),
                                                                                         "router_aux_loss_coef": 0.01}),
                        train_dataset=same_prompt_rows())
    with pytest.raises(rlcore.ConfigError, match="^router_aux_loss_coef=0.01 but Qwen2ForCausalLM is not a Mixture-of-Experts") as info:
        rlcore.GRPOTrainer(tiny_model_path(), reward_funcs=[r_len], args=args, train_dataset=same_prompt_rows())
    assert "\n" not in str(info.value)
    t = rlcore.GRPOTrainer(tiny_model_path(), reward_funcs=[r_len], train_dataset=same_prompt_rows(),
                           args=rlcore.GRPOConfig(**{**COMMON, "output_dir": str(tmp_path / "none")}))
    assert t.router_aux is None  # unset on a dense model: nothing to add, as TRL


# --- 5. pad_to_multiple_of, log_unique_prompts, vllm_model_impl ----------------------------------------
def test_pad_to_multiple_of_changes_no_loss_number(tmp_path: Any) -> None:
    padded = lockstep(tmp_path / "pad", dict(pad_to_multiple_of=64, num_iterations=2, beta=0.04, loss_type="grpo"))
    assert_same(padded)
    assert all(b.input_ids.shape[1] % 64 == 0 for b in padded["rlcore"]["batches"])
    plain = lockstep(tmp_path / "plain", dict(num_iterations=2, beta=0.04, loss_type="grpo"), libs=("rlcore",))
    assert all(b.input_ids.shape[1] % 64 for b in plain["rlcore"]["batches"])  # it did pad
    assert padded["rlcore"]["loss"] == pytest.approx(plain["rlcore"]["loss"], abs=1e-6)
    for key in ("kl", "entropy", "clip_ratio/region"):
        assert [h[key] for h in padded["rlcore"]["logs"]] == pytest.approx([h[key] for h in plain["rlcore"]["logs"]], abs=1e-6)
    assert rlcore.GRPOConfig(output_dir=str(tmp_path / "a"), pad_to_multiple_of="none").pad_to_multiple_of is None
    assert rlcore.GRPOConfig(output_dir=str(tmp_path / "b"), pad_to_multiple_of="32").pad_to_multiple_of == 32
    with pytest.raises(rlcore.ConfigError, match="^pad_to_multiple_of must be a positive integer"):
        rlcore.GRPOConfig(output_dir=str(tmp_path / "c"), pad_to_multiple_of=0)


def test_log_unique_prompts_keeps_one_completion_per_prompt_as_trl(tmp_path: Any) -> None:
    """TRL drops repeated prompts from the completions table it logs (``df["prompt"].astype(str)
    .duplicated()``); rlcore's logged table is OUTPUT_DIR/completions.jsonl (and the printed sample)."""
    import pandas as pd

    def distinct_rows() -> Any:
        return datasets.Dataset.from_list([{"prompt": f"What is {i} + 1?", "solution": str(i + 1)} for i in range(8)])

    over = dict(log_completions=True, log_unique_prompts=True, num_completions_to_print=0)
    lockstep(tmp_path, over, rows=distinct_rows)
    ours = [json.loads(line) for line in open(tmp_path / "rlcore" / "completions.jsonl", encoding="utf-8")]
    theirs = sorted((tmp_path / "trl" / "completions").glob("*.parquet"))
    assert len(theirs) == 2
    steps = sorted({r["step"] for r in ours})
    assert len(steps) == 2
    for step, path in zip(steps, theirs):
        df = pd.read_parquet(path)
        assert len(df) == 8  # TRL's parquet keeps every completion; the logged table drops repeats:
        trl_table = df[~df["prompt"].astype(str).duplicated()]  # TRL 1.16 GRPOTrainer.log, log_unique_prompts
        mine = [r for r in ours if r["step"] == step]
        assert len(mine) == len(trl_table) == 2 and len({r["prompt"] for r in mine}) == 2
    every = lockstep(tmp_path / "all", dict(over, log_unique_prompts=False), rows=distinct_rows, libs=("rlcore",))
    assert every and sum(1 for _ in open(tmp_path / "all" / "rlcore" / "completions.jsonl", encoding="utf-8")) == 16


def test_vllm_model_impl_reaches_the_vllm_engine(tmp_path: Any, vllm_standin: Any) -> None:
    """TRL hands its colocated engine ``model_impl=args.vllm_model_impl`` (grpo_trainer.py 1.16);
    vLLM 0.33's ``EngineArgs.model_impl`` (vllm/engine/arg_utils.py) takes it."""
    vllm_standin("0.33.0")
    base = dict(COMMON, output_dir=str(tmp_path), use_vllm=True, vllm_mode="colocate")
    for value in ("vllm", "transformers"):
        args = rlcore.GRPOConfig(**dict(base, vllm_model_impl=value, output_dir=str(tmp_path / value)))
        assert args.sampler == "vllm" and args.sampler_options["model_impl"] == value
        t = rlcore.GRPOTrainer(tiny_model_path(), reward_funcs=[r_len], args=args, train_dataset=same_prompt_rows())
        assert t.sampler.llm.kwargs["model_impl"] == value
        import asyncio

        asyncio.run(t.sampler.close())
    own = rlcore.GRPOConfig(output_dir=str(tmp_path / "o"), sampler="vllm", vllm_model_impl="transformers")
    assert own.sampler_options["model_impl"] == "transformers"
    assert "model_impl" not in rlcore.GRPOConfig(output_dir=str(tmp_path / "d"), sampler="vllm").sampler_options  # vLLM's auto
    kept = rlcore.GRPOConfig(**dict(base, vllm_model_impl="transformers", sampler_options={"engine_args": {"model_impl": "auto"}}))
    assert "model_impl" not in kept.sampler_options  # the explicit engine argument wins
    with pytest.raises(rlcore.ConfigError, match="^vllm_model_impl='jax' is not one of"):
        rlcore.GRPOConfig(output_dir=str(tmp_path / "x"), vllm_model_impl="jax")
    args = rlcore.GRPOConfig(**dict(COMMON, output_dir=str(tmp_path / "hf"), vllm_model_impl="transformers"))
    with pytest.raises(rlcore.ConfigError, match="^vllm_model_impl='transformers' applies to the colocated vllm sampler"):
        rlcore.GRPOTrainer(tiny_model_path(), reward_funcs=[r_len], args=args, train_dataset=same_prompt_rows())


def test_the_options_are_cli_and_yaml_flags(tmp_path: Any) -> None:
    """`rlcore train --help-all` lists each option (`--help` shows the ~20 most runs set), and the
    flags (or a YAML config) set them."""
    from rlcore.commands.train import _parser, _read_config_file, help_text

    text = help_text(full=True)
    names = ("multi_objective_aggregation", "off_policy_mask_threshold", "cast_lm_head_to_fp32", "router_aux_loss_coef",
             "pad_to_multiple_of", "log_unique_prompts", "vllm_model_impl")
    assert all(f"--{n}" in text for n in names)
    argv = ["--output_dir", str(tmp_path / "cli"), "--use_cpu", "true", "--multi_objective_aggregation", "normalize_then_sum",
            "--off_policy_mask_threshold", "0.5", "--cast_lm_head_to_fp32", "--router_aux_loss_coef", "0.01",
            "--pad_to_multiple_of", "64", "--log_unique_prompts", "--vllm_model_impl", "transformers"]
    (cfg,) = _parser().parse_args_into_dataclasses(args=argv)
    assert (cfg.multi_objective_aggregation, cfg.off_policy_mask_threshold, cfg.cast_lm_head_to_fp32, cfg.router_aux_loss_coef,
            cfg.pad_to_multiple_of, cfg.log_unique_prompts, cfg.vllm_model_impl) == (
        "normalize_then_sum", 0.5, True, 0.01, 64, True, "transformers")
    path = tmp_path / "run.yaml"
    path.write_text("multi_objective_aggregation: normalize_then_sum\npad-to-multiple-of: 32\noff_policy_mask_threshold: 0.25\n")
    values = _read_config_file(str(path))
    cfg = rlcore.GRPOConfig(output_dir=str(tmp_path / "yaml"), **values)
    assert (cfg.multi_objective_aggregation, cfg.pad_to_multiple_of, cfg.off_policy_mask_threshold) == ("normalize_then_sum", 32, 0.25)


def test_loop_policy_takes_the_model_options() -> None:
    """rlcore.loop.Policy (the hand-written-loop API) runs the same code: an MoE policy adds
    coef × aux to its loss, and the float32 head applies to it and its reference model."""
    from rlcore import SamplingParams
    from rlcore.loop import Policy, sample

    losses, aux = {}, {}
    for coef in (0.0, 0.5):
        policy = Policy(tiny_model_path(arch="qwen2_moe"), loss="grpo", router_aux_loss_coef=coef)
        sampler = rlcore.get("sampler", "hf")(policy.model, policy.tokenizer, seed=0)
        trajs = sample(sampler, ["What is 2+2?"], SamplingParams(max_tokens=4, n=4, seed=0))
        out = policy.forward_backward(trajs, [1.0, -1.0, 0.5, -0.5])
        losses[coef], aux[coef] = out["loss"], out.get("aux_loss")
    assert aux[0.0] is None and aux[0.5] > 0
    assert losses[0.5] - losses[0.0] == pytest.approx(0.5 * aux[0.5], rel=1e-4)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path(), dtype=torch.bfloat16)
    policy = Policy(model, loss="grpo", beta=0.04, cast_lm_head_to_fp32=True)
    assert policy.model.lm_head.weight.dtype == policy.ref_model.lm_head.weight.dtype == torch.float32
    assert policy.ref_model.lm_head is not policy.model.lm_head
    assert policy.ref_model.lm_head.forward.__self__ is policy.ref_model.lm_head  # the copy computes with its own weight
