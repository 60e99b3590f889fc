"""The ``hf`` sampler on the real tiny transformer: exact logprobs, batching, stops, seeds, weights.

Device-agnostic: every test runs on the default device (CUDA when present) in float32, once per
decode path — ``dynamic`` (the CPU default) and ``static`` (static cache; CUDA graphs on CUDA,
eager on CPU). The trainer-side references are computed on the model's own device.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

import rlcore
from rlcore import SamplerError, SamplingParams
from rlcore.sampling.batcher import MicroBatcher
from rlcore.sampling.hf.sampler import HFSampler
from rlcore.testing import recompute_logprobs  # what a trainer does: one plain forward, logits / temperature


@pytest.fixture(scope="module", params=["dynamic", "static"])
def decode(request) -> str:
    """The decode path under test."""
    return request.param


@pytest.fixture(scope="module")
def sampler(tiny_model_dir: str, decode: str):
    s = HFSampler(tiny_model_dir, batch_window_ms=20, dtype="float32", decode=decode)
    yield s
    asyncio.run(s.close())


@pytest.fixture(scope="module")
def prompts(sampler: HFSampler) -> list[list[int]]:
    tok = sampler.tokenizer
    texts = ["how many apples", "the dealer has an ace and the player", "north", "12 + 7 = ", "pick a number"]
    return [
        tok.encode(tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True),
                   add_special_tokens=False)
        for t in texts
    ]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_logprobs_match_trainer_forward(sampler: HFSampler, prompts, temperature: float) -> None:
    # different prompt lengths in one batch: exercises left padding, the KV cache and row dropping
    params = SamplingParams(max_tokens=12, temperature=temperature, seed=11, stop_token_ids=[-1])
    # different max_tokens: rows finish at different steps and are dropped from the KV cache
    comps = await asyncio.gather(*(
        sampler.generate(p, params.replace(seed=i, max_tokens=4 + 3 * i)) for i, p in enumerate(prompts)
    ))
    assert max(sampler.batch_sizes) > 1
    assert [len(c.token_ids) for c in comps] == [4 + 3 * i for i in range(len(prompts))]
    for p, c in zip(prompts, comps):
        assert len(c.logprobs) == len(c.token_ids) >= 1
        ref = recompute_logprobs(sampler.model, p, c.token_ids, temperature)
        assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4), (c.logprobs, ref.tolist())


async def test_concurrent_requests_are_batched(sampler: HFSampler, prompts) -> None:
    before = len(sampler.batch_sizes)
    await asyncio.gather(*(sampler.generate(prompts[0], SamplingParams(max_tokens=3)) for _ in range(8)))
    assert sum(sampler.batch_sizes[before:]) == 8
    assert len(sampler.batch_sizes[before:]) < 8  # gathered, not one forward loop per request


async def test_seed_reproducible_whatever_the_batch(sampler: HFSampler, prompts) -> None:
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=1234)
    alone = await sampler.generate(prompts[1], params)
    together = await asyncio.gather(
        sampler.generate(prompts[1], params), sampler.generate(prompts[0], params.replace(seed=5)),
        sampler.generate(prompts[2], params.replace(seed=None)),
    )
    assert together[0].token_ids == alone.token_ids
    other = await sampler.generate(prompts[1], params.replace(seed=99))
    assert other.token_ids != alone.token_ids


async def test_length_and_stop_token(sampler: HFSampler, prompts) -> None:
    greedy = SamplingParams(max_tokens=10, temperature=1.0, seed=21, stop_token_ids=[-1])  # seeded: replayable
    base = await sampler.generate(prompts[0], greedy)
    assert base.finish_reason == "length" and len(base.token_ids) == 10
    stop_tok = base.token_ids[4]
    first = base.token_ids.index(stop_tok)
    cut = await sampler.generate(prompts[0], greedy.replace(stop_token_ids=[stop_tok]))
    assert cut.finish_reason == "stop"
    assert cut.token_ids == base.token_ids[: first + 1]  # the stop token is kept (it is trained on)
    assert cut.text == sampler.decode(base.token_ids[:first])  # …but not in the text
    assert cut.meta["stop"] == stop_tok


async def test_stop_string_cuts_text_not_tokens(sampler: HFSampler, prompts) -> None:
    greedy = SamplingParams(max_tokens=16, temperature=1.0, seed=8, stop_token_ids=[-1])  # seeded: replayable
    base = await sampler.generate(prompts[3], greedy)
    start = len(base.text) // 3
    while not base.text[start : start + 2].strip():
        start += 1
    needle = base.text[start : start + 2]
    cut = await sampler.generate(prompts[3], greedy.replace(stop=[needle]))
    assert cut.finish_reason == "stop" and cut.meta["stop"] == needle
    assert needle not in cut.text and base.text.startswith(cut.text)
    assert cut.token_ids == base.token_ids[: len(cut.token_ids)]
    assert needle in sampler.decode(cut.token_ids)


async def test_top_k_one_is_greedy(sampler: HFSampler, prompts) -> None:
    greedy = await sampler.generate(prompts[2], SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=[-1]))
    k1 = await sampler.generate(prompts[2], SamplingParams(max_tokens=8, temperature=1.3, top_k=1, seed=3, stop_token_ids=[-1]))
    p0 = await sampler.generate(prompts[2], SamplingParams(max_tokens=8, temperature=1.3, top_p=1e-6, seed=4, stop_token_ids=[-1]))
    assert k1.token_ids == greedy.token_ids == p0.token_ids
    # logprobs stay the model's (temperature-scaled), not the truncated distribution's 0.0
    assert all(lp < 0 for lp in k1.logprobs)


async def test_n_samples_and_batch_form(sampler: HFSampler, prompts) -> None:
    params = SamplingParams(max_tokens=4, n=3, seed=7)
    many = await sampler.generate_n(prompts[0], params)
    assert len(many) == 3 and len({tuple(c.token_ids) for c in many}) > 1
    grid = await sampler.generate_batch(prompts[:2], params)
    assert [len(row) for row in grid] == [3, 3]
    assert [c.token_ids for c in grid[0]] == [c.token_ids for c in many]  # seeds seed+i, per prompt


async def test_errors_are_one_line_sampler_errors(sampler: HFSampler) -> None:
    with pytest.raises(SamplerError, match="empty prompt"):
        await sampler.generate([], SamplingParams())
    with pytest.raises(SamplerError, match="outside the model's vocabulary"):
        await sampler.generate([10**7], SamplingParams())
    with pytest.raises(SamplerError, match="max_model_len"):
        await sampler.generate([1] * 5000, SamplingParams())


def test_registered_and_listed(sampler: HFSampler) -> None:
    assert {"hf", "vllm", "openai"} <= set(rlcore.available("sampler"))
    assert rlcore.get("sampler", "hf") is HFSampler
    assert rlcore.get("sampler", "transformers") is HFSampler
    from rlcore.sampling import make_sampler

    with pytest.raises(rlcore.ConfigError, match="unknown options: batch_windw_ms"):
        make_sampler("hf", model=sampler.model, tokenizer=sampler.tokenizer, batch_windw_ms=3)


async def test_shared_module_needs_no_copy_and_update_weights_loads(tiny_model_dir: str, prompts, decode: str) -> None:
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    trainer_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).to(device).train()
    s = HFSampler(trainer_model, batch_window_ms=1, decode=decode)
    try:
        params = SamplingParams(max_tokens=6, temperature=1.0, seed=3, stop_token_ids=[-1])
        before = await s.generate(prompts[0], params)
        assert trainer_model.training  # sampled in eval mode, the trainer's mode given back
        # the trainer changes its own module: the sampler sees it with no sync at all
        torch.manual_seed(0)
        with torch.no_grad():
            w = trainer_model.model.layers[-1].mlp.down_proj.weight
            w.add_(torch.randn_like(w))
        changed = await s.generate(prompts[0], params)
        assert not torch.allclose(torch.tensor(changed.logprobs[:1]), torch.tensor(before.logprobs[:1]), atol=1e-3)
        # syncing the shared module's own tensors copies nothing and still bumps the version
        s.update_weights(trainer_model.state_dict())
        assert s.policy_version == 1
        # loading another model's weights in place restores the original behaviour exactly
        fresh = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        s.update_weights(fresh.named_parameters())
        restored = await s.generate(prompts[0], params)
        assert restored.token_ids == before.token_ids and restored.logprobs == pytest.approx(before.logprobs, abs=1e-6)
        assert s.policy_version == 2 and restored.meta["policy_version"] == 2
        with pytest.raises(SamplerError, match="no parameter named"):
            s.update_weights({"not.a.weight": torch.zeros(1)})
        s.sleep()  # CPU: a no-op; shared module: the trainer owns it; generation still works
        s.wake_up()
        assert (await s.generate(prompts[0], params)).token_ids == before.token_ids
    finally:
        await s.close()
    with pytest.raises(SamplerError, match="closed"):
        await s.generate(prompts[0], SamplingParams(max_tokens=2))


async def test_min_tokens_bans_stop_tokens_until_reached(sampler: HFSampler, prompts) -> None:
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=4, stop_token_ids=[-1])
    base = await sampler.generate(prompts[4], params)
    stop_tok = base.token_ids[0]
    early = await sampler.generate(prompts[4], params.replace(stop_token_ids=[stop_tok]))
    assert early.token_ids == [stop_tok] and early.finish_reason == "stop"
    held = await sampler.generate(prompts[4], params.replace(stop_token_ids=[stop_tok], min_tokens=3))
    assert len(held.token_ids) >= 4 or held.finish_reason == "length"
    assert stop_tok not in held.token_ids[:3]


async def test_lora_update_loads_only_adapters(tiny_model_dir: str, prompts, decode: str) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from rlcore.sampling.weights import load_weights_into

    def peft_model():
        cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir).to(device), cfg)

    trainer, served = peft_model(), peft_model()
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in trainer.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    s = HFSampler(served, tokenizer=tiny_model_dir, batch_window_ms=1, decode=decode)
    try:
        params = SamplingParams(max_tokens=4, temperature=1.0, seed=6, stop_token_ids=[-1])
        stale = await s.generate(prompts[1], params)
        s.update_weights(trainer.state_dict(), lora=True)
        fresh = await s.generate(prompts[1], params)
        ref = recompute_logprobs(trainer, prompts[1], fresh.token_ids, 1.0)
        assert torch.allclose(torch.tensor(fresh.logprobs), ref, atol=1e-4)
        assert fresh.logprobs[0] != pytest.approx(stale.logprobs[0], abs=1e-4)
        n_lora = sum("lora_" in k for k in trainer.state_dict())
        assert load_weights_into(served, trainer.state_dict(), lora=True) == n_lora
    finally:
        await s.close()


async def test_late_requests_join_the_running_batch_and_short_ones_leave_early(sampler: HFSampler, prompts) -> None:
    long_params = SamplingParams(max_tokens=1500 if sampler.device.type == "cuda" else 150, temperature=1.0, seed=31,
                                 stop_token_ids=[-1])
    short = SamplingParams(max_tokens=3, temperature=0.8, seed=32, stop_token_ids=[-1])
    n_batches = len(sampler.batch_sizes)
    long_task = asyncio.ensure_future(sampler.generate(prompts[2], long_params))  # a short prompt
    while len(sampler.batch_sizes) == n_batches:  # wait until its batch is decoding
        await asyncio.sleep(0.005)
    # a longer prompt (the running batch's cache is padded to it) and a shorter one (its cache is padded)
    joined = await asyncio.gather(sampler.generate(prompts[1], short), sampler.generate(prompts[3], short))
    assert not long_task.done()  # answered while the long row keeps decoding
    long_c = await long_task
    assert long_c.meta["joined_at_step"] == 0 and long_c.meta["batch_size"] == 1
    assert sampler.batch_sizes[n_batches:] == [3]  # the two late requests were merged into its batch
    for p, c, t in ((prompts[2], long_c, 1.0), (prompts[1], joined[0], 0.8), (prompts[3], joined[1], 0.8)):
        ref = recompute_logprobs(sampler.model, p, c.token_ids, t)
        assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4)
    alone = await sampler.generate(prompts[1], short)
    assert alone.token_ids == joined[0].token_ids  # seeded rows do not depend on their batch


def test_trickling_requests_gather_into_one_batch() -> None:
    # the window restarts on each arrival: five requests 15 ms apart span 60 ms, twice the window,
    # and still form one batch (a window fixed from the first arrival split them [2, 2, 1] or so)
    seen: list[list[int]] = []
    b: MicroBatcher[int] = MicroBatcher(lambda batch: seen.append(batch) or batch, window_s=0.03, max_wait_s=1.0)
    futs = []
    for i in range(5):
        futs.append(b.submit(i))
        time.sleep(0.015)
    assert [f.result(5) for f in futs] == list(range(5))
    assert seen == [[0, 1, 2, 3, 4]]
    b.close()


async def test_staggered_joiners_are_prefilled_together(tiny_model_dir: str, prompts, decode: str) -> None:
    s = HFSampler(tiny_model_dir, batch_window_ms=1, join_window_ms=150, seed=0, dtype="float32", decode=decode)
    try:
        # long enough to still be decoding when the staggered joiners are admitted (CUDA graphs are fast)
        long_params = SamplingParams(max_tokens=3000 if s.device.type == "cuda" else 400, temperature=1.0, seed=41,
                                     stop_token_ids=[-1])
        short = SamplingParams(max_tokens=4, temperature=0.9, stop_token_ids=[-1])
        long_task = asyncio.ensure_future(s.generate(prompts[2], long_params))
        while not s.batch_sizes:
            await asyncio.sleep(0.005)
        joiners = []
        for k, p in enumerate((prompts[0], prompts[3], prompts[4])):  # staggered arrivals
            joiners.append(asyncio.ensure_future(s.generate(p, short.replace(seed=50 + k))))
            await asyncio.sleep(0.02)
        joined = await asyncio.gather(*joiners)
        long_c = await long_task
        assert s.batch_sizes == [4]
        # one prefill for the three, not one each: they joined at the same step
        assert len({c.meta["joined_at_step"] for c in joined}) == 1 and joined[0].meta["joined_at_step"] > 0
        for p, c, t in ((prompts[2], long_c, 1.0), *((p, c, 0.9) for p, c in zip((prompts[0], prompts[3], prompts[4]), joined))):
            ref = recompute_logprobs(s.model, p, c.token_ids, t)
            assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4)
    finally:
        await s.close()


async def test_padding_left_behind_by_finished_rows_is_trimmed(sampler: HFSampler, prompts, decode: str) -> None:
    if decode == "static":
        pytest.skip("the static path pads nothing: each row attends to its own slot's columns only")
    # a long prompt that stops early and a short prompt that goes on: once the long row leaves, the
    # short row's cache is trimmed back to its own length (else every later step carries the padding)
    long_prompt, short_prompt = prompts[1], prompts[2]
    assert len(long_prompt) > len(short_prompt) + 3
    base = SamplingParams(max_tokens=3, temperature=1.0, stop_token_ids=[-1])
    quick, slow = await asyncio.gather(
        sampler.generate(long_prompt, base.replace(seed=61)), sampler.generate(short_prompt, base.replace(seed=62, max_tokens=20)),
    )
    assert quick.meta["batch_size"] == slow.meta["batch_size"] == 2
    assert slow.meta["padded_len"] == len(short_prompt) + len(slow.token_ids) - 1
    ref = recompute_logprobs(sampler.model, short_prompt, slow.token_ids, 1.0)
    assert torch.allclose(torch.tensor(slow.logprobs), ref, atol=1e-4)


def test_decode_steps_write_into_the_cache_instead_of_copying_it(tiny_model_dir: str) -> None:
    """The dynamic loop's cache grows into slack (decode.SlackLayer): a step writes its column into
    the same buffer as the step before (DynamicLayer's update concatenated, a fresh copy each step),
    and the values attended over are exactly what concatenation gives, also after the decoder
    replaced the tensors itself (rows leaving the batch)."""
    from transformers import AutoModelForCausalLM

    from rlcore.sampling.hf import decode

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = torch.randint(3, 60, (3, 5))
    with torch.inference_mode():
        cache = model(input_ids=ids, use_cache=True).past_key_values
        decode._use_slack(cache)
        layer = cache.layers[0]
        assert type(layer) is decode.slack_layer() and decode._can_merge(cache)
        expect_k, expect_v = layer.keys.clone(), layer.values.clone()
        storages = set()
        for step in range(6):
            if step == 3:  # a row leaves: the tensors are replaced from outside, the next update re-buffers
                keep = torch.tensor([0, 2])
                cache.batch_select_indices(keep)
                expect_k, expect_v = expect_k[keep], expect_v[keep]
            k, v = torch.randn_like(expect_k[..., :1, :]), torch.randn_like(expect_v[..., :1, :])
            got_k, got_v = layer.update(k, v)
            expect_k, expect_v = torch.cat([expect_k, k], -2), torch.cat([expect_v, v], -2)
            assert torch.equal(got_k, expect_k) and torch.equal(got_v, expect_v)
            storages.add((step >= 3, got_k.untyped_storage().data_ptr()))
        assert len(storages) == 2, storages  # one buffer before the rows left, one after: no copy per step


def test_large_cpu_forwards_use_every_core(tiny_model_dir: str) -> None:
    """A forward over PARALLEL_MIN_FLOPS runs on every core the process may use (it once kept one for
    the event loop, which halved a 2-core machine); small ones stay on one thread."""
    import os

    from rlcore.sampling.hf.sampler import PARALLEL_MIN_FLOPS

    cores = min(torch.get_num_threads(), len(os.sched_getaffinity(0)))
    if cores < 2:
        pytest.skip("needs 2 usable cores")
    s = HFSampler(tiny_model_dir, dtype="float32", device="cpu")
    before = torch.get_num_threads()
    try:
        big = int(PARALLEL_MIN_FLOPS / (2 * s._n_params)) + 1
        s.set_threads_for(big)
        assert torch.get_num_threads() == cores
        s.set_threads_for(1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
        asyncio.run(s.close())


async def test_identical_prompts_are_prefilled_once(sampler: HFSampler, prompts) -> None:
    """A GRPO group's generations (copies of one prompt) share one prefill row: the prefill forward
    runs over the distinct prompts only, and every row samples what it samples without the sharing
    (same seeds, same tokens, logprobs equal to the trainer's forward)."""
    group = [prompts[1]] * 4 + [prompts[3]] * 3 + [prompts[0]]
    params = SamplingParams(max_tokens=6, temperature=1.0, stop_token_ids=[-1])
    widths: list[int] = []
    hook = sampler.model.register_forward_pre_hook(
        lambda mod, args, kwargs: widths.append(kwargs["input_ids"].shape[1] > 1 and kwargs["input_ids"].shape[0]) or None,
        with_kwargs=True)
    try:
        shared = await asyncio.gather(*(sampler.generate(p, params.replace(seed=i)) for i, p in enumerate(group)))
        prefills = [w for w in widths if w]
        sampler.prefill_dedup = False
        try:
            widths.clear()
            alone = await asyncio.gather(*(sampler.generate(p, params.replace(seed=i)) for i, p in enumerate(group)))
        finally:
            sampler.prefill_dedup = True
        prefills_alone = [w for w in widths if w]
    finally:
        hook.remove()
    assert sum(prefills) == 3 and sum(prefills_alone) == len(group), (prefills, prefills_alone)
    assert [c.token_ids for c in shared] == [c.token_ids for c in alone]
    for p, c, a in zip(group, shared, alone):
        assert torch.allclose(torch.tensor(c.logprobs), torch.tensor(a.logprobs), atol=1e-5)
        ref = recompute_logprobs(sampler.model, p, c.token_ids, 1.0)
        assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4)
