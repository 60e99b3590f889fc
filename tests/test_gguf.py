"""GGUF files as models (``rlcore.gguf``): a ``.gguf`` path given to the CLI, the trainer, ``Policy`` or
the hf sampler is converted once into an ordinary float32 directory, faithful to the file, that
``transformers.Trainer`` accepts; mistakes are one line. Run on the real SmolLM2-135M-Instruct file."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from rlcore.errors import ConfigError
from rlcore.gguf import converted_dir, is_gguf, resolve_model


def test_is_gguf_and_pass_through() -> None:
    assert is_gguf("a/b/Model.Q4_1.GGUF") and is_gguf(Path("x.gguf"))
    assert not is_gguf("HuggingFaceTB/SmolLM2-135M-Instruct") and not is_gguf(None) and not is_gguf(torch.nn.Linear(1, 1))
    module = torch.nn.Linear(1, 1)
    assert resolve_model(module) is module and resolve_model("org/model") == "org/model"


def test_missing_gguf_file_is_one_line(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match=r"GGUF file .*nowhere\.gguf does not exist") as exc:
        resolve_model(str(tmp_path / "nowhere.gguf"))
    assert "\n" not in str(exc.value)


def test_cli_refuses_a_missing_gguf_before_loading(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    from rlcore.testing.cli_checks import fails_before_model_load

    err = fails_before_model_load(["--model", str(tmp_path / "gone.gguf"), "--max_steps", "1"], capsys, monkeypatch)
    assert "gone.gguf does not exist" in err


def test_conversion_is_faithful_cached_and_trainable(smollm2_gguf: str, tmp_path: Any) -> None:
    """A fresh conversion: no quantization_config left (Trainer would refuse it), the same logits and
    tokens as transformers' own GGUF load, and a second call reuses the directory."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out = Path(resolve_model(smollm2_gguf, cache=tmp_path))
    assert out == converted_dir(smollm2_gguf, tmp_path) and out.is_dir()
    config = AutoConfig.from_pretrained(out)
    assert getattr(config, "quantization_config", None) is None and config.model_type == "llama"
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert resolve_model(smollm2_gguf, cache=tmp_path) == str(out)
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp  # not converted again

    where, name = os.path.dirname(smollm2_gguf), os.path.basename(smollm2_gguf)
    ref_tok = AutoTokenizer.from_pretrained(where, gguf_file=name)
    tok = AutoTokenizer.from_pretrained(out)
    messages = [{"role": "user", "content": "What is 12 + 7? Answer: 19 — ünïcödé\n"}]
    assert tok.chat_template == ref_tok.chat_template
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ids == ref_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert tok.decode(ids).startswith("<|im_start|>system\n")  # SmolLM2's injected default system prompt

    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.float32 and model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    reference = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
    x = torch.tensor([ids])
    with torch.no_grad():
        assert torch.equal(model(x).logits, reference(x).logits)

    from transformers import Trainer, TrainingArguments

    Trainer(model=model, args=TrainingArguments(output_dir=str(tmp_path / "t"), report_to=[], use_cpu=True))  # refuses a quantized model


def test_a_changed_file_is_converted_again(smollm2_gguf: str, tmp_path: Any) -> None:
    copy = tmp_path / "m.gguf"
    shutil.copyfile(smollm2_gguf, copy)
    first = converted_dir(copy, tmp_path)
    os.utime(copy, ns=(1, 1))
    assert converted_dir(copy, tmp_path) != first


def test_trainer_and_policy_take_a_gguf_path(smollm2_gguf: str, smollm2_dir: str, tmp_path: Any) -> None:
    """``GRPOTrainer("x.gguf")`` and ``Policy("x.gguf")`` load the converted model and its real tokenizer."""
    from rlcore import GRPOConfig, GRPOTrainer
    from rlcore.loop import Policy

    assert resolve_model(smollm2_gguf) == smollm2_dir  # the fixture's directory is this file's conversion
    args = GRPOConfig(output_dir=str(tmp_path / "run"), max_steps=1, per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=4, report_to=[])
    trainer = GRPOTrainer(smollm2_gguf, reward_funcs="digits", args=args, train_dataset=[{"prompt": "1+1="}] * 2)
    try:
        assert trainer.model.config.model_type == "llama" and getattr(trainer.model.config, "quantization_config", None) is None
        assert trainer.processing_class.eos_token == "<|im_end|>"
        assert Path(trainer.model.config._name_or_path) == Path(smollm2_dir)
    finally:
        import asyncio

        close = getattr(trainer.sampler, "close", None)
        if close is not None:
            asyncio.run(close())
    policy = Policy(smollm2_gguf)
    assert policy.tokenizer.eos_token == "<|im_end|>" and Path(policy.model.config._name_or_path) == Path(smollm2_dir)
