"""The trainer and its sampler between generations: ``sleep_sampler`` (TRL's ``vllm_enable_sleep_mode``)
frees the sampler's memory during every training step without changing a number, and a weight sync
to a sampler with its own copy sends the policy under its full names (``model.…``, ``lm_head``) —
names a vLLM engine or server loads (the test server refuses others, as vLLM's loader does).

The vLLM side runs on :mod:`rlcore.testing.vllm_standin` (vLLM cannot be installed here): its
``sleep(level=2)`` overwrites the weights with NaN, as real level-2 sleep discards them, so a run
that generated without re-sending them would not reproduce the awake run's numbers."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import torch
from transformers import TrainerCallback

from rlcore import ConfigError, SamplerError, SamplingParams
from rlcore.sampling.hf.sampler import HFSampler
from rlcore.sampling.hf.decode import Request
from rlcore.data.tasks import digits_dataset
from rlcore.trainer.grpo import GRPOConfig, GRPOTrainer


def config(tmp_path: Any, **over: Any) -> GRPOConfig:
    values: dict[str, Any] = dict(
        output_dir=str(tmp_path), reward_funcs=["digits"], num_generations=4, per_device_train_batch_size=8,
        max_completion_length=6, max_steps=2, learning_rate=1e-2, save_strategy="no", seed=0, logging_steps=1,
        disable_tqdm=True, report_to="none",
    )
    values.update(over)
    return GRPOConfig(**values)


def logged(tmp_path: Any) -> list[dict[str, Any]]:
    with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


class AtOptimizerStep(TrainerCallback):
    """Calls ``probe()`` at every optimizer step (the moment the memory is wanted back)."""

    def __init__(self, probe: Any) -> None:
        self.probe, self.seen = probe, []

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.seen.append(self.probe())


def engine_bytes(sampler: HFSampler) -> int:
    e = sampler._engine
    if e is None:
        return 0
    return sum(t.numel() * t.element_size() for t in [*e.k, *e.v, *e.state.values()])


# --- hf: the static cache and graphs are freed during training -----------------------------------------
def test_hf_sampler_sleeps_through_every_training_step_and_no_number_changes(tmp_path: Any, tiny_model_dir: str) -> None:
    runs = {}
    for sleep in (False, True):
        out = tmp_path / str(sleep)
        # the static decode path holds a KV cache across batches (on CUDA it is the default)
        args = config(out, sleep_sampler=sleep, sampler_options={"decode": "static"},
                      eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=8)
        holder: dict[str, Any] = {}
        probe = AtOptimizerStep(lambda: (holder["t"].sampler.is_sleeping, engine_bytes(holder["t"].sampler)))
        trainer = GRPOTrainer(tiny_model_dir, args=args, train_dataset=digits_dataset(16),
                              eval_dataset=digits_dataset(8, seed=1), callbacks=[probe])
        holder["t"] = trainer
        assert trainer.sampler.is_sleeping is sleep  # asleep from the start, as TRL's colocated engine
        trainer.train()
        runs[sleep] = (probe.seen, logged(out), trainer.sampler)
    awake_seen, awake_rows, _ = runs[False]
    asleep_seen, asleep_rows, sampler = runs[True]
    assert len(asleep_seen) == 2
    assert all(not s and b > 0 for s, b in awake_seen)  # without it the cache stays during training
    assert all(s and b == 0 for s, b in asleep_seen)  # with it: asleep, nothing held
    assert sampler.batch_sizes and sampler.is_sleeping  # it generated, and ended asleep
    # the same tokens, rewards, losses and eval numbers: sleeping changed only the memory
    assert len(asleep_rows) == len(awake_rows) >= 4
    for a, b in zip(awake_rows, asleep_rows):
        keys = [k for k in a if k.startswith(("loss", "reward", "completion_length", "eval_"))]
        assert keys and {k: a[k] for k in keys} == pytest.approx({k: b[k] for k in keys}, abs=1e-6)
    with pytest.raises(SamplerError, match="asleep"):
        sampler.generate_sync([5, 6, 7], SamplingParams(max_tokens=2))
    sampler.wake_up()
    assert len(sampler.generate_sync([5, 6, 7], SamplingParams(max_tokens=2, min_tokens=2)).token_ids) == 2


def test_sleep_refuses_a_request_queued_before_it_and_levels_are_checked(tiny_model_dir: str) -> None:
    s = HFSampler(tiny_model_dir, decode="static", seed=0)
    s.generate_sync([5, 6, 7], SamplingParams(max_tokens=3))
    assert engine_bytes(s) > 0
    with pytest.raises(SamplerError, match="level must be 1 or 2"):
        s.sleep(level=3)
    with s._lock:  # a request that got past the check before sleep() took the lock (the batch waits on it)
        fut = s._batcher.submit(Request([5, 6, 7], SamplingParams(max_tokens=2)))
        s._asleep = True
    with pytest.raises(SamplerError, match="asleep"):
        fut.result(timeout=30)
    s._asleep = False
    s.sleep()
    assert s._engine is None and s.is_sleeping
    s.wake_up()
    assert not s.is_sleeping and s.generate_sync([5, 6, 7], SamplingParams(max_tokens=2)).token_ids


# --- vLLM: TRL's vllm_enable_sleep_mode ---------------------------------------------------------------
def test_vllm_sleep_mode_sleeps_the_engine_through_training_like_trl(tmp_path: Any, tiny_model_dir: str,
                                                                      vllm_standin: Any) -> None:
    vllm_standin(hang_s=10.0)  # generating on a sleeping engine fails the test instead of hanging
    runs = {}
    for sleep in (False, True):
        out = tmp_path / str(sleep)
        args = config(out, use_vllm=True, vllm_enable_sleep_mode=sleep)
        assert args.sampler == "vllm" and args.sleep_sampler is sleep
        assert args.sampler_options["enable_sleep_mode"] is sleep
        holder: dict[str, Any] = {}
        probe = AtOptimizerStep(lambda: set(holder["t"].sampler.llm.sleeping))
        trainer = GRPOTrainer(tiny_model_dir, args=args, train_dataset=digits_dataset(16), callbacks=[probe])
        holder["t"] = trainer
        assert bool(trainer.sampler.llm.sleeping) is sleep
        trainer.train()
        runs[sleep] = (probe.seen, logged(out))
        asyncio_close(trainer.sampler)
    assert runs[False][0] == [set(), set()]
    assert runs[True][0] == [{"weights", "kv_cache"}] * 2  # level 2 during each optimizer step
    for a, b in zip(runs[False][1], runs[True][1]):
        assert (a["loss"], a["reward"]) == pytest.approx((b["loss"], b["reward"]), abs=1e-6)


def asyncio_close(sampler: Any) -> None:
    import asyncio

    asyncio.run(sampler.close())


def test_sleep_sampler_configuration_errors(tmp_path: Any, tiny_model_dir: str) -> None:
    with pytest.raises(ConfigError, match="enable_sleep_mode=True"):
        config(tmp_path, sampler="vllm", sleep_sampler=True, sampler_options={"enable_sleep_mode": False})
    assert config(tmp_path, sampler="vllm", sleep_sampler=True).sampler_options["enable_sleep_mode"] is True

    class NoSleep:
        tokenizer = None
        policy_version = 0

        async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Any:
            raise AssertionError("not reached")

    with pytest.raises(ConfigError, match="NoSleep has no sleep or wake_up"):
        GRPOTrainer(tiny_model_dir, args=config(tmp_path, sleep_sampler=True), train_dataset=digits_dataset(8),
                    sampler=NoSleep())
    from rlcore.distributed.dp_trainer import RayGRPOTrainer

    with pytest.raises(ConfigError, match="RayGRPOTrainer's samplers run in their own processes"):
        RayGRPOTrainer(tiny_model_dir, args=config(tmp_path, sleep_sampler=True), train_dataset=digits_dataset(8))


# --- weight sync to a sampler with its own copy: the full names ----------------------------------------
def test_sync_to_a_separate_sampler_sends_full_names_and_the_untied_lm_head(tmp_path: Any, tiny_model_dir: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    untied = tmp_path / "untied"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.config.tie_word_embeddings = False
    fresh = AutoModelForCausalLM.from_config(model.config)
    fresh.load_state_dict(model.state_dict(), strict=False)  # lm_head starts as a copy, then trains on its own
    with torch.no_grad():
        fresh.lm_head.weight.copy_(model.get_input_embeddings().weight)
    fresh.save_pretrained(untied)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(untied)

    separate = HFSampler(str(untied), seed=0, dtype="float32")
    received: list[list[str]] = []
    load = separate.update_weights

    def recording(weights: Any, **kw: Any) -> Any:
        received.append(list(dict(weights)))
        return load(weights, **kw)

    separate.update_weights = recording  # type: ignore[method-assign]
    trainer = GRPOTrainer(str(untied), args=config(tmp_path / "run", learning_rate=5e-2), train_dataset=digits_dataset(16),
                          sampler=separate)
    trainer.train()
    trainer.sync_weights()
    names = {n for n, _ in trainer.model.named_parameters()}
    assert "lm_head.weight" in names and received and all(set(r) == names for r in received)
    start = AutoModelForCausalLM.from_pretrained(untied).lm_head.weight
    assert not torch.allclose(trainer.model.lm_head.weight, start)  # the head trained …
    for n, p in separate.model.named_parameters():  # … and every tensor, the head too, reached the sampler
        assert torch.equal(p, dict(trainer.model.named_parameters())[n]), n


def test_server_mode_trainer_reaches_a_server_that_checks_names_like_vllm(tmp_path: Any, tiny_model_dir: str) -> None:
    """TRL's ``vllm_mode="server"``: the weights the trainer sends load under vLLM's name rules (the
    test server refuses what vLLM 0.33's ``AutoWeightsLoader`` refuses), and the server ends with the
    trainer's weights."""
    from rlcore.sampling.openai import OpenAISampler
    from rlcore.testing.openai_server import OpenAICompatServer

    served = HFSampler(tiny_model_dir, batch_window_ms=5, seed=0)
    srv = OpenAICompatServer(served, model_name=tiny_model_dir).start()  # `vllm serve <path>` serves it by that name
    try:
        bare = OpenAISampler(srv.url, tokenizer=tiny_model_dir, backoff=0.01, max_retries=1)
        embed = served.model.get_input_embeddings().weight.detach().clone()
        with pytest.raises(SamplerError, match="no module or parameter named 'embed_tokens'"):
            bare.update_weights({"embed_tokens.weight": embed})  # the name the inner decoder stack gives it
        args = config(tmp_path, use_vllm=True, vllm_mode="server", vllm_server_base_url=srv.url, vllm_server_timeout=30)
        trainer = GRPOTrainer(tiny_model_dir, args=args, train_dataset=digits_dataset(16))
        assert args.sampler == "openai"
        trainer.train()
        trainer.sync_weights()
        mine = dict(trainer.model.named_parameters())
        assert not torch.equal(mine["model.embed_tokens.weight"], embed)
        for n, p in served.model.named_parameters():
            assert torch.equal(p, mine[n].detach().to(p.dtype)), n
    finally:
        srv.stop()
