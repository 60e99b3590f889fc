"""Reward *models* in ``reward_funcs``, as TRL 1.16 takes them: a sequence-classification model
(or a path / hub id of one) scores ``prompt + completion`` and its first logit is the reward.

The text is what TRL builds (``GRPOTrainer._calculate_rewards``): for a conversational dataset the
reward model's own chat template over prompt + completion messages, for a standard one the prompt
text followed by the completion text; tokenized without special tokens, padded on the right.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from . import Reward


def is_reward_model(obj: Any) -> bool:
    import torch

    return isinstance(obj, torch.nn.Module)


def model_name(model: Any) -> str:
    """TRL's name for a reward model: the last part of its config's model id."""
    path = getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
    return str(path).rstrip("/").split("/")[-1]


def load_reward_model(path: str, args: Any) -> Any:
    from transformers import AutoModelForSequenceClassification

    kwargs = dict(getattr(args, "model_init_kwargs", None) or {})
    kwargs.setdefault("trust_remote_code", getattr(args, "trust_remote_code", False))
    try:
        return AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, **kwargs)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"reward {path!r} is neither a registered reward (see `rlcore components reward`) nor a loadable "
            f"sequence-classification model ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        ) from None


class RewardModel(Reward):
    """Scores trajectories with a sequence-classification model (its first logit)."""

    def __init__(self, model: Any, tokenizer: Any = None, name: str | None = None, device: Any = None) -> None:
        self.model = model.eval()
        self.name = name or model_name(model)
        if tokenizer is None:
            from transformers import AutoTokenizer

            path = getattr(getattr(model, "config", None), "_name_or_path", None)
            if not path:
                raise ConfigError(f"reward model {self.name!r} has no path to load a tokenizer from; "
                                  "pass reward_processing_classes=")
            tokenizer = AutoTokenizer.from_pretrained(path)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.model.config.pad_token_id = tokenizer.pad_token_id
        self.tokenizer = tokenizer
        if device is not None:
            self.model.to(device)
        self.errors = 0
        #: TRL's chat_template_kwargs apply to a reward model's conversational texts too
        self.chat_template_kwargs: dict[str, Any] = {}

    def texts(self, prompts: list[Any], completions: list[Any]) -> list[str]:
        out = []
        for p, c in zip(prompts, completions):
            if isinstance(p, list):
                out.append(self.tokenizer.apply_chat_template(list(p) + list(c), tokenize=False,
                                                               **self.chat_template_kwargs))
            else:
                out.append(str(p) + str(c))
        return out

    def score(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        import torch

        enc = self.tokenizer(text=self.texts(prompts, completions), return_tensors="pt", padding=True,
                             padding_side="right", add_special_tokens=False)
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            logits = self.model(**{k: v.to(device) for k, v in enc.items()}).logits
        return [float(x) for x in logits[:, 0].float().cpu()]
