"""The reference a sampler's logprobs are held to: what a trainer computes for a sampled completion.

One plain forward over ``prompt + completion`` (no padding, no KV cache, no batching), logits
divided by the sampling temperature, the log-softmax at each sampled token. The sampler tests (the
tiny model's and the real model's) compare every sampled token's logprob with this.
"""

from __future__ import annotations

from typing import Any, Sequence


def recompute_logprobs(model: Any, prompt: Sequence[int], completion: Sequence[int], temperature: float = 1.0) -> Any:
    """Logprobs ``[len(completion)]`` (float32, on the CPU) of ``completion`` after ``prompt`` under
    ``model``, on the model's own device."""
    import torch

    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt) + list(completion)], device=device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    picked = torch.tensor(list(completion), device=device)[:, None]
    return torch.log_softmax(logits, -1).gather(1, picked).squeeze(1).cpu()
