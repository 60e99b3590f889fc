"""Chunked selective logprobs equal the naive full-softmax computation, values and gradients."""

from __future__ import annotations

import pytest
import torch

from rlcore.algorithms.logprobs import completion_logprobs, naive_logprobs, selective_logprobs


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_selective_equals_naive(temperature: float, chunk: int) -> None:
    g = torch.Generator().manual_seed(0)
    N, H, V = 13, 8, 50
    h = torch.randn(N, H, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(V, H, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(V, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, V, (N,), generator=g)
    up = torch.randn(N, generator=g, dtype=torch.float64)

    lp, ent = selective_logprobs(h, w, y, bias=b, temperature=temperature, chunk_size=chunk, entropy=True)
    (lp.double() * up).sum().backward()
    grads = [x.grad.clone() for x in (h, w, b)]
    for x in (h, w, b):
        x.grad = None
    logits = h @ w.T + b
    ref = naive_logprobs(logits, y, temperature)
    (ref * up).sum().backward()
    assert torch.allclose(lp.double(), ref, atol=1e-6)
    for got, x in zip(grads, (h, w, b)):
        assert torch.allclose(got, x.grad, atol=1e-6)
    p = torch.softmax(logits / temperature, -1)
    ref_ent = -(p * torch.log(p)).sum(-1)
    assert torch.allclose(ent.double(), ref_ent, atol=1e-5)


def test_completion_logprobs_match_model_logits(tiny_model_dir: str) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 200, (3, 9), generator=g)
    attn = torch.ones_like(ids)
    attn[2, 6:] = 0
    cmask = torch.zeros(3, 9)
    cmask[0, 4:] = 1
    cmask[1, 2:] = 1
    cmask[2, 4:6] = 1
    lp, ent = completion_logprobs(model, ids, attn, cmask, temperature=0.9, chunk_size=4, entropy=True)
    logits = model(input_ids=ids, attention_mask=attn).logits
    ref = torch.zeros(3, 9)
    ref[:, 1:] = naive_logprobs(logits[:, :-1], ids[:, 1:], 0.9)
    ref = ref * cmask
    assert torch.allclose(lp, ref, atol=1e-5)
    assert torch.all(lp[cmask == 0] == 0) and torch.all(ent[cmask == 0] == 0)
    # gradients reach the model through the chunked path
    (lp.sum()).backward()
    assert model.model.embed_tokens.weight.grad is not None
    assert float(model.model.layers[0].mlp.up_proj.weight.grad.abs().sum()) > 0


def test_bfloat16_inputs_upcast_the_softmax() -> None:
    g = torch.Generator().manual_seed(2)
    h = torch.randn(20, 16, generator=g).to(torch.bfloat16).requires_grad_(True)
    w = (torch.randn(300, 16, generator=g) * 0.3).to(torch.bfloat16).requires_grad_(True)
    y = torch.randint(0, 300, (20,), generator=g)
    lp, _ = selective_logprobs(h, w, y, chunk_size=7, temperature=0.8)
    assert lp.dtype == torch.float32  # float32 logprobs from bf16 weights
    ref = naive_logprobs(h.float() @ w.float().T, y, 0.8)
    assert torch.allclose(lp, ref, atol=0.05)
    lp.sum().backward()
    assert h.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.bfloat16
    assert torch.isfinite(w.grad.float()).all()


# --- entropy with gradient (the entropy bonus) -------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 5, 64])
@pytest.mark.parametrize("rows", [128, 2])
def test_entropy_gradient_equals_full_logits_autograd(temperature: float, chunk: int, rows: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``entropy_grad`` the chunked entropy's gradient (alone, and mixed with the logprobs')
    equals autograd through the full ``[N, V]`` logits, for hidden, weight and bias — also when a
    chunk's gradient is formed a few rows at a time (``ENTROPY_ROWS``)."""
    import rlcore.algorithms.logprobs as lp_mod
    from rlcore.algorithms.logprobs import naive_entropy

    monkeypatch.setattr(lp_mod, "ENTROPY_ROWS", rows)

    g = torch.Generator().manual_seed(3)
    N, H, V = 11, 8, 40
    h = torch.randn(N, H, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(V, H, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(V, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, V, (N,), generator=g)
    up_lp, up_ent = torch.randn(N, generator=g, dtype=torch.float64), torch.randn(N, generator=g, dtype=torch.float64)
    for mix in ((1.0, 0.0), (0.0, 1.0), (0.3, -0.8)):
        for x in (h, w, b):
            x.grad = None
        lp, ent = selective_logprobs(h, w, y, bias=b, temperature=temperature, chunk_size=chunk, entropy_grad=True)
        assert ent is not None and ent.requires_grad
        (mix[0] * (lp * up_lp).sum() + mix[1] * (ent * up_ent).sum()).backward()
        grads = [x.grad.clone() for x in (h, w, b)]
        for x in (h, w, b):
            x.grad = None
        logits = h @ w.T + b
        ref_lp, ref_ent = naive_logprobs(logits, y, temperature), naive_entropy(logits, temperature)
        (mix[0] * (ref_lp * up_lp).sum() + mix[1] * (ref_ent * up_ent).sum()).backward()
        assert torch.allclose(ent, ref_ent, atol=1e-10) and torch.allclose(lp, ref_lp, atol=1e-10)
        for got, x in zip(grads, (h, w, b)):
            assert torch.allclose(got, x.grad, atol=1e-9), (mix, (got - x.grad).abs().max())
        assert float(grads[1].abs().sum()) > 0


def test_entropy_gradient_sign_is_that_of_the_entropy() -> None:
    """A step along -d(-H)/dθ (minimising ``-H``, the bonus's direction) raises the entropy: the
    gradient is of ``H``, not of ``-H`` or of a detached copy."""
    g = torch.Generator().manual_seed(4)
    h = torch.randn(6, 8, generator=g, dtype=torch.float64)
    w = (torch.randn(30, 8, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    y = torch.randint(0, 30, (6,), generator=g)
    _, ent = selective_logprobs(h, w, y, chunk_size=4, entropy_grad=True)
    before = float(ent.detach().mean())
    (-ent.mean()).backward()
    with torch.no_grad():
        w2 = w - 0.05 * w.grad
    _, ent2 = selective_logprobs(h, w2, y, chunk_size=4, entropy=True)
    assert float(ent2.mean()) > before


def test_default_path_keeps_the_entropy_detached() -> None:
    g = torch.Generator().manual_seed(5)
    h = torch.randn(4, 8, generator=g, requires_grad=True)
    w = torch.randn(20, 8, generator=g, requires_grad=True)
    lp, ent = selective_logprobs(h, w, torch.randint(0, 20, (4,), generator=g), entropy=True)
    assert lp.requires_grad and not ent.requires_grad


def test_completion_entropy_gradient_reaches_the_model(tiny_model_dir: str) -> None:
    """``completion_logprobs(entropy_grad=True)``: the masked entropy's gradient through the whole
    model equals autograd through the model's own full logits."""
    from transformers import AutoModelForCausalLM

    from rlcore.algorithms.logprobs import naive_entropy

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).double()
    g = torch.Generator().manual_seed(6)
    ids = torch.randint(3, 200, (2, 8), generator=g)
    attn = torch.ones_like(ids)
    cmask = torch.zeros(2, 8, dtype=torch.float64)
    cmask[0, 3:] = 1
    cmask[1, 5:7] = 1
    _, ent = completion_logprobs(model, ids, attn, cmask, temperature=0.8, chunk_size=3, entropy_grad=True)
    (ent * cmask).sum().backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, attention_mask=attn).logits
    ref = torch.zeros(2, 8, dtype=torch.float64)
    ref[:, 1:] = naive_entropy(logits[:, :-1], 0.8)
    assert torch.allclose(ent, ref * cmask, atol=1e-9)
    (ref * cmask).sum().backward()
    for n, p in model.named_parameters():
        if p.grad is not None and float(p.grad.abs().sum()) > 0:
            assert n in got and torch.allclose(got[n], p.grad, atol=1e-8), n
    assert any(float(v.abs().sum()) > 0 for v in got.values())


def test_bfloat16_entropy_gradient_follows_the_float32_reference() -> None:
    """bf16 weights: the entropy (float32, upcast) and its gradient stay close to float32 autograd."""
    from rlcore.algorithms.logprobs import naive_entropy

    g = torch.Generator().manual_seed(7)
    h32 = torch.randn(20, 16, generator=g)
    w32 = torch.randn(300, 16, generator=g) * 0.3
    h = h32.to(torch.bfloat16).requires_grad_(True)
    w = w32.to(torch.bfloat16).requires_grad_(True)
    _, ent = selective_logprobs(h, w, torch.randint(0, 300, (20,), generator=g), chunk_size=7, temperature=0.8,
                                entropy_grad=True)
    assert ent.dtype == torch.float32
    ent.mean().backward()
    hr, wr = h.detach().float().requires_grad_(True), w.detach().float().requires_grad_(True)
    ref = naive_entropy(hr @ wr.T, 0.8)
    ref.mean().backward()
    assert torch.allclose(ent.detach(), ref.detach(), atol=0.02)
    assert h.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.bfloat16
    assert torch.allclose(w.grad.float(), wr.grad, atol=2e-3, rtol=0.05)
    assert torch.allclose(h.grad.float(), hr.grad, atol=2e-3, rtol=0.05)
