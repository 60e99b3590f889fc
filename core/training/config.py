"""``GRPOConfig``: transformers' ``TrainingArguments`` plus the GRPO knobs, under TRL's names.

Where TRL has the concept we use TRL's name and meaning (``num_generations``, ``loss_type``,
``epsilon``, ``beta``, ``scale_rewards`` …) so a TRL user's config carries over; rlcore's own
additions (scheduler, sampler, advantage estimator, environment options, LoRA) sit beside them.
``validate_config`` checks every name and value against the plugin registry *before* a model is
loaded, so a typo costs a second, not a model load.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from transformers import TrainingArguments

from ..errors import ConfigError
from .checkpoint import check_output_dir

SCALE_REWARDS = ("group", "batch", "none")
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
_DICT_FIELDS = ("scheduler_options", "sampler_options", "env_options", "reward_options")


@dataclass
class GRPOConfig(TrainingArguments):
    """Everything a GRPO run needs. ``per_device_train_batch_size`` counts *trajectories* per
    micro-batch (as in TRL); one generation step rolls out
    ``per_device_train_batch_size × gradient_accumulation_steps × steps_per_generation``
    trajectories, i.e. that number divided by ``num_generations`` prompts."""

    # --- overridden TrainingArguments defaults ---------------------------------------------------
    output_dir: str | None = field(default="rlcore-output", metadata={"help": "Where checkpoints, metrics.jsonl and plots go."})
    learning_rate: float = field(default=1e-6, metadata={"help": "AdamW learning rate (TRL's GRPO default)."})
    logging_steps: float = field(default=1, metadata={"help": "Log (and append to metrics.jsonl) every N steps."})
    per_device_train_batch_size: int = field(default=8, metadata={"help": "Trajectories per micro-batch."})
    remove_unused_columns: bool = field(default=False, metadata={"help": "Keep dataset columns (rewards read them)."})

    # --- generation (TRL names) ------------------------------------------------------------------
    num_generations: int = field(default=8, metadata={"help": "Trajectories per prompt (the group size)."})
    max_prompt_length: int | None = field(default=512, metadata={"help": "Prompts longer than this keep their last tokens."})
    max_completion_length: int = field(default=256, metadata={"help": "Most tokens sampled per assistant turn."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (also applied to trainer logprobs)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling."})
    top_k: int = field(default=0, metadata={"help": "Top-k sampling (0: off)."})
    min_p: float = field(default=0.0, metadata={"help": "Min-p sampling (0: off)."})
    repetition_penalty: float = field(default=1.0, metadata={"help": "Repetition penalty at sampling."})
    steps_per_generation: int | None = field(default=None, metadata={"help": "Optimizer steps per generation batch (default: 1)."})
    generation_batch_size: int | None = field(default=None, metadata={"help": "Trajectories per generation step (overrides steps_per_generation)."})

    # --- loss (TRL names) --------------------------------------------------------------------------
    loss_type: str = field(default="dapo", metadata={"help": "grpo, bnpo, dr_grpo, dapo, gspo, cispo, sapo or a plugin's loss."})
    importance_sampling_level: str = field(default="token", metadata={"help": "token, or sequence (GSPO ratios; loss_type grpo becomes gspo)."})
    epsilon: float = field(default=0.2, metadata={"help": "Lower clip range."})
    epsilon_high: float | None = field(default=None, metadata={"help": "Upper clip range (default: epsilon; DAPO uses 0.28, CISPO 5.0)."})
    delta: float | None = field(default=None, metadata={"help": "Two-sided clipping: cap the unclipped ratio at delta."})
    beta: float = field(default=0.0, metadata={"help": "KL coefficient (k3) to the reference model; 0 loads no reference model."})
    num_iterations: int = field(default=1, metadata={"help": "Passes (μ) over each generation batch."})
    scale_rewards: str = field(default="group", metadata={"help": "Advantage scaling: group, batch or none."})
    reward_weights: list[float] | None = field(default=None, metadata={"help": "One weight per reward (default 1 each)."})
    mask_truncated_completions: bool = field(default=False, metadata={"help": "Leave length-truncated trajectories out of the loss."})
    sapo_temperature_pos: float = field(default=1.0, metadata={"help": "SAPO gate temperature for positive advantages."})
    sapo_temperature_neg: float = field(default=1.05, metadata={"help": "SAPO gate temperature for negative advantages."})
    is_correction: str | None = field(default=None, metadata={"help": "Rollout IS correction: token_truncate, token_mask, sequence_truncate, sequence_mask."})
    is_threshold: float = field(default=3.0, metadata={"help": "IS ratio cap (truncate) or cut-off (mask)."})
    is_min_threshold: float | None = field(default=None, metadata={"help": "Lower IS cut-off for the *_mask modes."})

    # --- rlcore components ---------------------------------------------------------------------------
    scheduler: str = field(default="default", metadata={"help": "Rollout scheduler name (rlcore components scheduler)."})
    sampler: str = field(default="hf", metadata={"help": "Generation backend: hf (shares the trainer's module), vllm, openai …"})
    advantage: str = field(default="grpo", metadata={"help": "Advantage estimator: grpo, rloo, reinforce_plus_plus, gigpo …"})
    reward_funcs: list[str] | None = field(default=None, metadata={"help": "Reward names (rlcore components reward)."})
    max_turns: int | None = field(default=None, metadata={"help": "Turns per trajectory (default: the scheduler's)."})
    scheduler_options: dict | str | None = field(default=None, metadata={"help": "JSON dict of scheduler options."})
    env_options: dict | str | None = field(default=None, metadata={"help": "JSON dict of environment options (passed to the scheduler)."})
    sampler_options: dict | str | None = field(default=None, metadata={"help": "JSON dict of sampler options (e.g. vLLM's gpu_memory_utilization)."})
    reward_options: dict | str | None = field(default=None, metadata={"help": "JSON dict: reward name -> options for Reward classes."})
    rollout_concurrency: int = field(default=64, metadata={"help": "Trajectories in flight at once."})
    rollout_timeout: float | None = field(default=None, metadata={"help": "Seconds before a trajectory fails as timed out."})
    gigpo_gamma: float = field(default=0.95, metadata={"help": "GiGPO discount of per-turn rewards."})
    gigpo_step_weight: float = field(default=1.0, metadata={"help": "GiGPO weight of the step-level advantage."})
    logprob_chunk_size: int = field(default=1024, metadata={"help": "Positions per lm_head chunk when computing logprobs."})
    overwrite_output_dir: bool = field(default=False, metadata={"help": "A fresh run may replace the run already in output_dir (its checkpoints, metrics, plots are deleted)."})
    failure_threshold: float = field(default=0.5, metadata={"help": "Stop the run when more than this share of trajectories fails for failure_patience generation steps in a row (1 disables)."})
    failure_patience: int = field(default=3, metadata={"help": "Consecutive bad generation steps (failed share over failure_threshold, or a reward raising on every sample) before the run stops."})
    plots: bool = field(default=True, metadata={"help": "Write reward/length PNGs to OUTPUT_DIR/plots at the end."})

    # --- LoRA -----------------------------------------------------------------------------------------
    use_peft: bool = field(default=False, metadata={"help": "Train LoRA adapters instead of all weights."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout."})
    lora_target_modules: list[str] | None = field(default=None, metadata={"help": "Modules to adapt (default: all linear layers)."})

    def __post_init__(self) -> None:
        for name in _DICT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, str):
                try:
                    value = json.loads(value) if value.strip() else {}
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{name} must be a JSON object, got {value!r} ({exc.msg})") from None
            if value is None:
                value = {}
            if not isinstance(value, dict):
                raise ConfigError(f"{name} must be a JSON object, got {type(value).__name__}")
            setattr(self, name, value)
        if self.generation_batch_size is not None and self.steps_per_generation is not None:
            raise ConfigError("set generation_batch_size or steps_per_generation, not both")
        super().__post_init__()
        window = self.per_device_train_batch_size * self.gradient_accumulation_steps * max(1, self.world_size)
        if self.generation_batch_size is None:
            self.steps_per_generation = self.steps_per_generation or 1
            self.generation_batch_size = window * self.steps_per_generation
        else:
            if self.generation_batch_size % window:
                raise ConfigError(
                    f"generation_batch_size={self.generation_batch_size} must be a multiple of per_device_train_batch_size"
                    f" × gradient_accumulation_steps × processes = {window}"
                )
            self.steps_per_generation = self.generation_batch_size // window
        check_values(self)

    @property
    def prompts_per_generation(self) -> int:
        return int(self.generation_batch_size or 0) // self.num_generations

    @property
    def effective_loss_type(self) -> str:
        """``grpo`` with sequence-level importance sampling is GSPO."""
        if self.importance_sampling_level == "sequence" and self.loss_type == "grpo":
            return "gspo"
        return self.loss_type


def check_values(cfg: GRPOConfig) -> None:
    """Value checks that need no registry: one line each, naming the setting."""
    if cfg.num_generations < 1:
        raise ConfigError(f"num_generations must be at least 1, got {cfg.num_generations}")
    if cfg.generation_batch_size % cfg.num_generations:
        raise ConfigError(
            f"generation batch of {cfg.generation_batch_size} trajectories (per_device_train_batch_size × "
            f"gradient_accumulation_steps × steps_per_generation) is not a multiple of num_generations={cfg.num_generations}"
        )
    if cfg.scale_rewards not in SCALE_REWARDS:
        raise ConfigError(f"scale_rewards={cfg.scale_rewards!r} is not one of {', '.join(SCALE_REWARDS)}")
    if cfg.is_correction is not None and cfg.is_correction not in IS_MODES:
        raise ConfigError(f"is_correction={cfg.is_correction!r} is not one of {', '.join(IS_MODES)}")
    if cfg.importance_sampling_level not in ("token", "sequence"):
        raise ConfigError(f"importance_sampling_level={cfg.importance_sampling_level!r} is not token or sequence")
    for name in ("max_completion_length", "num_iterations", "rollout_concurrency", "logprob_chunk_size"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be at least 1, got {getattr(cfg, name)}")
    if cfg.temperature <= 0:
        raise ConfigError(f"temperature must be > 0 (logprobs divide by it), got {cfg.temperature}")
    if cfg.epsilon < 0 or (cfg.epsilon_high is not None and cfg.epsilon_high < 0):
        raise ConfigError("epsilon and epsilon_high must be >= 0")
    if cfg.beta < 0:
        raise ConfigError(f"beta must be >= 0, got {cfg.beta}")
    if not cfg.learning_rate >= 0 or math.isinf(cfg.learning_rate):
        raise ConfigError(f"learning_rate must be a finite number >= 0, got {cfg.learning_rate}")
    check_output_dir(cfg.output_dir)
    if not 0.0 <= cfg.failure_threshold <= 1.0:
        raise ConfigError(f"failure_threshold must be a share between 0 and 1, got {cfg.failure_threshold}")
    if cfg.failure_patience < 1:
        raise ConfigError(f"failure_patience must be at least 1, got {cfg.failure_patience}")
    if cfg.max_turns is not None and cfg.max_turns < 1:
        raise ConfigError(f"max_turns must be at least 1, got {cfg.max_turns}")


def validate_components(cfg: GRPOConfig, extra_rewards: int = 0) -> None:
    """Every component name resolves (UnknownComponentError names the culprit and a package to
    install) and reward weights line up with rewards."""
    from ..plugins import plugins

    p = plugins()
    p.get("scheduler", cfg.scheduler)
    p.get("sampler", cfg.sampler)
    p.get("advantage", cfg.advantage)
    p.get("loss", cfg.effective_loss_type)
    names = list(cfg.reward_funcs or [])
    for name in names:
        p.get("reward", name)
    n = len(names) + extra_rewards
    if n == 0:
        raise ConfigError("no reward: pass --reward NAME (see `rlcore components reward`) or reward_funcs=")
    if cfg.reward_weights is not None and len(cfg.reward_weights) != n:
        raise ConfigError(f"reward_weights has {len(cfg.reward_weights)} values for {n} rewards; give one per reward")
