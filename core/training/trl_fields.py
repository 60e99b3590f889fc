"""TRL 1.16 ``GRPOConfig`` fields rlcore does not implement: each is declared on rlcore's
:class:`~rlcore.training.config.GRPOConfig` with TRL's default (so a TRL config constructs), and a
value other than that default is refused with one line saying what to use instead — never
accepted and ignored. The fields rlcore does implement are ordinary fields of the config.

rlcore's config is TRL's shape, so this list is the config's own rule and lives next to it (the
old import path under ``compat/trl`` still answers, with a deprecation warning: ``rlcore.compat.moved``).

The list is checked against TRL's dataclass by ``tests/test_trl_compat.py``: every TRL field
is either an rlcore field with TRL's meaning or listed here.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError

#: field -> (TRL's default, what to do instead)
REFUSED: dict[str, tuple[Any, str]] = {
    "ds3_gather_for_generation": (True, "rlcore does not run generation under DeepSpeed ZeRO-3; use sampler='vllm' for large models"),
    "cache_implementation": (None, "the hf sampler manages its own KV cache; use sampler='vllm' for paged attention"),
    "vllm_structured_outputs_regex": (None, "structured outputs are not supported by rlcore's samplers"),
    "vllm_group_port": (51216, "rlcore syncs weights to a vLLM server through its worker extension, not TRL's NCCL group"),
    "log_completions_hub_repo": (None, "upload OUTPUT_DIR/completions.jsonl yourself (rlcore makes no network calls)"),
    "use_transformers_continuous_batching": (False, "the hf sampler batches concurrent requests itself; use sampler='vllm' for continuous batching"),
    "transformers_continuous_batching_config": (None, "the hf sampler batches concurrent requests itself; use sampler='vllm'"),
    "use_transformers_paged": (False, "the hf sampler batches concurrent requests itself; use sampler='vllm' for paged attention"),
}


def check_refused(cfg: Any) -> None:
    """One line for the first TRL field set to something rlcore would otherwise ignore."""
    for name, (default, instead) in REFUSED.items():
        value = getattr(cfg, name, default)
        if value != default:
            raise ConfigError(f"{name}={value!r} (a TRL GRPOConfig option) is not supported by rlcore: {instead}")
