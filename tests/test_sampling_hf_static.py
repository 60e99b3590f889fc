"""The ``hf`` sampler's static decode path (static KV cache, CUDA graphs on CUDA) against the dynamic
loop and the trainer's forward: every sampling feature, rows joining/leaving/moving slots, growth.

The CPU runs the static path eagerly, so its exactness is checked everywhere; the ``gpu`` tests
check the captured graphs themselves (replayed, following in-place weight updates, recaptured when
the parameters are replaced) on a CUDA device.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlcore import ConfigError, SamplingParams
from rlcore.sampling.hf.sampler import HFSampler
from rlcore.sampling.hf.static import LEN_ALIGN, bucket, static_eligible
from rlcore.sampling.processing import counter_uniforms, seed_words
from rlcore.testing import recompute_logprobs as recompute

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def model(tiny_model_dir: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).to(DEVICE).eval()


@pytest.fixture(scope="module")
def tok(tiny_model_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def prompts(tok) -> list[list[int]]:
    texts = ["how many apples", "the dealer has an ace and the player", "north", "12 + 7 = ", "pick a number",
             "a much longer question about the number of apples in the basket, step by step"]
    return [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True),
                       add_special_tokens=False) for t in texts]


async def run_all(sampler: HFSampler, prompts, params) -> list:
    try:
        return await asyncio.gather(*(sampler.generate(p, q) for p, q in zip(prompts, params)))
    finally:
        await sampler.close()


def mixed_params(n: int) -> list[SamplingParams]:
    """Every sampling feature at once, different per row, rows finishing at different steps."""
    out = []
    for i in range(n):
        out.append(SamplingParams(
            max_tokens=3 + 4 * i, temperature=[1.0, 0.7, 0.0, 1.3][i % 4], seed=100 + i, stop_token_ids=[-1],
            top_k=[0, 20, 0, 5][i % 4], top_p=[1.0, 0.9, 1.0, 0.5][i % 4], min_p=[0.0, 0.0, 0.0, 0.05][i % 4],
            repetition_penalty=[1.0, 1.0, 1.2, 1.1][i % 4], min_tokens=[0, 2, 0, 0][i % 4],
        ))
    return out


async def test_static_path_matches_dynamic_loop_and_trainer(model, tok, prompts) -> None:
    params = mixed_params(len(prompts))
    dyn = await run_all(HFSampler(model, tok, decode="dynamic", batch_window_ms=30), prompts, params)
    sta = await run_all(HFSampler(model, tok, decode="static", batch_window_ms=30), prompts, params)
    for p, q, a, b in zip(prompts, params, dyn, sta):
        assert b.meta["decode"] in ("static", "cuda_graph") and b.meta["batch_size"] == len(prompts)
        assert len(b.token_ids) == q.max_tokens == len(b.logprobs)
        assert b.token_ids == a.token_ids  # same seeds, same counter-based draws
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
        ref = recompute(model, p, b.token_ids, q.temperature if q.temperature > 0 else 1.0)
        assert torch.allclose(torch.tensor(b.logprobs), ref, atol=1e-4), (b.logprobs, ref.tolist())


@pytest.mark.parametrize("fused", [True, False])
async def test_steps_attend_only_the_columns_their_rows_hold(model, tok, prompts, fused: bool, monkeypatch) -> None:
    # column buckets of 8, 16, 32 …: the rows cross several while they decode, rows join and leave
    from rlcore.sampling.hf import static as hf_static

    monkeypatch.setattr(hf_static, "COL_MIN", 8)
    # the longest prompt leaves early (its columns are no longer read), a short one runs long (64 → 32 → 128)
    params = [q.replace(max_tokens=m) for q, m in zip(mixed_params(len(prompts)), [40, 3, 60, 20, 10, 3])]
    dyn = await run_all(HFSampler(model, tok, decode="dynamic", batch_window_ms=30), prompts, params)
    s = HFSampler(model, tok, decode="static", fused_decode=fused, batch_window_ms=30, join_window_ms=0)
    sta = await run_all(s, prompts, params)
    # and two rows joining a running one whose columns are already past theirs
    s2 = HFSampler(model, tok, decode="static", fused_decode=fused, batch_window_ms=1, join_window_ms=0)
    first = asyncio.ensure_future(s2.generate(prompts[5], params[5]))
    while not s2.batch_sizes:
        await asyncio.sleep(0.001)
    joined = await asyncio.gather(first, s2.generate(prompts[0], params[0]), s2.generate(prompts[2], params[2]))
    await s2.close()
    for e in (s._engine, s2._engine):
        assert len(e.steps_by_cols) >= 3 and max(e.steps_by_cols) <= e.max_len, e.steps_by_cols
    assert {c.meta["forward"] for c in sta} == {"fused" if fused else "model"}
    for i, b in [*enumerate(sta), (5, joined[0]), (0, joined[1]), (2, joined[2])]:
        assert b.token_ids == dyn[i].token_ids
        assert b.logprobs == pytest.approx(dyn[i].logprobs, abs=1e-4)
        t = params[i].temperature
        assert torch.allclose(torch.tensor(b.logprobs), recompute(model, prompts[i], b.token_ids, t if t > 0 else 1.0), atol=1e-4)


async def test_stops_and_min_tokens_on_the_static_path(model, tok, prompts) -> None:
    s = HFSampler(model, tok, decode="static", batch_window_ms=1)
    try:
        base = await s.generate(prompts[0], SamplingParams(max_tokens=12, seed=5, stop_token_ids=[-1]))
        stop_tok = base.token_ids[3]
        cut = await s.generate(prompts[0], SamplingParams(max_tokens=12, seed=5, stop_token_ids=[stop_tok]))
        first = base.token_ids.index(stop_tok)
        assert cut.finish_reason == "stop" and cut.token_ids == base.token_ids[: first + 1]
        assert cut.text == tok.decode(base.token_ids[:first])
        held = await s.generate(prompts[0], SamplingParams(max_tokens=12, seed=5, stop_token_ids=[base.token_ids[0]], min_tokens=4))
        assert base.token_ids[0] not in held.token_ids[:4]
        text = base.text
        needle = text[len(text) // 2 : len(text) // 2 + 2]
        if needle.strip():
            by_text = await s.generate(prompts[0], SamplingParams(max_tokens=12, seed=5, stop=[needle], stop_token_ids=[-1]))
            assert by_text.finish_reason == "stop" and needle not in by_text.text
            assert by_text.token_ids == base.token_ids[: len(by_text.token_ids)]
    finally:
        await s.close()


async def test_rows_leaving_move_slots_without_changing_anyone(model, tok, prompts) -> None:
    # 12 rows that finish in scrambled order: every finish moves the last live row into the hole
    n = 12
    ps = [prompts[i % len(prompts)] for i in range(n)]
    params = [SamplingParams(max_tokens=2 + (7 * i) % 13, temperature=0.9, seed=7 + i, stop_token_ids=[-1]) for i in range(n)]
    together = await run_all(HFSampler(model, tok, decode="static", batch_window_ms=30), ps, params)
    s = HFSampler(model, tok, decode="static", batch_window_ms=1)
    try:
        for p, q, c in zip(ps, params, together):
            alone = await s.generate(p, q)
            assert alone.token_ids == c.token_ids
            assert alone.logprobs == pytest.approx(c.logprobs, abs=1e-4)
    finally:
        await s.close()


async def test_joiners_grow_the_cache_mid_batch(model, tok, prompts) -> None:
    # one row starts alone (one slot, one length block); joiners need more slots and a longer cache
    s = HFSampler(model, tok, decode="static", batch_window_ms=1, join_window_ms=0)
    try:
        first = asyncio.ensure_future(s.generate(prompts[2], SamplingParams(max_tokens=200, seed=1, stop_token_ids=[-1])))
        while not s.batch_sizes:
            await asyncio.sleep(0.001)
        long_q = SamplingParams(max_tokens=LEN_ALIGN + 8, seed=2, stop_token_ids=[-1])
        joiners = [s.generate(prompts[5], long_q)] + [s.generate(p, SamplingParams(max_tokens=5, seed=3 + k, stop_token_ids=[-1]))
                                                      for k, p in enumerate(prompts[:4])]
        outs = await asyncio.gather(first, *joiners)
        assert s.batch_sizes == [6] and s._engine.max_len >= len(prompts[5]) + LEN_ALIGN + 8 and s._engine.cap >= 6
        assert outs[1].meta["joined_at_step"] > 0
        for p, q, c in zip([prompts[2], prompts[5], *prompts[:4]], [None, long_q] + [None] * 4, outs):
            ref = recompute(model, p, c.token_ids, 1.0)
            assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4)
        assert len(outs[1].token_ids) == LEN_ALIGN + 8
    finally:
        await s.close()


def test_counter_uniforms_are_per_row_and_uniform() -> None:
    lo, hi = (torch.tensor(x) for x in zip(*[seed_words(s) for s in range(4096)]))
    u0 = counter_uniforms(lo, hi, torch.zeros(4096, dtype=torch.long))
    u1 = counter_uniforms(lo, hi, torch.ones(4096, dtype=torch.long))
    assert ((u0 >= 0) & (u0 < 1)).all() and ((u1 >= 0) & (u1 < 1)).all()
    assert abs(u0.mean().item() - 0.5) < 0.02 and abs(u1.std().item() - (1 / 12) ** 0.5) < 0.02
    hist = torch.histc(u0, bins=8, min=0, max=1)
    assert hist.min() > 4096 / 8 * 0.8  # no clumping
    assert (u0 != u1).float().mean() > 0.99
    # a row's draw depends on its own seed and counter only, never on its neighbours
    assert counter_uniforms(lo[7:8], hi[7:8], torch.zeros(1, dtype=torch.long)).item() == u0[7].item()
    assert seed_words(-1) == (0xFFFFFFFF, 0xFFFFFFFF) and seed_words(2**40 + 3) == (3, 2**8)


def test_buckets_and_eligibility(tiny_model_dir: str) -> None:
    sizes = [bucket(n) for n in range(1, 300)]
    assert all(b >= n for n, b in zip(range(1, 300), sizes)) and sizes == sorted(sizes)
    assert len(set(sizes)) <= 20  # few shapes: few graphs
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(tiny_model_dir)
    cfg.use_sliding_window, cfg.sliding_window, cfg.max_window_layers = True, 8, 0
    cfg.layer_types = ["sliding_attention"] * cfg.num_hidden_layers
    windowed = AutoModelForCausalLM.from_config(cfg)
    assert "sliding" in (static_eligible(windowed) or "")
    with pytest.raises(ConfigError, match="cannot serve this model"):
        HFSampler(windowed, tiny_model_dir, decode="static")
    assert HFSampler(windowed, tiny_model_dir)._static_ok is False  # auto: the dynamic loop
    with pytest.raises(ConfigError, match="decode must be"):
        HFSampler(windowed, tiny_model_dir, decode="graphs")


# --- on a CUDA device ---------------------------------------------------------------------------------
@pytest.mark.gpu
async def test_cuda_graphs_replay_exactly_what_eager_steps_compute(model, tok, prompts) -> None:
    params = mixed_params(len(prompts))
    eager = await run_all(HFSampler(model, tok, decode="static", cuda_graphs=False, batch_window_ms=30), prompts, params)
    g = HFSampler(model, tok, batch_window_ms=30)  # auto on CUDA: graphs
    assert g._static_ok
    graphed = await run_all(g, prompts, params)
    assert g._engine.captures > 0 and g._engine.replays > 0
    for p, q, a, b in zip(prompts, params, eager, graphed):
        assert b.meta["decode"] == "cuda_graph"
        assert b.token_ids == a.token_ids
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-5)
        ref = recompute(model, p, b.token_ids, q.temperature if q.temperature > 0 else 1.0)
        assert torch.allclose(torch.tensor(b.logprobs), ref, atol=1e-4)


@pytest.mark.gpu
async def test_graphs_follow_in_place_updates_and_recapture_replaced_weights(tiny_model_dir: str, tok, prompts) -> None:
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).to("cuda")
    s = HFSampler(m, tok, batch_window_ms=1)
    q = SamplingParams(max_tokens=8, seed=9, stop_token_ids=[-1])
    try:
        before = await s.generate(prompts[0], q)
        captured = s._engine.captures
        w = m.model.layers[0].mlp.down_proj.weight
        with torch.no_grad():
            w.mul_(3.0)  # an optimizer step: in place, the captured graph sees it
        moved = await s.generate(prompts[0], q)
        assert s._engine.captures == captured  # no recapture needed
        assert torch.allclose(torch.tensor(moved.logprobs), recompute(m, prompts[0], moved.token_ids, 1.0), atol=1e-4)
        assert moved.logprobs[0] != pytest.approx(before.logprobs[0], abs=1e-5)
        with torch.no_grad():  # a new tensor object: the old graphs would read freed memory
            m.model.layers[0].mlp.down_proj.weight = torch.nn.Parameter(w.detach() / 3.0)
        back = await s.generate(prompts[0], q)
        assert s._engine.captures > captured
        assert back.token_ids == before.token_ids and back.logprobs == pytest.approx(before.logprobs, abs=1e-5)
    finally:
        await s.close()


@pytest.mark.gpu
async def test_bf16_static_path_tracks_the_bf16_forward(tiny_model_dir: str, tok, prompts) -> None:
    s = HFSampler(tiny_model_dir, dtype="bfloat16", batch_window_ms=30, max_batch_size=8)
    params = [SamplingParams(max_tokens=16, seed=i, stop_token_ids=[-1]) for i in range(len(prompts))]
    outs = await run_all(s, prompts, params)
    for p, c in zip(prompts, outs):
        ref = recompute(s.model, p, c.token_ids, 1.0)
        # bf16: the batched decode and the one-sequence forward round differently
        assert (torch.tensor(c.logprobs) - ref).abs().max() < 0.1
