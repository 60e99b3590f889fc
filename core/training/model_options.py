"""TRL 1.16's model-side GRPO options: ``cast_lm_head_to_fp32`` and ``router_aux_loss_coef``.

Both follow ``trl/trainer/grpo_trainer.py`` (1.16) ``GRPOTrainer.__init__`` and ``compute_loss``:

* ``cast_lm_head_to_fp32`` (ScaleRL): the lm_head of the policy and of the reference model is
  kept in float32 and its logits are computed in float32 outside autocast, the hidden states
  upcast first. With tied embeddings the shared weight becomes float32 too, and the embedding's
  output is cast back to the model's dtype so the decoder body still runs in it. rlcore's chunked
  logprobs read the head's weight directly, so the head is marked and
  :func:`rlcore.algorithms.logprobs.completion_logprobs` upcasts the hidden states for it; the
  colocated ``hf`` sampler shares the module, so it draws from the same float32 logits (its
  logprob of a token still comes from the logits that drew it).
* ``router_aux_loss_coef``: a Mixture-of-Experts model's load-balancing loss (transformers'
  ``load_balancing_loss_func``, the Mixtral one every MoE family shares) over the micro-batch's
  real tokens, times the coefficient, is added to the policy loss (divided by the gradient
  accumulation steps like it). ``None`` takes the model config's own coefficient (0 when it
  declares none); an explicit non-zero value for a model that is not MoE is an error.
"""

from __future__ import annotations

import types
from typing import Any

import attrs
import torch

from ..algorithms.logprobs import FP32_HEAD
from ..errors import ConfigError


def _causal_lm(model: Any) -> Any:
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def _fp32_forward(self: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """The float32 head's forward: hidden states upcast, the matmul outside autocast."""
    with torch.autocast(hidden.device.type, enabled=False):
        return torch.nn.functional.linear(hidden.float(), self.weight.float(),
                                          None if self.bias is None else self.bias.float())


def cast_lm_head_to_fp32(model: Any) -> None:
    """Cast ``model``'s lm_head to float32 in place (TRL's ``_cast_lm_head_to_fp32``). Refuses a
    head that carries a PEFT adapter, as TRL does (its logits would bypass the adapter)."""
    lm = _causal_lm(model)
    head = lm.get_output_embeddings()
    if head is None:
        raise ConfigError(f"cast_lm_head_to_fp32=True: {type(lm).__name__} has no lm_head (get_output_embeddings() is None)")
    if hasattr(head, "base_layer") or type(head).__module__.startswith("peft."):
        raise ConfigError("cast_lm_head_to_fp32=True is not supported when the lm_head carries a PEFT adapter; remove "
                          "lm_head from lora_target_modules or set cast_lm_head_to_fp32=False")
    if getattr(head, FP32_HEAD, False):
        return
    original = head.weight.dtype
    head.float()
    head.forward = types.MethodType(_fp32_forward, head)  # a bound method: a deepcopy (the reference model) rebinds it
    setattr(head, FP32_HEAD, True)
    if getattr(lm.config, "tie_word_embeddings", False) and original != torch.float32:
        embed = lm.get_input_embeddings()

        def back_to_model_dtype(module: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
            return output.to(original)

        embed.register_forward_hook(back_to_model_dtype)


@attrs.frozen
class RouterAux:
    """What the load-balancing loss of an MoE policy needs: its weight and the routing shape."""

    coef: float
    num_experts: int
    top_k: int

    def loss(self, router_logits: Any, attention_mask: torch.Tensor) -> torch.Tensor:
        """transformers' load-balancing loss over the real tokens (``attention_mask`` 1)."""
        from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

        return load_balancing_loss_func(router_logits, self.num_experts, self.top_k, attention_mask)


def router_aux(model: Any, coef: float | None) -> RouterAux | None:
    """TRL 1.16's rule: ``coef`` None takes the config's ``router_aux_loss_coef`` (0 when it has
    none); a non-zero ``coef`` for a model without ``output_router_logits`` (not MoE) is an error;
    the loss is on when the model is MoE and the coefficient is not 0."""
    config = _causal_lm(model).config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    moe = hasattr(text, "output_router_logits")
    if coef and not moe:
        raise ConfigError(f"router_aux_loss_coef={coef} but {type(_causal_lm(model)).__name__} is not a Mixture-of-Experts "
                          "model that returns router logits; leave router_aux_loss_coef unset for this model")
    value = float(getattr(text, "router_aux_loss_coef", 0.0) or 0.0) if coef is None else float(coef)
    if not moe or value == 0.0:
        return None
    experts = getattr(text, "num_experts", None) or getattr(text, "num_local_experts", None)
    top_k = getattr(text, "num_experts_per_tok", None)
    if not experts or not top_k:
        raise ConfigError(f"router_aux_loss_coef: {type(text).__name__} declares no num_experts/num_experts_per_tok; "
                          "set router_aux_loss_coef=0 for this model")
    return RouterAux(coef=value, num_experts=int(experts), top_k=int(top_k))
