"""Offline tiny models: deterministic, loadable with plain transformers, with a prefix-preserving template."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlcore.testing import build_tokenizer, tiny_model_path


def test_tiny_model_dir_loads_with_auto_classes(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert model.config.model_type == "qwen2"
    assert model.config.vocab_size == len(tok)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    ids = tok.encode("What is 12 + 30?", add_special_tokens=False)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(tok))


def test_building_is_deterministic(tmp_path):
    a = tiny_model_path(cache=tmp_path / "a")
    b = tiny_model_path(cache=tmp_path / "b")
    ma = AutoModelForCausalLM.from_pretrained(a)
    mb = AutoModelForCausalLM.from_pretrained(b)
    for (na, pa), (nb, pb) in zip(ma.state_dict().items(), mb.state_dict().items()):
        assert na == nb and torch.equal(pa, pb)
    assert open(f"{a}/tokenizer.json").read() == open(f"{b}/tokenizer.json").read()
    assert tiny_model_path(cache=tmp_path / "a") == a  # cached, not rebuilt


def test_chat_template_is_prefix_preserving_for_every_role():
    tok = build_tokenizer()
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Guess a number."}]
    steps = [
        {"role": "assistant", "content": "50"},
        {"role": "user", "content": "Higher."},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "guess", "arguments": {"n": 75}}}]},
        {"role": "tool", "content": "Lower."},
    ]
    prev = tok.apply_chat_template(msgs, tokenize=False)
    for m in steps:
        msgs.append(m)
        cur = tok.apply_chat_template(msgs, tokenize=False)
        assert cur.startswith(prev), (prev, cur)
        prev = cur
    assert "<tool_response>\nLower.\n</tool_response>" in prev
    gen = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert gen == prev + "<|im_start|>assistant\n"


def test_qwen3_arch_builds(tmp_path):
    path = tiny_model_path(arch="qwen3", cache=tmp_path)
    assert AutoModelForCausalLM.from_pretrained(path).config.model_type == "qwen3"
