"""``GRPOConfig``: transformers' ``TrainingArguments`` plus the GRPO knobs, under TRL's names.

Where TRL has the concept we use TRL's name and meaning (``num_generations``, ``loss_type``,
``epsilon``, ``beta``, ``scale_rewards`` …) so a TRL user's config carries over; rlcore's own
additions (scheduler, sampler, advantage estimator, environment options, LoRA) sit beside them.
``validate_config`` checks every name and value against the plugin registry *before* a model is
loaded, so a typo costs a second, not a model load.
"""

from __future__ import annotations

import inspect
import json
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

from transformers import TrainingArguments

from ..errors import ConfigError
from .checkpoint import check_output_dir
from .trl_fields import check_refused

SCALE_REWARDS = ("group", "batch", "none")
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
_DICT_FIELDS = ("scheduler_options", "sampler_options", "env_options", "reward_options", "loss_options", "advantage_options",
                "prompt_sampler_options")
#: rlcore 0.1 fields now declared by the component that reads them: old field -> (advantage, option)
_MOVED_TO_ADVANTAGE = {"gigpo_gamma": ("gigpo", "gamma"), "gigpo_step_weight": ("gigpo", "step_weight")}


@dataclass
class GRPOConfig(TrainingArguments):
    """Everything a GRPO run needs. ``per_device_train_batch_size`` counts *trajectories* per
    micro-batch (as in TRL); one generation step rolls out
    ``per_device_train_batch_size × gradient_accumulation_steps × steps_per_generation``
    trajectories, i.e. that number divided by ``num_generations`` prompts."""

    # --- overridden TrainingArguments defaults ---------------------------------------------------
    output_dir: str | None = field(default="rlcore-output", metadata={"help": "Where checkpoints, metrics.jsonl and plots go."})
    learning_rate: float = field(default=1e-6, metadata={"help": "AdamW learning rate (TRL's GRPO default)."})
    logging_steps: float = field(default=1, metadata={"help": "Log (and append to metrics.jsonl) every N steps (TRL: 10; rlcore logs every step, see docs/porting-trl.md)."})
    activation_checkpointing: bool | None = field(default=None, metadata={"help": "Recompute activations in backward to save memory (default: on, TRL's default)."})
    gradient_checkpointing: bool | None = field(default=None, metadata={"help": "transformers' deprecated name of activation_checkpointing (TRL's name; still honoured)."})
    bf16: bool | None = field(default=None, metadata={"help": "bf16 mixed precision; default (None): on where a CUDA GPU supports it, off on the CPU."})
    per_device_train_batch_size: int = field(default=8, metadata={"help": "Trajectories per micro-batch."})
    remove_unused_columns: bool = field(default=False, metadata={"help": "Keep dataset columns (rewards read them)."})

    # --- generation (TRL names) ------------------------------------------------------------------
    num_generations: int = field(default=8, metadata={"help": "Trajectories per prompt (the group size)."})
    max_prompt_length: int | None = field(default=512, metadata={"help": "Prompts longer than this keep their last tokens."})
    max_completion_length: int = field(default=512, metadata={"help": "Most tokens sampled per assistant turn (TRL's default)."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (also applied to trainer logprobs)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling."})
    top_k: int = field(default=0, metadata={"help": "Top-k sampling (0: off)."})
    min_p: float | None = field(default=None, metadata={"help": "Min-p sampling (None or 0: off)."})
    repetition_penalty: float = field(default=1.0, metadata={"help": "Repetition penalty at sampling."})
    steps_per_generation: int | None = field(default=None, metadata={"help": "Micro-steps fed by one generation batch, as in TRL (default: gradient_accumulation_steps)."})
    generation_batch_size: int | None = field(default=None, metadata={"help": "Trajectories per generation step, all processes (default: per_device_train_batch_size × processes × steps_per_generation)."})
    num_generations_eval: int | None = field(default=None, metadata={"help": "Trajectories per eval prompt (default: num_generations)."})
    generation_kwargs: dict | None = field(default=None, metadata={"help": "Extra sampling settings: any SamplingParams field (max_tokens, stop, min_tokens, seed …; HF names max_new_tokens, min_new_tokens, stop_strings)."})
    shuffle_dataset: bool = field(default=True, metadata={"help": "Walk the training rows in a seeded random order."})
    model_init_kwargs: dict | str | None = field(default=None, metadata={"help": "Keyword arguments for from_pretrained when the model is a path (dtype, revision …)."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow custom model code when loading by path."})
    disable_dropout: bool = field(default=False, metadata={"help": "Set every dropout probability of the policy (and reference) to 0."})

    # --- loss (TRL names) --------------------------------------------------------------------------
    loss_type: str = field(default="dapo", metadata={"help": "grpo, bnpo, dr_grpo, dapo, gspo, cispo, sapo, opd (on-policy distillation from teacher_model) or a plugin's loss."})
    importance_sampling_level: str = field(default="token", metadata={"help": "token, or sequence (GSPO ratios; loss_type grpo becomes gspo)."})
    epsilon: float = field(default=0.2, metadata={"help": "Lower clip range."})
    epsilon_high: float | None = field(default=None, metadata={"help": "Upper clip range (default: epsilon; DAPO uses 0.28, CISPO 5.0)."})
    delta: float | None = field(default=None, metadata={"help": "Two-sided clipping: cap the unclipped ratio at delta."})
    beta: float = field(default=0.0, metadata={"help": "KL coefficient (k3) to the reference model; 0 loads no reference model."})
    teacher_model: str | None = field(default=None, metadata={"help": "On-policy distillation teacher (a path, hub id or .gguf file; the tokenizer's vocabulary): its logprobs of the sampled tokens, for loss_type='opd' or opd_coef > 0."})
    opd_coef: float = field(default=0.0, metadata={"help": "Weight of the on-policy distillation term (reverse KL to teacher_model on the sampled tokens) added to any loss_type: loss = policy loss + opd_coef × opd term."})
    num_iterations: int = field(default=1, metadata={"help": "Passes (μ) over each generation batch."})
    scale_rewards: str = field(default="group", metadata={"help": "Advantage scaling: group, batch or none (True = group, False = none, as in TRL)."})
    reward_weights: list[float] | None = field(default=None, metadata={"help": "One weight per reward (default 1 each)."})
    mask_truncated_completions: bool = field(default=False, metadata={"help": "Leave length-truncated trajectories out of the loss."})
    # TRL's names for the sapo / vespo losses' own options (declared by those losses): kept as fields so
    # a TRL config carries over; each reaches its loss's options unless loss_options sets it
    sapo_temperature_pos: float = field(default=1.0, metadata={"help": "SAPO gate temperature for positive advantages (the sapo loss's option; TRL's field)."})
    sapo_temperature_neg: float = field(default=1.05, metadata={"help": "SAPO gate temperature for negative advantages (the sapo loss's option; TRL's field)."})
    vespo_k_pos: float = field(default=2.0, metadata={"help": "VESPO gamma shape k for non-negative advantages (the vespo loss's option; TRL's field)."})
    vespo_lambda_pos: float = field(default=3.0, metadata={"help": "VESPO gamma rate λ for non-negative advantages (the vespo loss's option; TRL's field)."})
    vespo_k_neg: float = field(default=3.0, metadata={"help": "VESPO gamma shape k for negative advantages (the vespo loss's option; TRL's field)."})
    vespo_lambda_neg: float = field(default=2.0, metadata={"help": "VESPO gamma rate λ for negative advantages (the vespo loss's option; TRL's field)."})
    use_bias_correction_kl: bool = field(default=True, metadata={"help": "Multiply the KL term by the importance ratio (TRL's default)."})
    top_entropy_quantile: float = field(default=1.0, metadata={"help": "Train only on the tokens in this top quantile of entropy (1.0: all)."})
    entropy_coef: float = field(default=0.0, metadata={"help": "Entropy bonus: loss -= entropy_coef × the mean entropy of the trained tokens (TRL's; the same meaning for every loss_type). With use_adaptive_entropy, the starting coefficient."})
    use_adaptive_entropy: bool = field(default=False, metadata={"help": "Adaptive entropy control (TRL, Skywork-OR1): every optimizer step, raise entropy_coef by entropy_coef_delta when the step's mean entropy is at or below entropy_target, lower it otherwise; the bonus applies only while entropy is at or below the target."})
    entropy_coef_min: float = field(default=0.0, metadata={"help": "Lower bound of the adaptive entropy coefficient."})
    entropy_coef_max: float = field(default=1.0, metadata={"help": "Upper bound of the adaptive entropy coefficient."})
    entropy_coef_delta: float = field(default=0.005, metadata={"help": "Step of the adaptive entropy coefficient per optimizer step."})
    entropy_target: float = field(default=0.2, metadata={"help": "Target mean per-token entropy (nats) of adaptive entropy control; set it near the entropy logged early in training."})
    sync_ref_model: bool = field(default=False, metadata={"help": "Every ref_model_sync_steps, mix the policy into the reference model (TR-DPO)."})
    ref_model_mixup_alpha: float = field(default=0.6, metadata={"help": "ref = alpha × policy + (1 - alpha) × ref at each sync."})
    ref_model_sync_steps: int = field(default=512, metadata={"help": "Optimizer steps between reference-model syncs."})
    is_correction: str | None = field(default=None, metadata={"help": "Rollout IS correction: token_truncate, token_mask, sequence_truncate, sequence_mask."})
    is_threshold: float = field(default=3.0, metadata={"help": "IS ratio cap (truncate) or cut-off (mask)."})
    is_min_threshold: float | None = field(default=None, metadata={"help": "Lower IS cut-off for the *_mask modes."})

    # --- rlcore components ---------------------------------------------------------------------------
    scheduler: str = field(default="default", metadata={"help": "Rollout scheduler name (rlcore components scheduler)."})
    sampler: str = field(default="hf", metadata={"help": "Generation backend: hf (shares the trainer's module), vllm, openai …"})
    advantage: str = field(default="grpo", metadata={"help": "Advantage estimator: grpo, rloo, reinforce_plus_plus, gigpo …"})
    reward_funcs: list[str] | None = field(default=None, metadata={"help": "Reward names (rlcore components reward)."})
    max_turns: int | None = field(default=None, metadata={"help": "Turns per trajectory (default: the scheduler's)."})
    prompt_sampler: str = field(default="uniform", metadata={"help": "Which prompts each generation rolls out: uniform (every row once per epoch, in the seeded order) or difficulty (skip or down-weight prompts whose last window groups all scored one same reward), or a registered prompt_sampler (rlcore components prompt_sampler)."})
    prompt_sampler_options: dict | str | None = field(default=None, metadata={"help": "JSON dict of the prompt sampler's options (difficulty: window, mode, min_weight)."})
    dynamic_sampling: bool = field(default=False, metadata={"help": "DAPO's dynamic sampling: drop groups whose completions all scored the same (no learning signal) and roll out more prompts until the batch has prompts_per_generation groups with reward spread (surplus groups are dropped); see docs/training.md#dynamic-sampling."})
    max_resample_rounds: int = field(default=9, metadata={"help": "With dynamic_sampling: the most extra rounds of prompts one step draws to refill its batch (DAPO's recipe: 10 generation batches in all, verl's max_num_gen_batches)."})
    min_groups: int = field(default=1, metadata={"help": "With dynamic_sampling: the fewest groups with spread a step trains on once max_resample_rounds are spent (a smaller batch); fewer skips the step (no update), and failure_patience skipped steps in a row stop the run."})
    dynamic_sampling_metric: str = field(default="reward", metadata={"help": "With dynamic_sampling: the score a group must spread in — reward (the weighted total) or one reward's name (verl's filter_groups.metric)."})
    tool_parser: str = field(default="auto", metadata={"help": "How a tool scheduler finds the model's tool calls: auto (the format of the chat template's model family: hermes, qwen3_xml, llama3_json, gptoss, deepseek_v3, gemma4, muse_atem, or the tokenizer's response schema) or a registered tool_parser (rlcore components tool_parser)."})
    observers: list[str] | None = field(default=None, metadata={"help": "Installed observer plugins that watch rollouts (logged only, never trained on)."})
    scheduler_options: dict | str | None = field(default=None, metadata={"help": "JSON dict of scheduler options."})
    env_options: dict | str | None = field(default=None, metadata={"help": "JSON dict of the env's options: under an env scheduler, keys the scheduler declares (env, env_url …) are its own and the rest reach the env (env_kwargs); other schedulers get them all."})
    sampler_options: dict | str | None = field(default=None, metadata={"help": "JSON dict of sampler options (e.g. vLLM's gpu_memory_utilization)."})
    reward_options: dict | str | None = field(default=None, metadata={"help": "JSON dict: reward name -> options for Reward classes."})
    loss_options: dict | str | None = field(default=None, metadata={"help": "JSON dict of the loss's own options (what it declares, e.g. sapo_temperature_pos for sapo)."})
    advantage_options: dict | str | None = field(default=None, metadata={"help": "JSON dict of the advantage estimator's options (e.g. gigpo: gamma, step_weight)."})
    sleep_sampler: bool = field(default=False, metadata={"help": "Put the sampler to sleep after each generation so the training step gets its accelerator memory: vllm sleeps at level 2 (the next weight sync re-sends the weights), hf frees its static KV cache and CUDA graphs (an owned copy moves to the CPU). TRL's vllm_enable_sleep_mode=True turns it on."})
    rollout_concurrency: int = field(default=64, metadata={"help": "Trajectories in flight at once."})
    rollout_timeout: float | None = field(default=None, metadata={"help": "Seconds before a trajectory fails as timed out."})
    gigpo_gamma: float | None = field(default=None, metadata={"help": "Deprecated: advantage_options={'gamma': …} (GiGPO's discount of per-turn rewards, default 0.95)."})
    gigpo_step_weight: float | None = field(default=None, metadata={"help": "Deprecated: advantage_options={'step_weight': …} (GiGPO's step-level weight, default 1.0)."})
    logprob_chunk_size: int = field(default=1024, metadata={"help": "Positions per lm_head chunk when computing logprobs."})
    padding_free: bool = field(default=False, metadata={"help": "Padding-free micro-batches (TRL's SFT/DPO name): each micro-batch's sequences run end to end with per-sequence position_ids, one row under flash-attention's varlen kernels, rows of padding_free_max_tokens with a block-diagonal causal mask under sdpa/eager; the same rows, loss and gradients as padded (checked on the model at start). See docs/training.md#padding-free-micro-batches."})
    padding_free_max_tokens: int | None = field(default=None, metadata={"help": "With padding_free under sdpa/eager attention: the width of a packed row (its mask costs width² per row); None: the micro-batch's longest sequence; a longer sequence widens its micro-batch's rows to its length. Flash-attention runs one row and ignores it."})
    overwrite_output_dir: bool = field(default=False, metadata={"help": "A fresh run may replace the run already in output_dir (its checkpoints, metrics, plots are deleted)."})
    resume_without_optimizer_state: bool = field(default=False, metadata={"help": "Resume from a checkpoint that has no optimizer, LR-scheduler or RNG state (optimizer.pt, scheduler.pt, rng_state.pth; e.g. save_only_model): the optimizer, the LR schedule and the RNG start afresh. Without it such a resume is refused."})
    failure_threshold: float = field(default=0.5, metadata={"help": "Stop the run when more than this share of trajectories fails for failure_patience generation steps in a row (1 disables)."})
    failure_patience: int = field(default=3, metadata={"help": "Consecutive bad generation steps (failed share over failure_threshold, a reward raising on every sample, or no reward scoring any trajectory) before the run stops."})
    plots: bool = field(default=True, metadata={"help": "Write reward/length PNGs to OUTPUT_DIR/plots at the end."})
    log_completions: bool = field(default=False, metadata={"help": "Append every generation's prompts, completions, rewards and advantages to OUTPUT_DIR/completions.jsonl and print a sample."})
    num_completions_to_print: int | None = field(default=None, metadata={"help": "How many completions to print per logged generation (None: all of them, as in TRL)."})
    log_multimodal: bool = field(default=True, metadata={"help": "TRL's image logging switch; rlcore trains text only, so there is never an image to log."})

    # --- TRL's vLLM options, mapped onto rlcore's samplers (see docs/porting-trl.md) ---------------
    use_vllm: bool = field(default=False, metadata={"help": "Generate with vLLM: sampler='vllm' (colocate) or 'openai' (server)."})
    vllm_mode: str = field(default="colocate", metadata={"help": "colocate (in-process vllm sampler) or server (openai sampler at the vLLM server)."})
    vllm_server_base_url: str | None = field(default=None, metadata={"help": "Base URL of the vLLM server (server mode)."})
    vllm_server_host: str = field(default="0.0.0.0", metadata={"help": "vLLM server host when no base URL is given."})
    vllm_server_port: int = field(default=8000, metadata={"help": "vLLM server port when no base URL is given."})
    vllm_server_timeout: float = field(default=240.0, metadata={"help": "Seconds to wait for the vLLM server."})
    vllm_gpu_memory_utilization: float = field(default=0.3, metadata={"help": "vLLM's GPU memory share (colocate)."})
    vllm_max_model_length: int | None = field(default=None, metadata={"help": "vLLM's max_model_len (colocate)."})
    vllm_tensor_parallel_size: int = field(default=1, metadata={"help": "vLLM tensor parallel size (colocate)."})
    vllm_enable_sleep_mode: bool = field(default=False, metadata={"help": "Sleep the colocated vLLM engine during every training step, as TRL does (sets sleep_sampler)."})
    vllm_importance_sampling_correction: bool = field(default=True, metadata={"help": "With use_vllm: correct for sampler/trainer mismatch (sets is_correction)."})
    vllm_importance_sampling_mode: str = field(default="sequence_mask", metadata={"help": "is_correction mode used with use_vllm."})
    vllm_importance_sampling_clip_max: float | None = field(default=3.0, metadata={"help": "is_threshold used with use_vllm."})
    vllm_importance_sampling_clip_min: float | None = field(default=None, metadata={"help": "is_min_threshold used with use_vllm."})
    vllm_importance_sampling_cap: float | None = field(default=None, metadata={"help": "Deprecated in TRL: vllm_importance_sampling_clip_max."})
    max_tool_calling_iterations: int | None = field(default=None, metadata={"help": "With tools: most tool rounds per trajectory (max_turns = this + 1)."})
    chat_template_kwargs: dict | str | None = field(default=None, metadata={"help": "Extra keyword arguments for the chat template wherever the policy's prompts and turns are rendered (e.g. {\"enable_thinking\": false}); a JSON object on the command line."})
    chat_template: str | None = field(default=None, metadata={"help": "A Jinja chat template file the run renders every prompt and turn with instead of the tokenizer's own (the saved model keeps its own); see docs/chat-templates.md."})
    multi_turn_mode: str = field(default="auto", metadata={"help": "How a multi-turn episode becomes training sequences: append (one sequence; a template that rewrites the history fails the trajectory), per_turn (every assistant turn a sample of its own, its prompt the conversation re-rendered), auto (append where the template appends, a sample per turn where it rewrites the history, e.g. drops earlier <think> blocks; a family's prefix-preserving template or preserve_thinking is used where one exists). See docs/chat-templates.md."})

    # --- TRL 1.16 options with TRL's meaning (docs/porting-trl.md) -----------------------------------
    multi_objective_aggregation: str = field(default="sum_then_normalize", metadata={"help": "How several rewards combine: sum_then_normalize (weighted sum, then the advantage estimator) or normalize_then_sum (GDPO: each reward normalised within its group, then the weighted sum; with advantage=grpo the sum is then normalised over the batch, as in TRL)."})
    off_policy_mask_threshold: float | None = field(default=None, metadata={"help": "Off-policy sequence masking (DeepSeek-V3.2, TRL's OPSM): a negative-advantage trajectory whose mean per-token KL(sampler || current policy) exceeds this is left out of the loss (None: off)."})
    cast_lm_head_to_fp32: bool = field(default=False, metadata={"help": "Keep the lm_head of the policy and the reference model in float32 and compute logits in float32 (ScaleRL); the colocated hf sampler draws from the same float32 head."})
    router_aux_loss_coef: float | None = field(default=None, metadata={"help": "Weight of a Mixture-of-Experts model's load-balancing loss added to the training loss (None: the model config's own router_aux_loss_coef; 0 turns it off; an error for a model that is not MoE)."})
    pad_to_multiple_of: int | str | None = field(default="auto", metadata={"help": "Pad every micro-batch's sequence length to a multiple of this (fixed shapes for compilers); changes no loss number. auto: no padding (TRL: 128 on Neuron only)."})
    log_unique_prompts: bool = field(default=False, metadata={"help": "With log_completions: log one completion per distinct prompt (the first), not every completion."})
    vllm_model_impl: str = field(default="vllm", metadata={"help": "vLLM's model implementation for the colocated vllm sampler: vllm or transformers (the engine's model_impl)."})

    # --- TRL options rlcore refuses unless left at TRL's default (rlcore.training.trl_fields) --
    ds3_gather_for_generation: bool = field(default=True, metadata={"help": "Not supported (DeepSpeed ZeRO-3 generation)."})
    cache_implementation: str | None = field(default=None, metadata={"help": "Not supported."})
    vllm_structured_outputs_regex: str | None = field(default=None, metadata={"help": "Not supported."})
    vllm_group_port: int = field(default=51216, metadata={"help": "Not supported: rlcore's own weight sync."})
    log_completions_hub_repo: str | None = field(default=None, metadata={"help": "Not supported (no network)."})
    use_transformers_continuous_batching: bool = field(default=False, metadata={"help": "Not supported: sampler='vllm'."})
    transformers_continuous_batching_config: dict | None = field(default=None, metadata={"help": "Not supported."})
    use_transformers_paged: bool = field(default=False, metadata={"help": "Not supported: sampler='vllm'."})

    # --- LoRA -----------------------------------------------------------------------------------------
    use_peft: bool = field(default=False, metadata={"help": "Train LoRA adapters instead of all weights."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout."})
    lora_target_modules: list[str] | None = field(default=None, metadata={"help": "Modules to adapt (default: all linear layers)."})

    def __post_init__(self) -> None:
        check_field_types(self)  # a YAML `num_generations: [8]` is one line naming the field, not a TypeError later
        for name in _DICT_FIELDS + ("model_init_kwargs", "generation_kwargs", "chat_template_kwargs"):
            value = getattr(self, name)
            if isinstance(value, str):
                try:
                    value = json.loads(value) if value.strip() else {}
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{name} must be a JSON object, got {value!r} ({exc.msg})") from None
            if value is None and name in _DICT_FIELDS:
                value = {}
            if value is not None and not isinstance(value, dict):
                raise ConfigError(f"{name} must be a JSON object, got {type(value).__name__}")
            setattr(self, name, value)
        check_refused(self)
        if isinstance(self.pad_to_multiple_of, str) and self.pad_to_multiple_of != "auto":  # TRL's parsing (a CLI string)
            text = self.pad_to_multiple_of.strip().lower()
            try:
                self.pad_to_multiple_of = None if text in ("none", "null") else int(text)
            except ValueError:
                raise ConfigError(f"pad_to_multiple_of must be a positive integer, 'auto' or None, got {self.pad_to_multiple_of!r}") from None
        self._move_component_fields()
        if self.chat_template_kwargs:
            from ..chat_template import check_chat_template_kwargs

            check_chat_template_kwargs(self.chat_template_kwargs)
        from ..chat_template import check_multi_turn_mode

        check_multi_turn_mode(self.multi_turn_mode)
        if self.generation_batch_size is not None and self.steps_per_generation is not None:
            raise ConfigError("set generation_batch_size or steps_per_generation, not both")
        if self.bf16 is None:  # TRL: on unless fp16; rlcore: only where a GPU supports it (the CPU demo stays fp32)
            self.bf16 = (not self.fp16) and _cuda_bf16()
        if isinstance(self.scale_rewards, str) and self.scale_rewards.lower() in ("true", "false"):  # from a CLI
            self.scale_rewards = self.scale_rewards.lower() == "true"
        self.scale_rewards = {True: "group", False: "none"}.get(self.scale_rewards, self.scale_rewards)
        if self.min_p is None:
            self.min_p = 0.0
        if self.vllm_importance_sampling_cap is not None:
            warnings.warn("vllm_importance_sampling_cap is deprecated (as in TRL): use vllm_importance_sampling_clip_max",
                          FutureWarning, stacklevel=3)
            self.vllm_importance_sampling_clip_max = self.vllm_importance_sampling_cap
        self._map_vllm()
        if self.sampler == "vllm" and not self.use_vllm and self.vllm_model_impl != "vllm":  # rlcore's own vllm sampler
            _set_model_impl(self.sampler_options, self.vllm_model_impl)
        if self.activation_checkpointing is None and self.gradient_checkpointing is None:
            # TRL's default (on), set under transformers' current name: set under the old one, as TRL
            # does, every run printed transformers' deprecation warning for a setting nobody made
            self.activation_checkpointing = True
        if self.sleep_sampler and self.sampler == "vllm":  # the engine can only sleep when it is built for it
            if not self.sampler_options.setdefault("enable_sleep_mode", True):
                raise ConfigError("sleep_sampler=True needs the vllm engine built with enable_sleep_mode=True, but "
                                  "sampler_options sets it False; drop one of them")
        super().__post_init__()
        if self.auto_find_batch_size:
            raise ConfigError("auto_find_batch_size cannot keep whole groups of num_generations; lower per_device_train_batch_size instead")
        # TRL 1.16's generation-batch arithmetic: counts in micro-steps of per_device_train_batch_size × processes
        global_micro = self.per_device_train_batch_size * max(1, self.world_size)
        if self.generation_batch_size is None:
            if self.steps_per_generation is not None and self.gradient_accumulation_steps > 1:
                warnings.warn(
                    "steps_per_generation counts micro-steps, as in TRL (one generation batch = per_device_train_batch_size"
                    f" × processes × steps_per_generation = {global_micro * self.steps_per_generation}); before rlcore 0.2 it"
                    " counted optimizer steps (× gradient_accumulation_steps)", FutureWarning, stacklevel=3)
            self.steps_per_generation = self.steps_per_generation or self.gradient_accumulation_steps
            self.generation_batch_size = global_micro * self.steps_per_generation
        else:
            if self.generation_batch_size % global_micro:
                raise ConfigError(
                    f"generation_batch_size={self.generation_batch_size} must be a multiple of per_device_train_batch_size"
                    f" × processes = {global_micro}"
                )
            self.steps_per_generation = self.generation_batch_size // global_micro
        if self.do_eval and str(getattr(self.eval_strategy, "value", self.eval_strategy)) != "no":
            n_eval = self.num_generations_eval or self.num_generations
            if (self.per_device_eval_batch_size * max(1, self.world_size)) % n_eval:
                raise ConfigError(
                    f"per_device_eval_batch_size × processes = {self.per_device_eval_batch_size * max(1, self.world_size)}"
                    f" must be a multiple of the eval group size {n_eval} (num_generations_eval or num_generations)"
                )
        check_values(self)

    def _move_component_fields(self) -> None:
        """rlcore 0.1's ``gigpo_*`` fields → the gigpo estimator's ``advantage_options`` (with a
        warning); an explicit ``advantage_options`` value wins."""
        for old, (advantage, option) in _MOVED_TO_ADVANTAGE.items():
            value = getattr(self, old)
            if value is None:
                continue
            warnings.warn(f"{old} is deprecated: use advantage_options={{{option!r}: {value!r}}} (the {advantage} "
                          "estimator declares it)", FutureWarning, stacklevel=4)
            if self.advantage == advantage:
                self.advantage_options.setdefault(option, value)

    def _map_vllm(self) -> None:
        """TRL's ``use_vllm``/``vllm_*`` options onto rlcore's samplers: colocate → the in-process
        ``vllm`` sampler, server → the ``openai`` sampler pointed at the server; TRL's default vLLM
        importance-sampling correction becomes ``is_correction``."""
        if not self.use_vllm:
            return
        if self.vllm_mode not in ("colocate", "server"):
            raise ConfigError(f"vllm_mode={self.vllm_mode!r} is not colocate or server")
        wanted = "vllm" if self.vllm_mode == "colocate" else "openai"
        if self.sampler not in ("hf", wanted):
            raise ConfigError(f"use_vllm=True (vllm_mode={self.vllm_mode}) conflicts with sampler={self.sampler!r}; set one of them")
        self.sampler = wanted
        opts = self.sampler_options
        if wanted == "vllm":
            opts.setdefault("gpu_memory_utilization", self.vllm_gpu_memory_utilization)
            opts.setdefault("tensor_parallel_size", self.vllm_tensor_parallel_size)
            opts.setdefault("enable_sleep_mode", self.vllm_enable_sleep_mode or self.sleep_sampler)
            if self.vllm_enable_sleep_mode:  # TRL sleeps the colocated engine during every optimizer step
                self.sleep_sampler = True
            if self.vllm_max_model_length is not None:
                opts.setdefault("max_model_len", self.vllm_max_model_length)
            _set_model_impl(opts, self.vllm_model_impl)  # TRL always hands its colocated engine model_impl
        else:
            opts.setdefault("base_url", self.vllm_server_base_url or f"http://{self.vllm_server_host}:{self.vllm_server_port}")
            opts.setdefault("timeout", self.vllm_server_timeout)
        if self.vllm_importance_sampling_correction and self.is_correction is None:
            self.is_correction = self.vllm_importance_sampling_mode
            if self.vllm_importance_sampling_clip_max is not None:
                self.is_threshold = self.vllm_importance_sampling_clip_max
            self.is_min_threshold = self.vllm_importance_sampling_clip_min

    @property
    def prompts_per_generation(self) -> int:
        return int(self.generation_batch_size or 0) // self.num_generations

    @property
    def effective_loss_type(self) -> str:
        """The loss plugin to use. Every loss honours ``importance_sampling_level`` itself (as in
        TRL), so this is ``loss_type``; kept for code written against earlier rlcore."""
        return self.loss_type


def _set_model_impl(opts: dict, impl: str) -> None:
    """``vllm_model_impl`` → the vllm sampler's engine argument ``model_impl`` (vLLM's
    ``EngineArgs.model_impl``), unless ``sampler_options`` already sets it (directly or in ``engine_args``)."""
    if "model_impl" not in opts and "model_impl" not in (opts.get("engine_args") or {}):
        opts["model_impl"] = impl


def _cuda_bf16() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    except Exception:  # noqa: BLE001 - no usable CUDA means no bf16 default
        return False


def _field_hints() -> dict[str, Any]:
    """GRPOConfig's field annotations, resolved (``{}`` for any that cannot be)."""
    global _HINTS
    if _HINTS is None:
        import dataclasses
        import typing

        try:
            _HINTS = typing.get_type_hints(GRPOConfig)
        except Exception:  # noqa: BLE001 - an annotation that does not resolve: that field goes unchecked
            _HINTS = {f.name: f.type for f in dataclasses.fields(GRPOConfig) if not isinstance(f.type, str)}
    return _HINTS


_HINTS: dict[str, Any] | None = None
#: fields HfArgumentParser leaves None (a union with a list) and TrainingArguments reads None as empty
_NONE_AS_EMPTY = ("debug",)
#: what a field takes beyond its annotation: TRL's True/False for scale_rewards, peft's "all-linear"
#: (or a regex) for the LoRA targets, a JSON text for generation_kwargs (parsed in __post_init__)
_ALSO_TAKES: dict[str, Any] = {"scale_rewards": bool, "lora_target_modules": str, "generation_kwargs": str}


def _what(value: Any) -> str:
    """How a value's type reads in an error line: ``a list``, ``text``, ``true/false``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, str):
        return "text"
    name = type(value).__name__
    return {"int": "an integer", "float": "a number", "list": "a list", "tuple": "a list", "dict": "a mapping"}.get(name, f"a {name}")


def _expected(tp: Any) -> str | None:
    """What an annotation asks for, as a user reads it; None where rlcore cannot tell (unchecked)."""
    import enum
    import typing

    origin = typing.get_origin(tp)
    if origin is typing.Union or type(tp).__name__ == "UnionType":
        args = typing.get_args(tp)
        if str in args and any(isinstance(a, type) and issubclass(a, enum.Enum) for a in args):
            args = tuple(a for a in args if a is not str)  # a strategy's names are the text it takes
        parts = [_expected(a) for a in args]
        if any(p is None for p in parts):
            return None
        parts = list(dict.fromkeys(p for p in parts if p))
        return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        args = typing.get_args(tp)
        if not args or args[0] is Any:
            return "a list"
        plural = {str: "text", int: "integers", float: "numbers", bool: "true/false values"}.get(args[0])
        if plural is None:
            inner = _expected(args[0])
            if inner is None:
                return None
            plural = f"values ({inner})"
        return f"a list of {plural}"
    if origin is dict or tp is dict:
        return "a mapping"
    if tp is type(None):
        return "null"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(str(m.value) for m in tp)
    return {bool: "true or false", int: "an integer", float: "a number", str: "text", list: "a list"}.get(tp)


def _fits(value: Any, tp: Any) -> tuple[bool, Any]:
    """Whether ``value`` is of annotation ``tp`` (an int for a float, a whole float for an int, a
    path for text), and the value to keep (``8.0`` → ``8``)."""
    import enum
    import os
    import typing

    origin = typing.get_origin(tp)
    if origin is typing.Union or type(tp).__name__ == "UnionType":
        for a in typing.get_args(tp):
            ok, kept = _fits(value, a)
            if ok:
                return True, kept
        return False, value
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in typing.get_args(tp)), value
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False, value
        args = typing.get_args(tp)
        if not args or args[0] is Any:
            return True, value
        kept = []
        for v in value:
            ok, k = _fits(v, args[0])
            if not ok:
                return False, value
            kept.append(k)
        return True, type(value)(kept)
    if origin is dict or tp is dict:
        return isinstance(value, dict), value
    if tp is type(None):
        return value is None, value
    if tp is bool:
        return isinstance(value, bool) or (type(value) is int and value in (0, 1)), value
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            return True, int(value)
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool), value
    if tp is str:
        return isinstance(value, (str, os.PathLike)), value
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return isinstance(value, tp), value
    if isinstance(tp, type):
        return isinstance(value, tp), value
    return True, value  # Any, a TypeVar …: not checked


def check_field_types(cfg: Any) -> None:
    """Every field holds a value of its annotated type (the same rule for every field): a plain value
    (text, a number, true/false, null, a list, a mapping — what a config file or a flag gives) that
    does not fit is one line naming the field, the value and the type it takes. Whole floats for
    integers (``8.0``) become ints; ints are numbers. Other objects (a ``Path``, transformers'
    ``AcceleratorConfig`` in a config rebuilt from another's fields) are left to their field."""
    import typing

    for name, tp in _field_hints().items():
        if name in _ALSO_TAKES:
            tp = typing.Union[tp, _ALSO_TAKES[name]]
        if not hasattr(cfg, name) or _expected(tp) is None:
            continue
        value = getattr(cfg, name)
        if value is None and name in _NONE_AS_EMPTY:
            continue
        if not isinstance(value, (type(None), bool, int, float, str, list, tuple, dict)):
            continue  # an object only code can pass (a Path, transformers' AcceleratorConfig): its field's own business
        ok, kept = _fits(value, tp)
        if ok:
            if kept is not value:
                setattr(cfg, name, kept)
            continue
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        hint = " (YAML reads no/yes/off/on as true/false: quote the word)" if isinstance(value, bool) else ""
        raise ConfigError(f"{name} must be {_expected(tp)}, got {shown} ({_what(value)}){hint}")


def check_values(cfg: GRPOConfig) -> None:
    """Value checks that need no registry: one line each, naming the setting."""
    if cfg.num_generations < 1:
        raise ConfigError(f"num_generations must be at least 1, got {cfg.num_generations}")
    if cfg.generation_batch_size % cfg.num_generations:
        raise ConfigError(
            f"generation batch of {cfg.generation_batch_size} trajectories (per_device_train_batch_size × "
            f"processes × steps_per_generation) is not a multiple of num_generations={cfg.num_generations}"
        )
    if cfg.scale_rewards not in SCALE_REWARDS:
        raise ConfigError(f"scale_rewards={cfg.scale_rewards!r} is not one of {', '.join(SCALE_REWARDS)}")
    if cfg.is_correction is not None and cfg.is_correction not in IS_MODES:
        raise ConfigError(f"is_correction={cfg.is_correction!r} is not one of {', '.join(IS_MODES)}")
    if not 0.0 < cfg.top_entropy_quantile <= 1.0:
        raise ConfigError(f"top_entropy_quantile must be in (0, 1], got {cfg.top_entropy_quantile}")
    from ..algorithms.entropy import check_entropy_settings

    check_entropy_settings(cfg)  # entropy_coef, use_adaptive_entropy and its bounds, step and target
    if cfg.num_generations_eval is not None and cfg.num_generations_eval < 1:
        raise ConfigError(f"num_generations_eval must be at least 1, got {cfg.num_generations_eval}")
    if cfg.importance_sampling_level not in ("token", "sequence"):
        raise ConfigError(f"importance_sampling_level={cfg.importance_sampling_level!r} is not token or sequence")
    for name in ("max_completion_length", "num_iterations", "rollout_concurrency", "logprob_chunk_size"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be at least 1, got {getattr(cfg, name)}")
    check_padding_free(cfg)
    if cfg.temperature <= 0:
        raise ConfigError(f"temperature must be > 0 (logprobs divide by it), got {cfg.temperature}")
    if cfg.epsilon < 0 or (cfg.epsilon_high is not None and cfg.epsilon_high < 0):
        raise ConfigError("epsilon and epsilon_high must be >= 0")
    if cfg.beta < 0:
        raise ConfigError(f"beta must be >= 0, got {cfg.beta}")
    check_opd(cfg)
    check_dynamic_sampling(cfg)
    if not cfg.learning_rate >= 0 or math.isinf(cfg.learning_rate):
        raise ConfigError(f"learning_rate must be a finite number >= 0, got {cfg.learning_rate}")
    check_output_dir(cfg.output_dir)
    if not 0.0 <= cfg.failure_threshold <= 1.0:
        raise ConfigError(f"failure_threshold must be a share between 0 and 1, got {cfg.failure_threshold}")
    if cfg.failure_patience < 1:
        raise ConfigError(f"failure_patience must be at least 1, got {cfg.failure_patience}")
    if cfg.max_turns is not None and cfg.max_turns < 1:
        raise ConfigError(f"max_turns must be at least 1, got {cfg.max_turns}")
    check_trl_options(cfg)


def check_padding_free(cfg: Any) -> None:
    """``padding_free`` / ``padding_free_max_tokens``: one line per bad value (a budget without
    padding_free is a setting that would do nothing)."""
    n = getattr(cfg, "padding_free_max_tokens", None)
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ConfigError(f"padding_free_max_tokens must be a positive number of tokens (or None: the longest sequence), got {n!r}")
    if n is not None and not getattr(cfg, "padding_free", False):
        raise ConfigError(f"padding_free_max_tokens={n} is set but padding_free is off: set padding_free=True (--padding_free) or drop it")


def check_opd(cfg: GRPOConfig) -> None:
    """On-policy distillation: ``loss_type='opd'`` or ``opd_coef`` > 0 needs ``teacher_model``, and a
    teacher is used by one of them (one line each)."""
    c = cfg.opd_coef
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c < math.inf:
        raise ConfigError(f"opd_coef must be a finite number >= 0, got {c!r}")
    uses = cfg.loss_type == "opd" or c > 0
    if uses and not cfg.teacher_model:
        raise ConfigError(f"{'loss_type=opd' if cfg.loss_type == 'opd' else 'opd_coef > 0'} distils from a teacher: "
                          "set teacher_model (a path, hub id or .gguf file sharing the tokenizer's vocabulary)")
    if cfg.teacher_model and not uses:
        raise ConfigError(f"teacher_model={cfg.teacher_model!r} is set but nothing uses it: set loss_type=opd or opd_coef > 0")
    if cfg.loss_type == "opd" and c > 0:
        raise ConfigError("loss_type=opd is the distillation loss alone; opd_coef weights it beside another loss_type — use one")


def check_dynamic_sampling(cfg: GRPOConfig) -> None:
    """``max_resample_rounds`` >= 0 and 1 <= ``min_groups`` <= the groups of a batch; dynamic sampling
    needs groups of two or more (one line each). Which reward ``dynamic_sampling_metric`` names is
    checked when the trainer knows its rewards."""
    r, m = cfg.max_resample_rounds, cfg.min_groups
    if isinstance(r, bool) or not isinstance(r, int) or r < 0:
        raise ConfigError(f"max_resample_rounds must be an int >= 0 (extra rounds of prompts per step), got {r!r}")
    groups = cfg.prompts_per_generation
    if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= max(1, groups):
        raise ConfigError(f"min_groups must be an int from 1 to the {groups} groups of a generation batch "
                          f"(generation_batch_size / num_generations), got {m!r}")
    if cfg.dynamic_sampling and cfg.num_generations < 2:
        raise ConfigError("dynamic_sampling keeps groups whose completions differ in reward: it needs num_generations >= 2, "
                          f"got {cfg.num_generations}")


VLLM_MODEL_IMPLS = ("vllm", "transformers", "auto", "terratorch")  # vLLM 0.33 ModelConfig.model_impl


def check_trl_options(cfg: GRPOConfig) -> None:
    """TRL 1.16 options rlcore implements (multi_objective_aggregation, off_policy_mask_threshold,
    router_aux_loss_coef, pad_to_multiple_of, vllm_model_impl): one line per bad value."""
    from ..rewards import AGGREGATIONS

    if cfg.multi_objective_aggregation not in AGGREGATIONS:
        raise ConfigError(f"multi_objective_aggregation={cfg.multi_objective_aggregation!r} is not one of {', '.join(AGGREGATIONS)}")
    if cfg.multi_objective_aggregation == "normalize_then_sum" and cfg.advantage == "grpo" and cfg.scale_rewards == "none":
        raise ConfigError("multi_objective_aggregation='normalize_then_sum' always divides by the batch std (TRL ignores "
                          "scale_rewards there); drop scale_rewards='none' or use sum_then_normalize")
    t = cfg.off_policy_mask_threshold
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < math.inf):
        raise ConfigError(f"off_policy_mask_threshold must be a KL threshold >= 0 (e.g. 0.5) or None, got {t!r}")
    c = cfg.router_aux_loss_coef
    if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c < math.inf):
        raise ConfigError(f"router_aux_loss_coef must be >= 0 (None: the model's own coefficient), got {c!r}")
    p = cfg.pad_to_multiple_of
    if p is not None and p != "auto" and (isinstance(p, bool) or not isinstance(p, int) or p < 1):
        raise ConfigError(f"pad_to_multiple_of must be a positive integer, 'auto' or None, got {p!r}")
    if cfg.vllm_model_impl not in VLLM_MODEL_IMPLS:
        raise ConfigError(f"vllm_model_impl={cfg.vllm_model_impl!r} is not one of {', '.join(VLLM_MODEL_IMPLS)} (vLLM's model_impl)")


def validate_components(cfg: GRPOConfig, extra_rewards: int = 0, environment_rewards: int = 0) -> None:
    """Every component name resolves (UnknownComponentError names the culprit and a package to
    install) and reward weights line up with rewards (``environment_rewards`` — TRL environments'
    ``get_reward`` — count as a reward source but take no weight: theirs is 1)."""
    from ..plugins import plugins

    p = plugins()
    p.get("scheduler", cfg.scheduler)
    p.get("sampler", cfg.sampler)
    p.get("advantage", cfg.advantage)
    p.get("loss", cfg.effective_loss_type)
    names = list(cfg.reward_funcs or [])
    for name in names:
        p.get("reward", name)
    for name in cfg.observers or []:  # an observer is named like a component: a typo is one line, nothing loaded
        p.observer(name)
    p.get("prompt_sampler", cfg.prompt_sampler)
    if cfg.tool_parser != "auto":
        p.component("tool_parser", cfg.tool_parser)
    check_component_options(cfg)
    if cfg.vllm_model_impl != "vllm" and cfg.sampler != "vllm":
        raise ConfigError(f"vllm_model_impl={cfg.vllm_model_impl!r} applies to the colocated vllm sampler (sampler='vllm', or "
                          f"use_vllm=True with vllm_mode='colocate'), not sampler={cfg.sampler!r}; a vLLM server takes "
                          "--model-impl on its own command line")
    n = len(names) + extra_rewards
    if cfg.dynamic_sampling and not extra_rewards and not environment_rewards:  # every reward is named: check now
        from .dynamic_sampling import check_metric

        check_metric(cfg.dynamic_sampling_metric, names)
    if n + environment_rewards == 0:
        raise ConfigError("no reward: pass --reward NAME (see `rlcore components reward`) or reward_funcs=")
    if cfg.reward_weights is not None and len(cfg.reward_weights) != n:
        raise ConfigError(f"reward_weights has {len(cfg.reward_weights)} values for {n} rewards; give one per reward")


def check_component_options(cfg: GRPOConfig) -> None:
    """Every key of ``loss_options`` / ``advantage_options`` / ``scheduler_options`` /
    ``reward_options[NAME]`` is an option the chosen component declares (as its ``--flags`` are): a
    typo is one line naming what it does accept."""
    from ..plugins import get
    from ..rollout.options import component_parameters

    checks = [("loss", cfg.effective_loss_type, cfg.loss_options, "loss_options"),
              ("advantage", cfg.advantage, cfg.advantage_options, "advantage_options"),
              ("scheduler", cfg.scheduler, cfg.scheduler_options, "scheduler_options"),
              ("prompt_sampler", cfg.prompt_sampler, cfg.prompt_sampler_options, "prompt_sampler_options")]
    for name, opts in (cfg.reward_options or {}).items():
        if name in (cfg.reward_funcs or []) and isinstance(opts, dict):  # options reach Reward classes only
            checks.append(("reward", name, opts, f"reward_options[{name!r}]"))
    for kind, name, opts, field_name in checks:
        factory = get(kind, name)
        if not opts or (kind == "reward" and not inspect.isclass(factory)):
            continue
        accepted = component_parameters(kind, factory)
        unknown = sorted(set(opts) - set(accepted))
        if unknown:
            raise ConfigError(f"{field_name} has {', '.join(unknown)}, which {kind} {name!r} does not declare; "
                              f"it accepts: {', '.join(sorted(accepted)) or 'nothing'}")
