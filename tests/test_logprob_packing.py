"""Packing right-padded rows into fewer rows before the decoder body (``completion_logprobs(pack=True)``,
the default) gives every token the logprob, entropy and gradient it gets unpacked, and is used only
where that is known to hold."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlcore.algorithms.logprobs import PackingPlan, completion_logprobs, packing_plan
from rlcore.testing import tiny_model_path


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(tiny_model_path(), dtype=torch.float32)


def ragged_batch(lengths: list[int], T: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    ids = torch.randint(3, 200, (B, T), generator=g)
    attn = torch.zeros(B, T, dtype=torch.long)
    cmask = torch.zeros(B, T)
    for i, n in enumerate(lengths):
        attn[i, :n] = 1
        cmask[i, max(1, n // 2) : n] = 1
        ids[i, n:] = 0
    return ids, attn, cmask


def run(model, ids, attn, cmask, pack: bool, **kw):
    model.zero_grad()
    lp, ent = completion_logprobs(model, ids, attn, cmask, entropy=True, pack=pack, **kw)
    (lp * cmask * torch.linspace(0.5, 1.5, lp.shape[1])).sum().backward()
    return lp.detach(), ent, [p.grad.clone() for p in model.parameters()]


def test_packed_rows_give_the_unpacked_logprobs_entropies_and_gradients(model):
    ids, attn, cmask = ragged_batch([40, 12, 20, 9, 25, 14, 3], T=40)
    plan = packing_plan(model, attn, cmask)
    assert plan is not None and plan.rows < ids.shape[0]  # it packs: 143 tokens fit in 4 rows of 40
    lp0, ent0, g0 = run(model, ids, attn, cmask, pack=False)
    lp1, ent1, g1 = run(model, ids, attn, cmask, pack=True)
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent1, ent0, rtol=0, atol=1e-5)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert float((lp1 * (1 - cmask)).abs().sum()) == 0.0  # non-completion positions stay 0


def test_each_row_is_scored_as_if_alone(model):
    """No sequence sees another's tokens: each packed row's logprobs equal that row run by itself."""
    ids, attn, cmask = ragged_batch([10, 30, 8, 12], T=30, seed=1)
    lp, _ = completion_logprobs(model, ids, attn, cmask)
    for i in range(ids.shape[0]):
        n = int(attn[i].sum())
        alone, _ = completion_logprobs(model, ids[i : i + 1, :n], attn[i : i + 1, :n], cmask[i : i + 1, :n])
        torch.testing.assert_close(lp[i, :n], alone[0], rtol=0, atol=1e-5)


def test_plan_first_fit_longest_first():
    plan = PackingPlan([40, 12, 20, 9, 25, 14], T=40, device="cpu")
    assert plan.rows == 4  # 40 | 25+14 | 20+12 | 9 (first fit, longest first)
    assert plan.bin_of.tolist() == [0, 2, 2, 3, 1, 1]
    assert plan.offset_of.tolist() == [0, 20, 0, 0, 0, 25]
    # positions restart at every sequence; the tail continues the last sequence of its row
    assert plan.position_ids[1].tolist() == list(range(25)) + list(range(14)) + [14]


def test_no_plan_where_packing_is_not_known_to_hold(model):
    ids, attn, cmask = ragged_batch([40, 12, 20, 9], T=40)
    left = torch.flip(attn, dims=[1])  # left padding: not a prefix of ones
    assert packing_plan(model, left, torch.flip(cmask, dims=[1])) is None
    full = torch.ones_like(attn)  # no padding: nothing to save
    assert packing_plan(model, full, cmask) is None
    other = copy.deepcopy(model)
    other.config.model_type = "gpt2"  # a family not known to keep packed sequences apart
    assert packing_plan(other, attn, cmask) is None
    other.config.model_type = "qwen2"
    other.config._attn_implementation = "flash_attention_2"  # not exercised here: not packed
    assert packing_plan(other, attn, cmask) is None
