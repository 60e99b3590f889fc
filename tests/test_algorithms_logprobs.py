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
