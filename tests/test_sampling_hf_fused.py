"""The static path's fused decode forward (:mod:`rlcore.sampling.hf.fused`) against the models' own
forward: every family it claims (qwen2, qwen3, llama with biases and scaled RoPE, mistral), rows of
different lengths, bf16, accelerate-style autocast, and the models it must leave alone.

The step is checked directly (logits of the next token over a cache of real prefills vs a full
forward of the sequence) and through the sampler (fused vs the model's forward vs the dynamic loop:
same tokens, same logprobs, with rows joining mid-batch).
"""

from __future__ import annotations

import asyncio
from types import MethodType

import pytest
import torch

from rlcore import SamplingParams
from rlcore.sampling.hf.sampler import HFSampler
from rlcore.sampling.hf.fused import (
    FusedDecode,
    forward_autocast,
    pack_groups,
    rotate_half_matrix,
    rotation,
    unsupported,
)
from rlcore.sampling.hf.static import _layer_kv
from rlcore.testing import recompute_logprobs


@pytest.fixture(scope="module")
def tok(tiny_model_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def build(arch: str, vocab: int, dtype: torch.dtype = torch.float32):
    """A small random model of ``arch`` (built offline), in eval mode."""
    import transformers
    from rlcore.data.demo import tiny_model_path

    if arch in ("qwen2", "qwen3"):
        return transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path(arch=arch), dtype=dtype).eval()
    common = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=vocab, max_position_embeddings=512)
    if arch == "llama":  # biases everywhere (the unfused residual path) and linearly scaled RoPE
        config = transformers.LlamaConfig(attention_bias=True, mlp_bias=True,
                                          rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}, **common)
    else:
        config = transformers.MistralConfig(sliding_window=None, head_dim=16, **common)
    torch.manual_seed(1)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def prompts_for(tok) -> list[list[int]]:
    texts = ["how many apples", "north or south", "the dealer has an ace and the player has a ten, what now", "12 + 7 ="]
    return [tok.encode(t, add_special_tokens=False) for t in texts]


def fused_step(model, prompts: list[list[int]], columns: int = 64, prefill=None, pack: bool | None = None) -> torch.Tensor:
    """Logits of each prompt's last token from the fused step, over a static cache holding the real
    prefill (by ``prefill``, default ``model``) of the tokens before it (each row at its own length,
    as the static path lays them out)."""
    n, layers = len(prompts), model.config.num_hidden_layers
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    with torch.inference_mode():
        for j, p in enumerate(prompts):
            out = (prefill or model)(torch.tensor([p[:-1]]), use_cache=True)
            kv = _layer_kv(getattr(out, "cache", None) or out.past_key_values)
            if not keys:
                _, hkv, _, d = kv[0][0].shape
                keys = [torch.zeros((n, hkv, columns, d), dtype=kv[0][0].dtype) for _ in range(layers)]
                values = [torch.zeros_like(k) for k in keys]
            for (k, v), (kc, vc) in zip(kv, zip(keys, values)):
                kc[j, :, : len(p) - 1] = k[0]
                vc[j, :, : len(p) - 1] = v[0]
        pos = torch.tensor([len(p) - 1 for p in prompts])
        neg = torch.finfo(keys[0].dtype).min
        mask = torch.where(torch.arange(columns)[None] <= pos[:, None], 0.0, neg).to(keys[0].dtype)
        tok = torch.tensor([p[-1] for p in prompts])
        fused = FusedDecode(model, torch.device("cpu"), pack=pack)
        # small models pack by default, what can be packed (LoRA layers are not)
        assert fused.packed is (pack is not False and any(pack_groups(fused.model)))
        return fused(tok, pos, mask[:, None, None, :], keys, values, torch.arange(n)).float()


def full_forward(model, prompts: list[list[int]]) -> torch.Tensor:
    with torch.inference_mode():
        return torch.stack([model(torch.tensor([p])).logits[0, -1].float() for p in prompts])


def test_rotation_matrix_is_rotate_half_rope() -> None:
    torch.manual_seed(0)
    x, cos, sin = torch.randn(3, 5, 8), torch.randn(3, 8), torch.randn(3, 8)
    half = torch.cat((-x[..., 4:], x[..., :4]), dim=-1)
    assert torch.equal(x @ rotate_half_matrix(8, torch.float32, x.device), half)
    expected = x * cos[:, None] + half * sin[:, None]
    assert torch.allclose(torch.bmm(x, rotation(cos, sin)), expected, atol=1e-6)


@pytest.mark.parametrize("pack", [None, False])
@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama", "mistral"])
def test_fused_step_equals_the_models_forward(arch: str, pack: bool | None, tok) -> None:
    model = build(arch, len(tok))
    assert unsupported(model) is None
    prompts = prompts_for(tok)
    got, ref = fused_step(model, prompts, pack=pack), full_forward(model, prompts)
    assert ref.abs().max() > 0.1  # real logits, not a degenerate model
    assert (got - ref).abs().max() < 1e-4, arch


def test_packed_projections_follow_the_weights_batch_by_batch(tiny_model_dir: str, tok) -> None:
    """The packed copies are refreshed before every batch, also after writes through ``.data`` (which
    leave no trace in a parameter's version counter); the budget decides when to pack."""
    from rlcore.sampling.hf import fused as hf_fused
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompt = prompts_for(tok)[2]
    q = SamplingParams(max_tokens=6, seed=3, stop_token_ids=[-1])
    s = HFSampler(model, tok, decode="static", batch_window_ms=1)
    before = s.generate_sync(prompt, q)
    assert s._engine.fused.packed
    model.model.layers[0].self_attn.k_proj.weight.data.mul_(1.5)  # an optimizer that writes through .data
    model.model.layers[1].mlp.up_proj.weight.data.mul_(0.5)
    after = s.generate_sync(prompt, q)
    assert after.logprobs[0] != pytest.approx(before.logprobs[0], abs=1e-4)
    assert torch.allclose(torch.tensor(after.logprobs), recompute_logprobs(model, prompt, after.token_ids), atol=1e-4)
    need, allowed = hf_fused.pack_budget(model, torch.device("cpu"))
    assert 0 < need <= allowed and not FusedDecode(model, torch.device("cpu"), pack=False).packed
    old = hf_fused.PACK_CPU_BYTES
    hf_fused.PACK_CPU_BYTES = need - 1  # one byte short: not packed
    try:
        assert not FusedDecode(model, torch.device("cpu")).packed
    finally:
        hf_fused.PACK_CPU_BYTES = old


def test_bf16_fused_step_is_as_close_to_float32_as_the_models_bf16_forward(tok) -> None:
    prompts = prompts_for(tok)
    exact = full_forward(build("qwen2", len(tok)), prompts)
    bf16 = build("qwen2", len(tok), torch.bfloat16)
    err_model = (full_forward(bf16, prompts) - exact).abs().max().item()
    err_fused = (fused_step(bf16, prompts) - exact).abs().max().item()
    assert 0 < err_fused <= 2 * err_model + 1e-3, (err_fused, err_model)


def test_autocast_wrapped_forward_is_followed(tok) -> None:
    """accelerate's mixed precision wraps ``model.forward`` in autocast (``Accelerator.prepare_model``,
    accelerate 1.15): the fused step must compute under the same autocast, not in float32."""
    from accelerate.utils import convert_outputs_to_fp32

    prompts = prompts_for(tok)
    model, plain = build("qwen2", len(tok)), build("qwen2", len(tok))
    assert forward_autocast(model, torch.device("cpu")) is None
    model.forward = MethodType(convert_outputs_to_fp32(torch.autocast("cpu", dtype=torch.bfloat16)(model.forward.__func__)), model)
    assert forward_autocast(model, torch.device("cpu")) is torch.bfloat16
    # the same float32 cache for both, so only the step itself can differ
    exact_step, autocast_step = fused_step(plain, prompts, prefill=plain), fused_step(model, prompts, prefill=plain)
    assert (exact_step - full_forward(plain, prompts)).abs().max() < 1e-4
    gap = (autocast_step - exact_step).abs().max().item()
    assert gap > 1e-3  # the step ran under bf16 autocast, not in float32
    # and the wrapped model's own forward is as far from float32 as the fused step under autocast
    err_wrapped = (full_forward(model, prompts) - full_forward(plain, prompts)).abs().max().item()
    assert gap <= 2 * err_wrapped + 1e-3, (gap, err_wrapped)


async def _run(sampler: HFSampler, prompts, params, stagger: float = 0.0) -> list:
    async def one(i: int):
        await asyncio.sleep(stagger * i)
        return await sampler.generate(prompts[i], params[i])

    try:
        return await asyncio.gather(*(one(i) for i in range(len(prompts))))
    finally:
        await sampler.close()


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
async def test_sampler_fused_matches_model_forward_and_dynamic_loop(arch: str, tok) -> None:
    model = build(arch, len(tok))
    prompts = prompts_for(tok) * 2
    # the first rows are the longest, so the batch they start is still decoding when the later ones arrive
    params = [SamplingParams(max_tokens=40 - 3 * i, temperature=[1.0, 0.7, 0.0, 1.2][i % 4], seed=7 + i,
                             top_p=[1.0, 0.9][i % 2], repetition_penalty=[1.0, 1.1][i % 2], stop_token_ids=[-1])
              for i in range(len(prompts))]
    runs = {
        "fused": await _run(HFSampler(model, tok, decode="static", batch_window_ms=5, join_window_ms=1), prompts, params, 0.01),
        "model": await _run(HFSampler(model, tok, decode="static", fused_decode=False, batch_window_ms=5, join_window_ms=1),
                            prompts, params, 0.01),
        "dynamic": await _run(HFSampler(model, tok, decode="dynamic", batch_window_ms=30), prompts, params),
    }
    assert {c.meta["forward"] for c in runs["fused"]} == {"fused"}
    assert {c.meta["forward"] for c in runs["model"]} == {"model"}
    assert any(c.meta["joined_at_step"] > 0 for c in runs["fused"])  # rows did join a running batch
    for other in ("model", "dynamic"):
        for a, b in zip(runs["fused"], runs[other]):
            assert a.token_ids == b.token_ids, other
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4, other


def lora_model(tiny_model_dir: str, dtype: torch.dtype = torch.float32, **kw):
    import peft
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=dtype)
    torch.manual_seed(3)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"],
                             init_lora_weights=False, **kw)  # random B: the adapters change the logits
    return peft.get_peft_model(base, config).eval()


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CUDA the sampler tests below run CUDA graphs


def test_lora_adapters_are_part_of_the_fused_step(tiny_model_dir: str, tok) -> None:
    """A colocated LoRA run samples from the PEFT model itself: the fused step adds each active
    adapter's ``B(A(x))·scaling`` as PEFT 0.21's ``lora.Linear.forward`` does."""
    model = lora_model(tiny_model_dir)
    assert unsupported(model) is None
    prompts = prompts_for(tok)
    with_adapters = full_forward(model, prompts)
    with model.disable_adapter():
        assert "disabled" in unsupported(model)
        without = full_forward(model, prompts)
    assert (with_adapters - without).abs().max() > 0.1  # the adapters matter
    assert (fused_step(model, prompts) - with_adapters).abs().max() < 1e-4
    model.merge_adapter()  # merged into the base weights: the adapters are not added twice
    assert (fused_step(model, prompts) - with_adapters).abs().max() < 1e-4
    model.unmerge_adapter()


def test_float32_adapters_over_a_bf16_base(tiny_model_dir: str, tok) -> None:
    """PEFT keeps adapters in float32 over a bf16 base (autocast_adapter_dtype): the fused step adds
    them in float32 and rounds once, as PEFT does."""
    prompts = prompts_for(tok)
    exact = full_forward(lora_model(tiny_model_dir), prompts)
    model = lora_model(tiny_model_dir, torch.bfloat16)
    a = model.base_model.model.model.layers[0].self_attn.q_proj
    assert a.base_layer.weight.dtype == torch.bfloat16 and a.lora_A["default"].weight.dtype == torch.float32
    err_model = (full_forward(model, prompts) - exact).abs().max().item()
    err_fused = (fused_step(model, prompts) - exact).abs().max().item()
    assert 0 < err_fused <= 2 * err_model + 1e-3, (err_fused, err_model)


async def test_lora_sampler_fuses_and_follows_a_scaling_change(tiny_model_dir: str, tok) -> None:
    """On CUDA a captured graph bakes the LoRA scale in: a new scale must drop the graphs."""
    model = lora_model(tiny_model_dir).to(DEVICE)
    prompts = prompts_for(tok)
    params = [SamplingParams(max_tokens=6, seed=i, stop_token_ids=[-1]) for i in range(len(prompts))]

    async def both() -> tuple[list, list]:
        fused = HFSampler(model, tok, decode="static", batch_window_ms=30)
        plain = HFSampler(model, tok, decode="static", fused_decode=False, batch_window_ms=30)
        return await _run(fused, prompts, params), await _run(plain, prompts, params)

    fused, plain = await both()
    assert {c.meta["forward"] for c in fused} == {"fused"}
    assert [c.token_ids for c in fused] == [c.token_ids for c in plain]
    sampler = HFSampler(model, tok, decode="static", batch_window_ms=30)
    first = await asyncio.gather(*(sampler.generate(p, q) for p, q in zip(prompts, params)))
    engine = sampler._engine
    for m in model.modules():  # a new LoRA scale (peft's set_scale): the next batch must see it
        if hasattr(m, "scaling") and isinstance(m.scaling, dict) and "default" in m.scaling:
            m.scaling["default"] *= 4
    scaled = await asyncio.gather(*(sampler.generate(p, q) for p, q in zip(prompts, params)))
    await sampler.close()
    fused4, plain4 = await both()
    assert sampler._engine is engine and [c.logprobs for c in scaled] == [c.logprobs for c in fused4]
    assert [c.token_ids for c in fused4] == [c.token_ids for c in plain4]
    assert [c.logprobs for c in scaled] != [c.logprobs for c in first]


def test_models_it_does_not_know_are_left_to_their_own_forward(tiny_model_dir: str, tok) -> None:
    from transformers import AutoModelForCausalLM, GPT2Config

    assert "variant" in unsupported(lora_model(tiny_model_dir, use_dora=True))
    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    assert "gpt2" in unsupported(gpt2)
    llama = build("llama", len(tok))
    llama.model.layers[1].mlp.up_proj = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(64, 96))
    assert "layer 1" in unsupported(llama)


async def test_a_hooked_model_runs_its_own_forward_until_the_hook_goes(tiny_model_dir: str, tok) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    calls = []
    handle = model.model.layers[0].mlp.register_forward_hook(lambda *a: calls.append(1))
    assert "hooks" in unsupported(model)
    prompts = prompts_for(tok)
    params = [SamplingParams(max_tokens=5, seed=i, stop_token_ids=[-1]) for i in range(len(prompts))]
    sampler = HFSampler(model, tok, decode="static", batch_window_ms=30)
    hooked = await asyncio.gather(*(sampler.generate(p, q) for p, q in zip(prompts, params)))
    assert {c.meta["forward"] for c in hooked} == {"model"} and len(calls) >= 5  # the hook saw every step
    handle.remove()
    fused = await asyncio.gather(*(sampler.generate(p, q) for p, q in zip(prompts, params)))
    await sampler.close()
    assert {c.meta["forward"] for c in fused} == {"fused"}
    assert [c.token_ids for c in fused] == [c.token_ids for c in hooked]


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
async def test_cuda_graphs_of_the_fused_step_match_graphs_of_the_models_forward(arch: str, tok) -> None:
    model = build(arch, len(tok)).to("cuda")
    prompts = prompts_for(tok) * 4
    params = [SamplingParams(max_tokens=12, temperature=[1.0, 0.0][i % 2], seed=i, stop_token_ids=[-1]) for i in range(len(prompts))]
    fused_sampler = HFSampler(model, tok, batch_window_ms=30)
    fused = await _run(fused_sampler, prompts, params)
    plain = await _run(HFSampler(model, tok, batch_window_ms=30, fused_decode=False), prompts, params)
    assert fused_sampler._engine.captures > 0
    assert {(c.meta["decode"], c.meta["forward"]) for c in fused} == {("cuda_graph", "fused")}
    assert {(c.meta["decode"], c.meta["forward"]) for c in plain} == {("cuda_graph", "model")}
    for a, b in zip(fused, plain):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


@pytest.mark.parametrize("fault", ["wrong_rope", "raises"])
async def test_a_fused_step_that_fails_its_self_check_is_not_used(fault: str, tiny_model_dir: str, tok, monkeypatch, caplog) -> None:
    """Before its first step the engine checks the fused forward against the model's own (a torch or
    transformers version whose internals differ must cost speed, not correctness): faults injected."""
    import logging

    from rlcore.sampling.hf import fused as hf_fused
    from transformers import AutoModelForCausalLM

    if fault == "wrong_rope":  # a rotary embedding that silently forgot the sine term
        monkeypatch.setattr(hf_fused, "rotation", lambda cos, sin, perm=None: torch.diag_embed(cos))
    else:
        def boom(*args, **kwargs):
            raise RuntimeError("no kernel image is available for execution on the device")

        monkeypatch.setattr(hf_fused.FusedDecode, "_forward", boom)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompts = prompts_for(tok)
    params = [SamplingParams(max_tokens=5, seed=i, stop_token_ids=[-1]) for i in range(len(prompts))]
    sampler = HFSampler(model, tok, decode="static", batch_window_ms=30)
    with caplog.at_level(logging.WARNING, logger="rlcore.sampling.hf.static"):
        outs = await _run(sampler, prompts, params)
    assert {c.meta["forward"] for c in outs} == {"model"}
    assert sampler._engine.fused_why.startswith("self-check: ")
    assert any("fused decode forward is off" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    reference = await _run(HFSampler(model, tok, decode="static", fused_decode=False, batch_window_ms=30), prompts, params)
    assert [c.token_ids for c in outs] == [c.token_ids for c in reference]
