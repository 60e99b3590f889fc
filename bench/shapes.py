"""Model shapes the benchmarks run on: rlcore's tiny test models, and real architectures' shapes built
offline with random weights over the tiny tokenizer (no download; speed depends on the shape, not
on what the weights learned).

    from shapes import load_model
    model, tokenizer = load_model("qwen2-0.5b", device="cuda", dtype="bfloat16")
"""

from __future__ import annotations

from typing import Any

#: real shapes (Qwen2-0.5B: hidden 896, 24 layers, 14 heads / 2 KV heads, vocab 151,936, tied embeddings)
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6,
                       rms_norm_eps=1e-6, tie_word_embeddings=True),
}


def shape_names() -> list[str]:
    from rlcore.testing import SIZES

    return [*SIZES, *SHAPES]


def load_model(shape: str, device: str = "cpu", dtype: str = "float32", seed: int = 0) -> tuple[Any, Any]:
    """``(model, tokenizer)`` on ``device`` in ``dtype``, in eval mode. The tiny tokenizer either way:
    a real shape's extra vocabulary ids decode to nothing, which no benchmark here depends on."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    from rlcore.testing import SIZES, tiny_model_path

    torch_dtype = getattr(torch, dtype)
    if shape in SIZES:
        path = tiny_model_path(size=shape)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device)
        return model.eval(), AutoTokenizer.from_pretrained(path)
    if shape not in SHAPES:
        raise SystemExit(f"unknown shape {shape!r}; choose one of {shape_names()}")
    path = tiny_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    config = Qwen2Config(bos_token_id=None, eos_token_id=eos, pad_token_id=tok.pad_token_id, **SHAPES[shape])
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = None
    model.config._name_or_path = path  # tokenizer lookups by path find the tiny tokenizer
    return model.eval(), tok
