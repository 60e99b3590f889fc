"""The built-in demo model: tiny models and tokenizers built offline, deterministically, cached on disk.

``rlcore train`` and ``rlcore rollout`` with no ``--model`` run on it (with the built-in task of
:mod:`rlcore.data.tasks`), so it is product, not a test helper; tests and benchmarks use it too
(re-exported by :mod:`rlcore.testing`). They all need a real causal LM with a real chat template
but cannot download weights. We train a byte-level BPE tokenizer with ``tokenizers``
on generated task text, give it a ChatML template (system/user/assistant/tool roles, prefix
preserving), and initialise a small Qwen2/Qwen3 model from a seed. The result is an ordinary HF
directory that ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` load.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

FORMAT_VERSION = "5"

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<answer>",
    "</answer>",
]

# ChatML, as Qwen uses it: rendering a conversation with one more message only appends text.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "You may call tools. Available tools:\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "Call one as <tool_call>{\"name\": NAME, \"arguments\": {...}}</tool_call><|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and tools %}"
    "{% elif message['role'] == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "{% if message.get('tool_calls') %}{% for call in message['tool_calls'] %}"
    "{% set fn = call['function'] if call.get('function') else call %}"
    "{{ '\\n' }}<tool_call>\n{{ {'name': fn['name'], 'arguments': fn['arguments']} | tojson }}\n</tool_call>"
    "{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_WORDS = (
    "the a an of to in is it and or not what how many much more less than each every total left "
    "guess number higher lower correct wrong answer question think step first then so yes no "
    "move up down left right north south east west pick drop stay hit stick action observation "
    "reward done game player dealer sum card ace position goal hole ice frozen lake taxi passenger "
    "cliff walk you your my we they he she has have had buy sells sold costs cost dollars apples "
    "eggs hours minutes days week year times twice half double plus minus add subtract multiply "
    "divide equals result final but wait it seems i made a mistake let me check again call tool "
    "calculator search compute value name arguments message system user assistant please reply "
    "with only one word letter digit count reverse repeat sort list small large even odd true false"
).split()


def _corpus(seed: int = 0) -> list[str]:
    """Generated text the tokenizer is trained on: numbers, arithmetic, words, chat markup, JSON."""
    rng = random.Random(seed)
    lines: list[str] = []
    for _ in range(4000):
        a, b = rng.randint(0, 999), rng.randint(0, 99)
        op = rng.choice("+-*/")
        lines.append(f"{a} {op} {b} = {rng.randint(0, 9999)}")
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12)))
        lines.append(words.capitalize() + rng.choice([".", "?", "!", ":"]))
        lines.append(f"#### {rng.randint(0, 100000)}")
        lines.append(json.dumps({"action": rng.choice(_WORDS), "value": rng.randint(0, 50)}))
        lines.append("<think>" + words + "</think><answer>" + str(rng.randint(0, 999)) + "</answer>")
    return lines


def build_tokenizer(vocab_size: int = 1024, seed: int = 0) -> Any:
    """A byte-level BPE tokenizer (any text encodes) with a ChatML chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in ("<|im_end|>", "<|endoftext|>")],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


#: named sizes; "small" is the ~50M-parameter model used by benchmarks
SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
    "small": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=14, num_attention_heads=8, num_key_value_heads=4),
}


#: tiny model architectures: dense qwen2/qwen3, and qwen2_moe (a Mixture-of-Experts model: 4 experts, 2 per
#: token, a shared expert; for MoE-only paths such as the router load-balancing loss)
ARCHS = ("qwen2", "qwen3", "qwen2_moe")


def cache_dir() -> Path:
    root = os.environ.get("RLCORE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "rlcore")
    return Path(root)


def tiny_model_path(
    size: str = "tiny", arch: str = "qwen2", seed: int = 0, vocab_size: int = 1024, cache: str | os.PathLike[str] | None = None
) -> str:
    """Path of a cached tiny model directory, building it on first use. Safe against concurrent builders."""
    if size not in SIZES:
        raise ValueError(f"unknown tiny model size {size!r}; choose one of {sorted(SIZES)}")
    if arch not in ARCHS:
        raise ValueError(f"unknown tiny model arch {arch!r}; choose one of {', '.join(ARCHS)}")
    key = hashlib.sha1(json.dumps([FORMAT_VERSION, size, arch, seed, vocab_size, SIZES[size]]).encode()).hexdigest()[:10]
    root = Path(cache) if cache is not None else cache_dir()
    target = root / f"tiny-{arch}-{size}-{key}"
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return str(target)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=root))
    try:
        build_model_dir(tmp, size=size, arch=arch, seed=seed, vocab_size=vocab_size)
        try:
            os.rename(tmp, target)
        except OSError:  # another process won the race; its copy is identical
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return str(target)


def build_model_dir(path: str | os.PathLike[str], size: str = "tiny", arch: str = "qwen2", seed: int = 0, vocab_size: int = 1024) -> None:
    """Write tokenizer + randomly initialised model (deterministic in ``seed``) to ``path``."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    tok = build_tokenizer(vocab_size=vocab_size, seed=seed)
    dims = SIZES[size]
    common = dict(
        vocab_size=len(tok),
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
        **dims,
    )
    if arch == "qwen3":
        from transformers import Qwen3Config

        config: Any = Qwen3Config(head_dim=dims["hidden_size"] // dims["num_attention_heads"], **common)
    elif arch == "qwen2_moe":
        from transformers import Qwen2MoeConfig

        h = dims["hidden_size"]
        config = Qwen2MoeConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=h, shared_expert_intermediate_size=h,
                                decoder_sparse_step=1, router_aux_loss_coef=0.001, **common)
    else:
        config = Qwen2Config(**common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = common["eos_token_id"]
    model.generation_config.pad_token_id = common["pad_token_id"]
    model.generation_config.bos_token_id = None
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))


def load_tiny(size: str = "tiny", arch: str = "qwen2", seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer) of the cached tiny model, in float32 on the CPU."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_model_path(size=size, arch=arch, seed=seed)
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
