"""A generative reward model in-process: a local causal LM (a model directory, a ``.gguf`` file, or
a Hugging Face id) loaded once with transformers, asked in batches.

Each question is rendered with the judge's own chat template (``add_generation_prompt``), the batch
padded on the left and decoded greedily for at most ``max_new_tokens``; the reply is the decoded
new tokens. A batch whose generation raises (out of memory) is a :class:`JudgeError` for each of
its questions, not a crash. Generation runs in a worker thread, off the event loop.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from rlcore.errors import ConfigError

from .endpoint import JudgeError


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class LocalJudge:
    """The judge model at ``path``, on ``device`` (default: CUDA when there is one)."""

    def __init__(self, path: str, *, max_new_tokens: int = 256, batch_size: int = 8, device: str | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from rlcore.gguf import resolve_model

        self.path = str(path)
        looks_local = os.path.isabs(self.path) or self.path.startswith((".", "~")) or self.path.lower().endswith(".gguf")
        if looks_local and not os.path.exists(os.path.expanduser(self.path)):
            raise ConfigError(f"llm_judge: judge_model {self.path} does not exist; give a local model directory, a .gguf "
                              "file or a Hugging Face id (or judge_url for a judge behind an OpenAI-compatible server)")
        resolved = str(resolve_model(os.path.expanduser(self.path) if looks_local else self.path))
        self.device = device or _default_device()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(resolved)
            dtype = torch.bfloat16 if self.device.startswith("cuda") and torch.cuda.is_bf16_supported() else torch.float32
            self.model = AutoModelForCausalLM.from_pretrained(resolved, dtype=dtype).to(self.device).eval()
        except (OSError, ValueError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise ConfigError(f"llm_judge: judge_model {self.path} is not a loadable causal language model "
                              f"({type(exc).__name__}: {first})") from None
        if not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(f"llm_judge: judge_model {self.path} has no chat template to render the rubric with; "
                              "use an instruction-tuned (chat) model")
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        config = self.model.generation_config
        config.do_sample = False  # greedy: the same completion gets the same verdict
        config.temperature = config.top_p = config.top_k = None
        self.max_new_tokens = int(max_new_tokens)
        self.batch_size = int(batch_size)
        self._lock = threading.Lock()  # one generation at a time on this model

    @property
    def identity(self) -> str:
        return f"local:{os.path.abspath(os.path.expanduser(self.path)) if os.path.exists(os.path.expanduser(self.path)) else self.path}"

    def describe(self) -> str:
        return f"{self.path} (in-process)"

    async def ask_all(self, questions: list[list[dict[str, Any]]]) -> list[str | JudgeError]:
        import asyncio

        if not questions:
            return []
        return await asyncio.to_thread(self.generate, questions)

    def generate(self, questions: list[list[dict[str, Any]]]) -> list[str | JudgeError]:
        out: list[str | JudgeError] = []
        with self._lock:
            for start in range(0, len(questions), self.batch_size):
                chunk = questions[start:start + self.batch_size]
                try:
                    out.extend(self._batch(chunk))
                except Exception as exc:  # noqa: BLE001 - out of memory, a template that raises: the batch's samples fail
                    err = JudgeError(f"the in-process judge {self.path} failed on a batch of {len(chunk)} "
                                     f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
                    out.extend([err] * len(chunk))
        return out

    def _batch(self, chunk: list[list[dict[str, Any]]]) -> list[str]:
        import torch

        texts = [self.tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in chunk]
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        with torch.inference_mode():
            ids = self.model.generate(**enc, max_new_tokens=self.max_new_tokens, do_sample=False,
                                      pad_token_id=self.tokenizer.pad_token_id)
        return self.tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
