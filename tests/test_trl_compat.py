"""TRL drop-in: snippets written the way TRL 1.16's GRPO docs write them run on TRL's trainer and on
rlcore's with only the import changed, and must agree: the same reward arguments (recorded),
the same metric keys, the same number of completions per step (same seed).

Each snippet is a function of ``lib`` (the ``trl`` module or ``rlcore``) — the one import line a
user changes. TRL runs the real ``trl.GRPOTrainer`` on the same tiny model, on the CPU.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

import pytest

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

import rlcore  # noqa: E402

LIBS = {"trl": trl, "rlcore": rlcore}

#: settings every snippet shares (tiny model, CPU, quiet); the snippets add their own
COMMON = dict(
    per_device_train_batch_size=4, num_generations=4, max_completion_length=8, max_steps=2, logging_steps=1,
    report_to="none", use_cpu=True, bf16=False, save_strategy="no", disable_tqdm=True, seed=0,
    gradient_checkpointing=False,
)


def standard_rows(n: int = 8) -> Any:
    return datasets.Dataset.from_list([{"prompt": f"What is {i} + 1?", "solution": str(i + 1)} for i in range(n)])


def conversational_rows(n: int = 8) -> Any:
    return datasets.Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"What is {i} + 1?"}], "solution": str(i + 1)} for i in range(n)]
    )


class Recorder:
    """A TRL-style reward (``**kwargs``) that records what it was given, per call."""

    def __init__(self, name: str = "recorder") -> None:
        self.__name__ = name
        self.calls: list[dict[str, Any]] = []

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        self.calls.append({
            "keys": sorted(["prompts", "completions", *kwargs]),
            "n": len(completions),
            "prompt_type": _shape(prompts[0]),
            "completion_type": _shape(completions[0]),
            "completion_ids_type": type(kwargs["completion_ids"][0]).__name__,
            "solution": list(kwargs.get("solution", [])),
            "trainer_state_step": kwargs["trainer_state"].global_step,
        })
        kwargs["log_metric"]("recorder/calls", float(len(self.calls)))
        kwargs["log_extra"]("recorder_len", [len(str(c)) for c in completions])
        return [float(len(str(c)) % 3) for c in completions]


def _shape(x: Any) -> str:
    if isinstance(x, str):
        return "str"
    if isinstance(x, list) and x and isinstance(x[0], dict):
        return "messages[" + ",".join(sorted(x[0])) + "]"
    return type(x).__name__


def run(lib: Any, tmp: str, reward_funcs: Any, train_dataset: Any, **over: Any) -> tuple[Any, list[dict[str, Any]]]:
    """``GRPOTrainer(model, reward_funcs=…, args=GRPOConfig(…), train_dataset=…).train()`` as in TRL's docs."""
    from rlcore.testing import tiny_model_path

    values = dict(COMMON, output_dir=tmp)
    values.update(over)
    args = lib.GRPOConfig(**values)
    trainer = lib.GRPOTrainer(model=tiny_model_path(), reward_funcs=reward_funcs, args=args, train_dataset=train_dataset)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]
    return trainer, logs


def both(tmp_path: Any, make: Callable[[], tuple[Any, Any]], **over: Any) -> dict[str, tuple[Any, Any, list[dict[str, Any]]]]:
    """Run one snippet on both trainers; ``make()`` returns fresh (reward_funcs, dataset)."""
    out = {}
    for name, lib in LIBS.items():
        rewards, data = make()
        trainer, logs = run(lib, str(tmp_path / name), rewards, data, **over)
        out[name] = (trainer, rewards, logs)
    return out


# --- 1. reward arguments: TRL's names, TRL's shapes, both dataset formats ---------------------------
@pytest.mark.parametrize("rows,prompt_type,completion_type", [
    (standard_rows, "str", "str"),
    (conversational_rows, "messages[content,role]", "messages[content,role]"),
])
def test_reward_functions_receive_what_trl_passes(tmp_path: Any, rows: Any, prompt_type: str, completion_type: str) -> None:
    res = both(tmp_path, lambda: (Recorder(), rows()))
    calls = {name: r[1].calls for name, r in res.items()}
    assert calls["trl"] and len(calls["trl"]) == len(calls["rlcore"])
    for t, r in zip(calls["trl"], calls["rlcore"]):
        assert r["keys"] == t["keys"]  # exactly TRL's argument names, no more
        assert (r["prompt_type"], r["completion_type"]) == (t["prompt_type"], t["completion_type"]) == (prompt_type, completion_type)
        assert r["completion_ids_type"] == t["completion_ids_type"] == "list"
        assert r["n"] == t["n"]
        assert r["trainer_state_step"] == t["trainer_state_step"]
    # log_metric lands in the step's logs on both
    for name in LIBS:
        assert all("recorder/calls" in h for h in res[name][2]), name


def test_trl_quickstart_rewards_run_on_conversational_data(tmp_path: Any) -> None:
    """TRL 1.16's own reward helpers (conversational completions) score on rlcore as on TRL."""
    from trl.rewards import think_format_reward

    def accuracy_reward(completions: list[Any], solution: list[str], **kwargs: Any) -> list[float]:
        return [float(s in c[0]["content"]) for c, s in zip(completions, solution)]

    res = both(tmp_path, lambda: ([accuracy_reward, think_format_reward], conversational_rows()))
    for name in LIBS:
        logs = res[name][2]
        assert len(logs) == 2
        for h in logs:
            assert h["rewards/think_format_reward/mean"] == 0.0  # scored (random text has no <think>), not NaN
            assert h["rewards/accuracy_reward/mean"] is not None


def test_a_reward_that_always_raises_stops_rlcore_as_it_stops_trl(tmp_path: Any) -> None:
    def format_reward(completions: list[Any], **kwargs: Any) -> list[float]:
        return [float(c[0]["content"].startswith("<think>")) for c in completions]  # conversational code

    with pytest.raises(TypeError):  # TRL: the reward's own exception ends the run
        run(trl, str(tmp_path / "trl"), format_reward, standard_rows())
    with pytest.raises(rlcore.RewardFunctionError, match="format_reward") as info:
        run(rlcore, str(tmp_path / "rlcore"), format_reward, standard_rows())
    assert isinstance(info.value.__cause__, TypeError)


def test_plain_text_prompts_are_not_chat_templated(tmp_path: Any) -> None:
    from transformers import AutoTokenizer

    from rlcore.testing import tiny_model_path

    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    seen: list[list[int]] = []

    def capture(completions: list[Any], trajectories: list[Any], **kwargs: Any) -> list[float]:
        seen.extend(t.prompt_ids for t in trajectories)
        return [0.0] * len(completions)

    run(rlcore, str(tmp_path), capture, standard_rows(4), max_steps=1)
    texts = {tok.decode(ids) for ids in seen}
    assert texts <= {f"What is {i} + 1?" for i in range(4)}  # raw text, as TRL tokenizes it
    assert not any("<|im_start|>" in t for t in texts)


# --- 2. generation-batch arithmetic: same completions per step, same number of generations --------
class Counter:
    def __init__(self) -> None:
        self.__name__ = "counter"
        self.sizes: list[int] = []

    def __call__(self, completions: list[Any], **kwargs: Any) -> list[float]:
        self.sizes.append(len(completions))
        return [float(len(str(c)) % 2) for c in completions]


@pytest.mark.parametrize("over", [
    dict(gradient_accumulation_steps=2, steps_per_generation=2),   # TRL: 4 × 2 = 8 per generation
    dict(gradient_accumulation_steps=2, generation_batch_size=12, num_generations=4),
    dict(gradient_accumulation_steps=2),                            # default: steps_per_generation = accumulation
    dict(steps_per_generation=4, num_iterations=2, max_steps=3),   # one generation spans several optimizer steps
])
def test_generation_batches_match_trl(tmp_path: Any, over: dict[str, Any]) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        res = both(tmp_path, lambda: (Counter(), standard_rows(16)), **over)
    trl_sizes, ours = res["trl"][1].sizes, res["rlcore"][1].sizes
    assert trl_sizes == ours, (trl_sizes, ours)
    assert res["trl"][0].args.generation_batch_size == res["rlcore"][0].args.generation_batch_size
    assert res["trl"][0].args.steps_per_generation == res["rlcore"][0].args.steps_per_generation
    assert res["trl"][0].state.global_step == res["rlcore"][0].state.global_step


@pytest.mark.parametrize("over", [
    dict(max_steps=6),                                              # 4 steps a pass: crosses into the second
    dict(gradient_accumulation_steps=2, steps_per_generation=2, max_steps=3),
    dict(steps_per_generation=4, num_iterations=2, max_steps=3),
    dict(num_iterations=2, max_steps=3),
])
def test_logged_epoch_counts_passes_over_the_dataset_as_trl(tmp_path: Any, over: dict[str, Any]) -> None:
    """The logged ``epoch`` is TRL's (a pass over the prompts), not the fraction of ``max_steps`` done;
    a run longer than one pass keeps training into the next."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        res = both(tmp_path, lambda: (Counter(), standard_rows(4)), **over)
    epochs = {name: [round(h["epoch"], 6) for h in logs] for name, (_, _, logs) in res.items()}
    assert epochs["rlcore"] == epochs["trl"], epochs
    assert res["rlcore"][0].state.global_step == over["max_steps"]


# --- 5. metric keys: every key TRL logs, rlcore logs too --------------------------------------------
@pytest.mark.parametrize("over", [dict(), dict(beta=0.04), dict(loss_type="cispo"), dict(loss_type="luspo", importance_sampling_level="sequence"),
                                  dict(loss_type="vespo"), dict(loss_type="grpo", scale_rewards=False), dict(scale_rewards=True, loss_type="bnpo"),
                                  dict(multi_objective_aggregation="normalize_then_sum", off_policy_mask_threshold=0.5, pad_to_multiple_of=16),
                                  dict(entropy_coef=0.01), dict(use_adaptive_entropy=True, entropy_target=10.0)])
def test_rlcore_logs_every_key_trl_logs(tmp_path: Any, over: dict[str, Any]) -> None:
    res = both(tmp_path, lambda: (Recorder(), standard_rows()), **over)
    trl_keys = set().union(*(h.keys() for h in res["trl"][2]))
    ours = set().union(*(h.keys() for h in res["rlcore"][2]))
    assert trl_keys - ours == set(), sorted(trl_keys - ours)
    for h in res["rlcore"][2]:
        assert h["num_tokens"] > 0 and h["completions/mean_length"] > 0


# --- 4. evaluation and reward models ---------------------------------------------------------------
def test_eval_dataset_is_rolled_out_and_logged_like_trl(tmp_path: Any) -> None:
    def make() -> tuple[Any, Any]:
        return Recorder(), standard_rows()

    out = {}
    for name, lib in LIBS.items():
        rewards, data = make()
        from rlcore.testing import tiny_model_path

        args = lib.GRPOConfig(**dict(COMMON, output_dir=str(tmp_path / name), eval_strategy="steps", eval_steps=1,
                                     per_device_eval_batch_size=4))
        # positional, TRL's order: model, reward_funcs, args, train_dataset, eval_dataset
        trainer = lib.GRPOTrainer(tiny_model_path(), rewards, args, data, standard_rows(4))
        trainer.train()
        out[name] = [h for h in trainer.state.log_history if "eval_reward" in h]
    assert len(out["trl"]) == len(out["rlcore"]) == 2
    trl_keys = set(out["trl"][0]) - {"eval_runtime", "eval_samples_per_second", "eval_steps_per_second"}
    assert trl_keys - set(out["rlcore"][0]) == set(), sorted(trl_keys - set(out["rlcore"][0]))


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory: Any) -> str:
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    from rlcore.testing import tiny_model_path

    src = tiny_model_path()
    cfg = AutoConfig.from_pretrained(src, num_labels=1)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(cfg)
    out = str(tmp_path_factory.mktemp("reward-model"))
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return out


@pytest.mark.parametrize("form", ["path", "object"])
@pytest.mark.parametrize("rows", [standard_rows, conversational_rows])
def test_reward_models_score_like_trl(tmp_path: Any, reward_model_dir: str, form: str, rows: Any) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    logs = {}
    for name, lib in LIBS.items():
        if form == "path":
            rewards, procs = reward_model_dir, None
        else:
            rewards = AutoModelForSequenceClassification.from_pretrained(reward_model_dir, num_labels=1)
            procs = AutoTokenizer.from_pretrained(reward_model_dir)
        from rlcore.testing import tiny_model_path

        args = lib.GRPOConfig(**dict(COMMON, output_dir=str(tmp_path / name), max_steps=1))
        trainer = lib.GRPOTrainer(tiny_model_path(), reward_funcs=rewards, args=args, train_dataset=rows(),
                                  reward_processing_classes=procs)
        trainer.train()
        logs[name] = [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h][0]
    key = f"rewards/{os.path.basename(reward_model_dir)}/mean"
    assert key in logs["trl"] and key in logs["rlcore"]
    assert logs["rlcore"][key] is not None and logs["rlcore"][key] == logs["rlcore"][key]  # a number, not NaN


# --- 3. every TRL GRPOConfig field: accepted with TRL's meaning, or refused in one line -------------
def _trl_only_fields() -> list[Any]:
    import dataclasses

    from transformers import TrainingArguments

    base = {f.name for f in dataclasses.fields(TrainingArguments)}
    return [f for f in dataclasses.fields(trl.GRPOConfig) if f.name not in base]


#: documented deviations from TRL's defaults (docs/porting-trl.md)
DEFAULT_DEVIATIONS = {"logging_steps", "bf16", "output_dir"}


def _non_default(name: str, default: Any) -> Any:
    special = {
        "vllm_mode": "server", "scale_rewards": "batch", "loss_type": "grpo", "importance_sampling_level": "sequence",
        "multi_objective_aggregation": "normalize_then_sum", "vllm_importance_sampling_mode": "token_truncate",
        "vllm_model_impl": "transformers", "pad_to_multiple_of": 64, "model_init_kwargs": {"dtype": "float32"},
        "generation_kwargs": {"max_new_tokens": 4}, "chat_template_kwargs": {"enable_thinking": False},
        "cache_implementation": "static", "vllm_structured_outputs_regex": "a+", "log_completions_hub_repo": "me/x",
        "transformers_continuous_batching_config": {"max_batch_tokens": 64}, "vllm_server_base_url": "http://127.0.0.1:9",
        "num_generations_eval": 2, "top_entropy_quantile": 0.5, "max_tool_calling_iterations": 3,
        "vllm_importance_sampling_clip_min": 0.5, "vllm_importance_sampling_cap": 2.0, "router_aux_loss_coef": 0.01,
        "vllm_max_model_length": 256, "off_policy_mask_threshold": 0.5, "num_completions_to_print": 2,
        "steps_per_generation": 2, "generation_batch_size": 16, "min_p": 0.1, "delta": 1.5, "epsilon_high": 0.28,
        "reward_weights": [1.0], "use_vllm": True, "log_completions": True, "num_generations": 4, "entropy_target": 0.5,
    }
    if name in special:
        return special[name]
    if isinstance(default, bool):
        return not default
    if isinstance(default, (int, float)):
        return default + 1 if isinstance(default, int) else default * 0.5 + 0.1
    if isinstance(default, str):
        return default + "_x"
    raise AssertionError(f"no test value for {name}")


@pytest.mark.parametrize("f", _trl_only_fields(), ids=lambda f: f.name)
def test_every_trl_config_field_is_accepted_or_refused(f: Any, tmp_path: Any) -> None:
    import dataclasses

    from rlcore.training.trl_fields import REFUSED

    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    ours = {g.name: g for g in dataclasses.fields(rlcore.GRPOConfig)}
    assert f.name in ours, f"TRL field {f.name} unknown to rlcore"
    ours_default = ours[f.name].default if ours[f.name].default is not dataclasses.MISSING else ours[f.name].default_factory()
    if f.name not in DEFAULT_DEVIATIONS:
        assert ours_default == default, (f.name, ours_default, default)
    base = dict(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=8, num_generations=8)
    rlcore.GRPOConfig(**{**base, f.name: default})  # TRL's default always constructs
    value = _non_default(f.name, default)
    if f.name in REFUSED:
        with pytest.raises(rlcore.ConfigError, match=f"^{f.name}=") as info:
            rlcore.GRPOConfig(**{**base, f.name: value})
        assert "\n" not in str(info.value) and "not supported" in str(info.value)
    else:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            cfg = rlcore.GRPOConfig(**{**base, f.name: value})
        assert getattr(cfg, f.name) is not None


#: TRL options rlcore implements with TRL's meaning (tests/test_trl_objectives.py runs each against TRL)
IMPLEMENTED = ("multi_objective_aggregation", "off_policy_mask_threshold", "cast_lm_head_to_fp32", "router_aux_loss_coef",
               "pad_to_multiple_of", "log_unique_prompts", "vllm_model_impl")


@pytest.mark.parametrize("name", IMPLEMENTED)
def test_implemented_trl_options_are_taken_not_refused(name: str, tmp_path: Any) -> None:
    import dataclasses

    from rlcore.training.trl_fields import REFUSED

    assert name not in REFUSED
    default = {f.name: f.default for f in dataclasses.fields(trl.GRPOConfig)}[name]
    value = _non_default(name, default)
    cfg = rlcore.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, **{name: value})
    assert getattr(cfg, name) == value  # kept as given, for the trainer to act on


def test_trl_options_map_onto_rlcore(tmp_path: Any) -> None:
    base = dict(output_dir=str(tmp_path), use_cpu=True)
    c = rlcore.GRPOConfig(**base, use_vllm=True, vllm_gpu_memory_utilization=0.5, vllm_max_model_length=1024)
    assert c.sampler == "vllm" and c.sampler_options["gpu_memory_utilization"] == 0.5
    assert c.sampler_options["max_model_len"] == 1024 and c.is_correction == "sequence_mask" and c.is_threshold == 3.0
    c = rlcore.GRPOConfig(**base, use_vllm=True, vllm_mode="server", vllm_server_host="10.0.0.2", vllm_server_port=8123)
    assert c.sampler == "openai" and c.sampler_options["base_url"] == "http://10.0.0.2:8123"
    assert rlcore.GRPOConfig(**base, scale_rewards=True).scale_rewards == "group"
    assert rlcore.GRPOConfig(**base, scale_rewards=False).scale_rewards == "none"
    from rlcore.training.components import sampling_params

    sp = sampling_params(rlcore.GRPOConfig(**base, generation_kwargs={"max_new_tokens": 5, "stop_strings": "##"}))
    assert sp.max_tokens == 5 and sp.stop == ["##"]
    with pytest.raises(rlcore.ConfigError, match="generation_kwargs\\['num_beams'\\]"):
        sampling_params(rlcore.GRPOConfig(**base, generation_kwargs={"num_beams": 4}))


class GenerateRollout:
    """A TRL-style ``rollout_func``: it samples with ``trainer.model.generate`` (its own engine, as
    a vLLM- or OpenEnv-driving rollout_func would), appends an environment reply the model did not
    write (``env_mask`` 0) and returns an extra column for the rewards. Records what it returned."""

    def __init__(self) -> None:
        self.__name__ = "generate_rollout"
        self.returned: list[dict[str, Any]] = []

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        import torch

        tok = trainer.processing_class
        out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [], "feedback": []}
        env_ids = tok.encode(" ENV", add_special_tokens=False)
        for p in prompts:
            ids = tok.encode(p) if isinstance(p, str) else tok.apply_chat_template(p, add_generation_prompt=True, tokenize=True)
            ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
            with torch.no_grad():
                g = trainer.model.generate(torch.tensor([ids], device=trainer.model.device), do_sample=True, max_new_tokens=4,
                                           min_new_tokens=4, output_scores=True, return_dict_in_generate=True,
                                           pad_token_id=tok.pad_token_id)
            new = g.sequences[0, len(ids):].tolist()
            lps = [float(torch.log_softmax(sc[0].float(), -1)[t]) for sc, t in zip(g.scores, new)]
            out["prompt_ids"].append(ids)
            out["completion_ids"].append(new + env_ids)
            out["logprobs"].append(lps + [0.0] * len(env_ids))
            out["env_mask"].append([1] * len(new) + [0] * len(env_ids))
            out["feedback"].append(f"fb{len(out['feedback'])}")
        self.returned.append(out)
        return out


def _prompt(trainer: Any, text: str) -> Any:
    """One rollout prompt from a TRL standard row, built the way the trainer builds its own."""
    from rlcore.data.cursor import make_prompt

    return make_prompt({"prompt": text}, trainer.processing_class, True, None, None, None)


def test_rollout_func_runs_as_on_trl(tmp_path: Any) -> None:
    """TRL's rollout_func: called with the (repeated) prompts and the trainer; its token ids train
    as returned (env_mask 0 tokens are context), extra keys reach the rewards — on both trainers."""
    res = {}
    for name, lib in LIBS.items():
        rollout, recorder = GenerateRollout(), Recorder()
        from rlcore.testing import tiny_model_path

        args = lib.GRPOConfig(**dict(COMMON, output_dir=str(tmp_path / name)))
        trainer = lib.GRPOTrainer(tiny_model_path(), reward_funcs=recorder, args=args, train_dataset=standard_rows(),
                                  rollout_func=rollout)
        trainer.train()
        res[name] = (trainer, rollout, recorder)
    t_calls, r_calls = res["trl"][2].calls, res["rlcore"][2].calls
    assert len(t_calls) == len(r_calls) == 2
    for t, r in zip(t_calls, r_calls):
        assert r["keys"] == t["keys"] and "feedback" in r["keys"]
        assert (r["n"], r["prompt_type"], r["completion_type"]) == (t["n"], t["prompt_type"], t["completion_type"])
    # both hand rollout_func the same number of prompts per call (num_generations copies of each)
    assert [len(o["prompt_ids"]) for o in res["trl"][1].returned] == [len(o["prompt_ids"]) for o in res["rlcore"][1].returned]
    # rlcore trains exactly the returned tokens, with the env tokens masked out
    trainer, rollout = res["rlcore"][0], res["rlcore"][1]
    trajs = trainer.rollout([_prompt(trainer, "What is 1 + 1?")])
    out = rollout.returned[-1]
    assert [t.completion_ids for t in trajs] == out["completion_ids"]
    assert [t.prompt_ids for t in trajs] == out["prompt_ids"]
    assert [t.loss_mask for t in trajs] == out["env_mask"]
    assert [t.data["feedback"] for t in trajs] == out["feedback"]
    for t, lps in zip(trajs, out["logprobs"]):
        assert t.status in ("ok", "truncated") and t.num_turns == 1
        assert [lp for lp, m in zip(t.logprobs, t.loss_mask) if m] == pytest.approx([lp for lp, m in zip(lps, t.loss_mask) if m])


def test_rollout_func_mistakes_fail_in_one_line(tmp_path: Any) -> None:
    from rlcore.testing import tiny_model_path

    args = rlcore.GRPOConfig(**dict(COMMON, output_dir=str(tmp_path)))
    with pytest.raises(rlcore.ConfigError, match="^rollout_func produces the completions itself"):
        rlcore.GRPOTrainer(tiny_model_path(), reward_funcs=Counter(), args=args, train_dataset=standard_rows(),
                           rollout_func=lambda prompts, trainer: {}, tools=[len])

    def short(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        return {"prompt_ids": [[1]] * len(prompts), "completion_ids": [[2, 3]] * len(prompts),
                "logprobs": [[-0.1]] * len(prompts)}

    def missing(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        return {"prompt_ids": [[1]] * len(prompts), "completion_ids": [[2]] * len(prompts)}

    def wrong_count(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        return {"prompt_ids": [[1]], "completion_ids": [[2]], "logprobs": [[-0.1]]}

    def other_tokens(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        return {"prompt_ids": [[1]] * len(prompts), "completion_ids": [[2, 3]] * len(prompts),
                "logprobs": [[-0.1, -0.2]] * len(prompts), "logprob_token_ids": [[2, 4]] * len(prompts)}

    cases = [(short, "1 logprobs"), (missing, r"must return keys \['logprobs'\]"),
             (wrong_count, "returned 1 prompt_ids for 4 prompts"), (other_tokens, "logprobs belong to other tokens")]
    for fn, reason in cases:
        trainer = rlcore.GRPOTrainer(tiny_model_path(), reward_funcs=Counter(), args=args, train_dataset=standard_rows(),
                                     rollout_func=fn)
        trajs = trainer.rollout([_prompt(trainer, "What is 1 + 1?")])
        assert len(trajs) == 4 and all(t.status == "failed" for t in trajs)
        assert all(t.reason and __import__("re").search(reason, t.reason) and "\n" not in t.reason for t in trajs), trajs[0].reason


def test_environment_factory_runs_on_rlcore_tool_scheduler(tmp_path: Any) -> None:
    """TRL's agent API: reset(**row) observation, env methods as tools, get_reward as a reward,
    ``environments`` passed to rewards."""
    from rlcore.testing import tiny_model_path

    resets: list[dict[str, Any]] = []
    seen_envs: list[Any] = []

    class Counting:
        def reset(self, **row: Any) -> str:
            resets.append(row)
            self.moves = 0
            return " (you may call increment)"

        def increment(self, by: int) -> str:
            """Add to the counter.

            Args:
                by: how much to add
            """
            self.moves += by
            return str(self.moves)

        def get_reward(self) -> float:
            return float(self.moves)

    def uses_env(completions: list[Any], environments: list[Any], **kwargs: Any) -> list[float]:
        seen_envs.extend(environments)
        return [0.0] * len(completions)

    args = rlcore.GRPOConfig(**dict(COMMON, output_dir=str(tmp_path), max_steps=1, max_tool_calling_iterations=1))
    trainer = rlcore.GRPOTrainer(tiny_model_path(), reward_funcs=uses_env, args=args, train_dataset=conversational_rows(),
                                 environment_factory=Counting)
    trainer.train()
    assert len(resets) == 4 and all("solution" in r and "prompt" in r for r in resets)
    assert all(isinstance(e, Counting) for e in seen_envs) and len(seen_envs) == 4
    logs = [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]
    assert logs[0]["rewards/Counting/mean"] == 0.0
    assert trainer.scheduler_obj.tool_manager.names == ["increment"]
    assert "tools/call_frequency" in logs[0] and "tools/failure_frequency" in logs[0]


class _Up:
    def reset(self, **row: Any) -> str:
        self.row, self.n = row, 0
        return " (up)"

    def increment(self, by: int) -> str:
        """Add to the counter.

        Args:
            by: how much to add
        """
        self.n += by
        return str(self.n)

    def get_reward(self) -> float:
        return 1.0


class _Down:
    def reset(self, **row: Any) -> None:
        self.row, self.n = row, 0

    def decrement(self, by: int) -> str:
        """Subtract from the counter.

        Args:
            by: how much to subtract
        """
        self.n -= by
        return str(self.n)

    async def get_reward(self) -> float:
        return -1.0


def test_dict_environment_factory_routes_rows_as_on_trl(tmp_path: Any) -> None:
    """TRL's multi-environment form: the ``environment`` column picks the factory, the row's other
    columns reach reset(), each environment's get_reward (sync or async) is a reward of its own
    that scores only its rollouts. (rlcore only: TRL 1.16 refuses tools with the tiny model's chat
    template — "failed to add response schema" — so the semantics followed are those of
    trl/trainer/grpo_trainer.py 1.16, ``_generate_and_score_completions`` and ``__init__``.)"""
    rows = [{"prompt": [{"role": "user", "content": f"Count {i}."}], "environment": "up" if i % 2 == 0 else "down",
             "solution": str(i)} for i in range(8)]
    seen: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    res = {}
    for name, lib in [("rlcore", rlcore)]:
        got: list[tuple[str, dict[str, Any]]] = []
        seen[name] = got

        def record(completions: list[Any], environments: list[Any], **kwargs: Any) -> list[float]:
            got.extend((type(e).__name__, dict(e.row)) for e in environments)
            return [0.0] * len(completions)

        from rlcore.testing import tiny_model_path

        args = lib.GRPOConfig(**dict(COMMON, output_dir=str(tmp_path / name), max_steps=2, max_tool_calling_iterations=1,
                                     per_device_train_batch_size=8, num_generations=2, max_completion_length=4))
        trainer = lib.GRPOTrainer(tiny_model_path(), reward_funcs=record, args=args,
                                  train_dataset=datasets.Dataset.from_list(rows),
                                  environment_factory={"up": _Up, "down": _Down})
        trainer.train()
        res[name] = [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]
    assert len(seen["rlcore"]) == 16  # two steps of 8: every row once (one epoch), 2 generations each
    for got in seen.values():  # every rollout got the env its row named; reset() saw the row without it
        for env, row in got:
            assert "environment" not in row and env == ("_Up" if int(row["solution"]) % 2 == 0 else "_Down")
    import math

    up = [h["rewards/_Up/mean"] for h in res["rlcore"] if not math.isnan(h["rewards/_Up/mean"])]
    down = [h["rewards/_Down/mean"] for h in res["rlcore"] if not math.isnan(h["rewards/_Down/mean"])]
    assert up and down and set(up) == {1.0} and set(down) == {-1.0}  # each scores only its own rollouts


def test_dict_environment_factory_prompts_render_their_own_tools(tmp_path: Any) -> None:
    from rlcore.testing import tiny_model_path
    from rlcore.data.cursor import make_prompt

    args = rlcore.GRPOConfig(**dict(COMMON, output_dir=str(tmp_path), max_steps=1, max_tool_calling_iterations=1))
    rows = [{"prompt": [{"role": "user", "content": "Count."}], "environment": e} for e in ("up", "down", "elsewhere")]
    trainer = rlcore.GRPOTrainer(tiny_model_path(), reward_funcs=Counter(), args=args, train_dataset=rows,
                                 environment_factory={"up": _Up, "down": _Down})
    prompts = [make_prompt(r, trainer.processing_class, True, None, None, None) for r in rows]
    trajs = trainer.rollout(prompts, num_generations=1)
    tok = trainer.processing_class
    up, down, other = trajs
    assert [t["function"]["name"] for t in up.infos["template_tools"]] == ["increment"]
    assert [t["function"]["name"] for t in down.infos["template_tools"]] == ["decrement"]
    head_up, head_down = tok.decode(up.prompt_ids), tok.decode(down.prompt_ids)
    assert "increment" in head_up and "decrement" not in head_up and "(up)" in head_up
    assert "decrement" in head_down and "increment" not in head_down
    assert up.status != "failed" and down.status != "failed", (up.reason, down.reason)
    assert other.status == "failed" and "environment 'elsewhere' is not among environment_factory's" in other.reason


def test_environment_factory_without_dataset_trains_for_max_steps(tmp_path: Any) -> None:
    """TRL: with no train_dataset the environment's reset() writes the prompt; max_steps sets the length."""
    from rlcore.testing import tiny_model_path

    class Owns:
        def reset(self, **row: Any) -> str:
            return "Say a number."

        def get_reward(self) -> float:
            return 0.5

    for name, lib in LIBS.items():
        args = lib.GRPOConfig(**dict(COMMON, output_dir=str(tmp_path / name), max_steps=2, max_tool_calling_iterations=1))
        trainer = lib.GRPOTrainer(tiny_model_path(), reward_funcs=[], args=args, environment_factory=Owns)
        trainer.train()
        logs = [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]
        assert len(logs) == 2 and logs[0]["rewards/Owns/mean"] == 0.5, name
    with pytest.raises(rlcore.ConfigError, match="set max_steps"):
        rlcore.GRPOTrainer(tiny_model_path(), reward_funcs=[], args=rlcore.GRPOConfig(**dict(COMMON, output_dir=str(tmp_path / "x"), max_steps=-1)),
                           environment_factory=Owns)


def _thinking_tokenizer() -> Any:
    """The tiny tokenizer with a Qwen3-style switch: ``enable_thinking=False`` puts an empty think
    block after the assistant header (in the generation prompt and, as Qwen3's template does for
    the final turn, in a rendered assistant message)."""
    from transformers import AutoTokenizer

    from rlcore.testing import tiny_model_path

    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    tok.chat_template = tok.chat_template.replace(
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
        "<think>\n\n</think>\n\n{% endif %}{% endif %}")
    off = "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
    head = "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    assert head in tok.chat_template
    tok.chat_template = tok.chat_template.replace(
        head, "<|im_start|>{{ message['role'] }}\n{% if message['role'] == 'assistant' %}" + off + "{% endif %}{{ message['content'] }}")
    return tok


def test_chat_template_kwargs_render_prompts_as_on_trl(tmp_path: Any) -> None:
    """TRL's chat_template_kwargs reach the policy's chat template: both trainers feed the model
    the same prompt tokens (recorded by a rollout_func, which gets the trainer), and rlcore's
    own rollouts render with them too (their invariant checks included)."""
    from rlcore.testing import tiny_model_path

    seen: dict[str, list[list[int]]] = {}
    for name, lib in LIBS.items():
        tok = _thinking_tokenizer()
        args = lib.GRPOConfig(**dict(COMMON, output_dir=str(tmp_path / name), max_steps=1,
                                     chat_template_kwargs={"enable_thinking": False}))
        trainer = lib.GRPOTrainer(tiny_model_path(), reward_funcs=Counter(), args=args, train_dataset=conversational_rows(),
                                  processing_class=tok)
        if name == "trl":
            ids, _, _ = trainer._tokenize_prompts([[{"role": "user", "content": "What is 1 + 1?"}]])
            seen[name] = [list(ids[0])]
        else:
            from rlcore.data.cursor import make_prompt

            p = make_prompt({"prompt": [{"role": "user", "content": "What is 1 + 1?"}]}, tok, True, None, None, None)
            trajs = trainer.rollout([p])
            assert all(t.status != "failed" for t in trajs), trajs[0].reason
            seen[name] = [list(trajs[0].prompt_ids)]
            trainer.train()
    assert seen["trl"] == seen["rlcore"]
    assert "<think>\n\n</think>" in _thinking_tokenizer().decode(seen["rlcore"][0])
    with pytest.raises(rlcore.ConfigError, match="^chat_template_kwargs may not set tools"):
        rlcore.GRPOConfig(output_dir=str(tmp_path / "x"), chat_template_kwargs={"tools": []})
    cfg = rlcore.GRPOConfig(output_dir=str(tmp_path / "y"), chat_template_kwargs='{"enable_thinking": false}')
    assert cfg.chat_template_kwargs == {"enable_thinking": False}
