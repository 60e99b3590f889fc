"""``Policy``: the model being trained, as a handful of calls a loop makes (Tinker / twinkle style).

    policy = Policy(model, tokenizer, loss="grpo", learning_rate=1e-6)
    metrics = policy.forward_backward(trajectories, advantages)      # loss plugin + backward
    policy.clip_grad_and_step()                                      # clip, optimizer, lr schedule
    sync_weights(policy, sampler)                                    # the sampler follows

Why this shape: a researcher changes one step of the loop (another advantage, a filter, two
losses) without subclassing a trainer. The steps are the very functions ``GRPOTrainer`` calls
(:mod:`rlcore.loop.loss`), so a loop written with them trains like the trainer does.
"""

from __future__ import annotations

import os
import types
from typing import Any, Sequence

import attrs
import torch

from ..algorithms.entropy import EntropyBonus
from ..algorithms.losses import LossConfig
from ..algorithms.losses import loss_options as resolve_loss_options
from ..protocols import declared_options
from ..errors import ConfigError
from ..gguf import resolve_model
from ..plugins import get as get_component
from ..types import Batch, Trajectory
from ..sampling.weight_export import base_model, export_weights, is_peft_model, sampler_accepts_lora
from ..training.data_parallel import (
    allreduce_gradients, broadcast_module, broadcast_object, gather_objects, loss_normalisation, reduce_step_metrics,
    sum_over_ranks, world,
)
from ..algorithms.logprobs import PaddingFree, check_padding_free
from .loss import batch_logprobs, batch_loss, pack

_STATE_FILE = "policy_state.pt"


class Policy:
    """A causal LM (optionally with LoRA), its optimizer and the configured loss plugin.

    Args:
        model: a HF id / path, or a loaded ``PreTrainedModel`` (used as is, not copied).
        tokenizer: the tokenizer (default: loaded from the model's path).
        loss: a registered loss name (``rlcore components loss``) or a loss function.
        lora: a ``peft.LoraConfig``, a dict of its fields, or ``True`` (r=16, all linear layers).
        learning_rate, weight_decay, adam_beta1, adam_beta2, adam_epsilon: AdamW, with
            transformers' grouping (no decay on biases and norms), as ``GRPOTrainer`` builds it.
        lr_scheduler_type, warmup_steps, max_steps: the learning-rate schedule (transformers'
            ``get_scheduler``; ``constant`` by default).
        max_grad_norm: clipping in :meth:`clip_grad_and_step`.
        temperature: divides logits exactly as at sampling time.
        logprob_chunk_size, top_entropy_quantile, mask_truncated_completions: as in GRPOConfig.
        entropy_coef, use_adaptive_entropy, entropy_coef_min, entropy_coef_max, entropy_coef_delta,
            entropy_target: TRL's entropy bonus, as in GRPOConfig (:mod:`rlcore.algorithms.entropy`);
            :meth:`clip_grad_and_step` is the optimizer-step boundary where the adaptive
            coefficient moves.
        cast_lm_head_to_fp32, router_aux_loss_coef: as in GRPOConfig (TRL 1.16's): a float32
            lm_head (and reference head) with float32 logits; an MoE model's load-balancing loss
            weight (``None``: the model config's own, 0: off), logged as ``aux_loss``.
        padding_free, padding_free_max_tokens: as in GRPOConfig: every forward (the loss, the
            policy's, reference's and teacher's logprobs) runs the batch's sequences packed end to
            end with per-sequence ``position_ids``; the same numbers as padded. A model that cannot
            take packed input is one line here.
        remote_group: the device group to build it on (see :func:`rlcore.distributed.initialize`); a
            group of several workers trains data-parallel (:class:`rlcore.distributed.RemotePolicy`).
            Under any process group of several ranks (a policy group, ``torchrun``) the ranks compute
            what one process would over all their rows: the loss normaliser and metrics over the
            whole batch, gradients averaged in :meth:`clip_grad_and_step`, rank 0's weights at the
            start, :meth:`save` by rank 0, :meth:`load` read by rank 0 and sent to the others.
        reference: ``"auto"`` keeps a frozen copy for the KL term when ``beta`` > 0 (LoRA: the base
            model with adapters off), a module to use as the reference, or ``None``.
        teacher: on-policy distillation's teacher (a path, hub id, .gguf file or module with the
            policy's vocabulary; frozen): its logprobs of every batch's tokens feed ``loss="opd"`` or
            ``opd_coef=`` beside another loss (``opd/reverse_kl`` in the metrics).
        **loss_options: the loss knobs (``epsilon``, ``epsilon_high``, ``beta``, ``delta``,
            ``is_correction`` …, the fields of :class:`~rlcore.algorithms.losses.LossConfig`).
    """

    def __new__(cls, *args: Any, remote_group: str | None = None, **kwargs: Any) -> Any:
        """``remote_group=NAME`` under ``rlcore.distributed.initialize(mode="ray")``: the policy is
        built in an actor on that group and a proxy with the same methods
        (:class:`~rlcore.distributed.groups.RemotePolicy`) comes back."""
        from .placer import get_placer

        placer = get_placer()
        if remote_group is not None and placer is not None:
            placed = placer.place_policy(remote_group, args, kwargs)
            if placed is not None:
                return placed
        return super().__new__(cls)

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        remote_group: str | None = None,
        loss: Any = "grpo",
        lora: Any = None,
        learning_rate: float = 1e-6,
        weight_decay: float = 0.0,
        adam_beta1: float = 0.9,
        adam_beta2: float = 0.999,
        adam_epsilon: float = 1e-8,
        lr_scheduler_type: str = "constant",
        warmup_steps: int = 0,
        max_steps: int | None = None,
        max_grad_norm: float | None = 1.0,
        temperature: float = 1.0,
        logprob_chunk_size: int = 1024,
        top_entropy_quantile: float = 1.0,
        mask_truncated_completions: bool = False,
        entropy_coef: float = 0.0,
        use_adaptive_entropy: bool = False,
        entropy_coef_min: float = 0.0,
        entropy_coef_max: float = 1.0,
        entropy_coef_delta: float = 0.005,
        entropy_target: float = 0.2,
        cast_lm_head_to_fp32: bool = False,
        router_aux_loss_coef: float | None = None,
        padding_free: bool = False,
        padding_free_max_tokens: int | None = None,
        reference: Any = "auto",
        teacher: Any = None,
        device: Any = None,
        disable_dropout: bool = True,
        **loss_options: Any,
    ) -> None:
        from ..training.components import apply_peft, disable_dropout as _no_dropout, load_tokenizer

        loss_fn = get_component("loss", loss) if isinstance(loss, str) else loss
        # the knobs every loss shares, plus the ones this loss declares (sapo_temperature_* for sapo …)
        known = ({f.name for f in attrs.fields(LossConfig)} - {"num_items", "options"}) | set(declared_options(loss_fn))
        unknown = sorted(set(loss_options) - known)
        if unknown:
            raise ConfigError(f"Policy got unknown options: {', '.join(unknown)}; loss knobs are {', '.join(sorted(known))}")
        if isinstance(model, (str, os.PathLike)):
            model = resolve_model(str(model))  # a .gguf file: its converted float32 directory
        self.tokenizer = load_tokenizer(model, tokenizer)
        if isinstance(model, (str, os.PathLike)):
            from transformers import AutoModelForCausalLM

            from ..training.components import from_pretrained

            model = from_pretrained(AutoModelForCausalLM, str(model), "model", dtype="auto")
        if disable_dropout:
            _no_dropout(model)
        if lora is not None and lora is not False:
            model = apply_peft(model, _lora_args(lora), lora if _is_lora_config(lora) else None)
        if device is not None:
            model.to(device)
        self.model = model
        self.loss_name = loss if isinstance(loss, str) else getattr(loss, "__name__", "loss")
        self.loss_fn = loss_fn
        self.loss_options = dict(loss_options)
        self.max_grad_norm = max_grad_norm
        self.temperature = float(temperature)
        self.logprob_chunk_size = int(logprob_chunk_size)
        self.top_entropy_quantile = float(top_entropy_quantile)
        self.mask_truncated_completions = bool(mask_truncated_completions)
        self.entropy_bonus = EntropyBonus.from_args(types.SimpleNamespace(
            entropy_coef=entropy_coef, use_adaptive_entropy=use_adaptive_entropy, entropy_coef_min=entropy_coef_min,
            entropy_coef_max=entropy_coef_max, entropy_coef_delta=entropy_coef_delta, entropy_target=entropy_target))
        from ..training.model_options import cast_lm_head_to_fp32 as _fp32_head, router_aux

        self.router_aux = router_aux(model, router_aux_loss_coef)
        if cast_lm_head_to_fp32:
            _fp32_head(model)
        self.ref_model = self._reference(reference)
        if cast_lm_head_to_fp32 and self.ref_model is not None:
            _fp32_head(self.ref_model)
        # on-policy distillation (loss="opd", or opd_coef= beside another loss): a path, hub id, .gguf or module
        from ..training.components import teacher_model as _teacher

        self.teacher_model = _teacher(model, types.SimpleNamespace(teacher_model=teacher, trust_remote_code=False,
                                                                   model_init_kwargs=None))
        if self.teacher_model is not None:
            self.teacher_model.to(self.device)
        from ..training.config import check_padding_free as _check_pf_options

        _check_pf_options(types.SimpleNamespace(padding_free=padding_free, padding_free_max_tokens=padding_free_max_tokens))
        self.padding_free = PaddingFree(padding_free_max_tokens) if padding_free else None
        if self.padding_free is not None:  # a model whose attention cannot take packed input: one line now
            for m in (self.model, self.ref_model, self.teacher_model):
                if m is not None:
                    check_padding_free(m)
        self.optimizer = _adamw(model, learning_rate, weight_decay, (adam_beta1, adam_beta2), adam_epsilon)
        from transformers import get_scheduler

        self.lr_scheduler = get_scheduler(lr_scheduler_type, self.optimizer, num_warmup_steps=int(warmup_steps),
                                          num_training_steps=max_steps)
        self.step = 0
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else (self.tokenizer.eos_token_id or 0))
        if world()[1] > 1:  # data-parallel ranks start from rank 0's weights (LoRA's random init differs)
            broadcast_module(self.model)

    # --- what the loop calls -------------------------------------------------------------------------
    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    def loss_config(self, num_items: float | None = None) -> LossConfig:
        """The loss knobs of this policy (``num_items``: dapo/cispo's normaliser, per batch)."""
        args = types.SimpleNamespace(temperature=self.temperature, **self.loss_options)
        return LossConfig.from_args(args, num_items=num_items, options=resolve_loss_options(args, self.loss_fn))

    def batch(self, inputs: Batch | Sequence[Trajectory], advantages: Any = None) -> Batch:
        """A :class:`Batch` on this policy's device: ``inputs`` as is, or trajectories packed with
        their ``advantages`` (failed ones, and truncated ones if asked, do not train)."""
        if isinstance(inputs, Batch):
            if advantages is not None:
                raise ConfigError("a Batch carries its advantages already; pass advantages= with trajectories only")
            return inputs.to(self.device)
        if advantages is None:
            raise ConfigError("forward_backward(trajectories, advantages): advantages are missing "
                              "(e.g. rlcore.get('advantage', 'grpo')()(trajectories))")
        return pack(list(inputs), advantages, self.pad_token_id, mask_truncated=self.mask_truncated_completions,
                    device=self.device)

    def forward_backward(self, inputs: Batch | Sequence[Trajectory], advantages: Any = None,
                         old_logps: torch.Tensor | None = None, ref_logps: torch.Tensor | None = None, *,
                         num_items: float | None = None, loss_scale: float = 1.0) -> dict[str, float]:
        """Score ``inputs`` with the loss plugin and accumulate gradients (no optimizer step).

        ``old_logps``: logprobs of the policy that sampled, ``[B, T]`` (:meth:`logprobs` before the
        policy moved); ``None`` when this is the first pass over freshly sampled data (ratio 1, its
        gradient the policy gradient). ``ref_logps``: the reference's, computed here when ``beta``
        > 0 and not given. ``loss_scale`` multiplies the loss before backward (``1/k`` to accumulate
        ``k`` calls into one step). Returns ``loss`` and the loss plugin's metrics.
        """
        batch = self.batch(inputs, advantages)
        if old_logps is not None:
            batch.old_logps = old_logps.to(self.device)
        if ref_logps is not None:
            batch.ref_logps = ref_logps.to(self.device)
        if float(self.loss_options.get("beta", 0.0) or 0.0) != 0.0 and batch.ref_logps is None:
            batch.ref_logps = self.ref_logprobs(batch)
        if self.teacher_model is not None and batch.teacher_logps is None:  # on-policy distillation
            batch.teacher_logps = batch_logprobs(self.teacher_model, batch, temperature=self.temperature,
                                                 chunk_size=self.logprob_chunk_size, padding_free=self.padding_free)
        weight, rows, tokens = 1.0, float(batch.size), float(batch.completion_mask.sum())
        ranks = world()[1]
        if ranks > 1:  # data-parallel: this rank's share of one process's loss over the whole batch
            num_items, weight = self._share(num_items, rows, tokens, ranks)
            loss_scale = loss_scale * weight
        self.model.train()
        loss, metrics = batch_loss(
            self.model, batch, self.loss_fn, self.loss_config(num_items), temperature=self.temperature,
            chunk_size=self.logprob_chunk_size, top_entropy_quantile=self.top_entropy_quantile,
            use_sampler_logps=bool(self.loss_options.get("is_correction")),
            entropy_bonus=self.entropy_bonus, router_aux=self.router_aux, padding_free=self.padding_free,
        )
        (loss * loss_scale).backward()
        out = {"loss": float(loss.detach()), **metrics}
        out["num_tokens"] = tokens
        if ranks > 1:
            out = reduce_step_metrics(out, rows=rows, tokens=tokens, weight=weight)
        return out

    def _share(self, num_items: float | None, rows: float, tokens: float, ranks: int) -> tuple[float | None, float]:
        """Under data parallelism (``ranks`` processes, gradients averaged over them): the loss
        normaliser and the factor on this rank's loss that make the averaged gradient the one of a
        single process holding every rank's rows. Token-normalised losses get the whole batch's
        active tokens (or the ``num_items`` given: one process's normaliser) over the ranks; bnpo's
        token mean is weighted by this rank's share of the tokens, a mean over sequences by its
        share of the rows."""
        parts = gather_objects((rows, tokens))
        all_rows, all_tokens = sum(r for r, _ in parts), sum(t for _, t in parts)
        kind = loss_normalisation(self.loss_fn, self.loss_name)
        if kind == "num_items":
            whole = float(num_items) if num_items is not None else all_tokens
            return whole / ranks, 1.0
        if kind == "tokens":
            return num_items, (ranks * tokens / all_tokens) if all_tokens > 0 else 0.0
        return num_items, (ranks * rows / all_rows) if all_rows > 0 else 0.0

    def clip_grad_and_step(self, max_grad_norm: float | None = None) -> dict[str, float]:
        """Clip the accumulated gradients (``max_grad_norm``; ``None`` or 0: no clipping), step the
        optimizer and the lr schedule, zero the gradients. Returns ``grad_norm`` and ``learning_rate``
        (and ``entropy_coef`` with an entropy bonus: the adaptive coefficient moves here, on the
        entropy of every ``forward_backward`` since the last step)."""
        limit = self.max_grad_norm if max_grad_norm is None else max_grad_norm
        allreduce_gradients(self.model)  # data-parallel ranks: the mean gradient (one process's); else nothing
        params = [p for p in self.model.parameters() if p.requires_grad]
        if limit:
            norm = float(torch.nn.utils.clip_grad_norm_(params, float(limit)))
        else:
            grads = [p.grad.detach().norm() for p in params if p.grad is not None]
            norm = float(torch.stack(grads).norm()) if grads else 0.0
        lr = float(self.lr_scheduler.get_last_lr()[0])
        self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        out = {"grad_norm": norm, "learning_rate": lr}
        if self.entropy_bonus is not None:
            out["entropy_coef"] = self.entropy_bonus.step(reduce=sum_over_ranks if world()[1] > 1 else None)
        return out

    def logprobs(self, inputs: Batch | Sequence[Trajectory], *, rows_per_pass: int | None = None) -> torch.Tensor:
        """Logprobs ``[B, T]`` of the inputs' tokens under the current policy, without gradient (the
        ``old_logps`` of later passes over the same data)."""
        batch = inputs.to(self.device) if isinstance(inputs, Batch) else \
            pack(list(inputs), [0.0] * len(inputs), self.pad_token_id, device=self.device)
        was = self.model.training
        self.model.eval()
        try:
            return batch_logprobs(self.model, batch, temperature=self.temperature, chunk_size=self.logprob_chunk_size,
                                  rows_per_pass=rows_per_pass, padding_free=self.padding_free)
        finally:
            self.model.train(was)

    def ref_logprobs(self, inputs: Batch | Sequence[Trajectory], *, rows_per_pass: int | None = None) -> torch.Tensor:
        """Logprobs under the reference (the frozen copy, or the base model with adapters off)."""
        batch = inputs.to(self.device) if isinstance(inputs, Batch) else \
            pack(list(inputs), [0.0] * len(inputs), self.pad_token_id, device=self.device)
        kw = dict(temperature=self.temperature, chunk_size=self.logprob_chunk_size, rows_per_pass=rows_per_pass,
                  padding_free=self.padding_free)
        if self.ref_model is not None:
            return batch_logprobs(self.ref_model, batch, **kw)
        if is_peft_model(self.model):
            with self.model.disable_adapter():
                return batch_logprobs(self.model, batch, **kw)
        raise ConfigError("this policy has no reference model: create it with beta > 0 or reference=<module>")

    def weights(self, sampler: Any = None, *, lora: bool | None = None, to_cpu: bool = False) -> tuple[dict[str, Any], bool]:
        """The weights ``sampler`` needs and whether they are adapter-only (``lora``: ask for
        adapters / merged weights explicitly); see :func:`rlcore.sampling.weight_export.export_weights`."""
        if lora is None:
            lora = sampler is not None and sampler_accepts_lora(sampler)
        return export_weights(self.model, sampler_accepts_lora=bool(lora), to_cpu=to_cpu, copy=to_cpu)

    # --- checkpoints ---------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> str:
        """Model (adapters only for LoRA) + tokenizer in HF format, and the optimizer, lr schedule,
        step and entropy-bonus controller in ``policy_state.pt``; :meth:`load` restores all of it."""
        path = os.fspath(path)
        if world()[0] != 0:  # data-parallel: every rank holds rank 0's weights; rank 0 writes them
            return path
        os.makedirs(path, exist_ok=True)
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        torch.save({"optimizer": self.optimizer.state_dict(), "lr_scheduler": self.lr_scheduler.state_dict(),
                    "step": self.step,
                    "entropy_control": self.entropy_bonus.state_dict() if self.entropy_bonus is not None else None},
                   os.path.join(path, _STATE_FILE))
        return path

    def load(self, path: str | os.PathLike[str]) -> None:
        """Restore what :meth:`save` wrote into this policy (same architecture, same LoRA layout).
        Data-parallel ranks: rank 0 reads the checkpoint and the others receive it from rank 0 (a
        path only rank 0 sees is enough); a checkpoint rank 0 refuses fails every rank alike."""
        path = os.fspath(path)
        rank, ranks = world()
        if ranks == 1:
            state = self._read_checkpoint(path)
        else:
            state, error = None, None
            if rank == 0:
                try:
                    state = self._read_checkpoint(path, map_location="cpu")
                except ConfigError as exc:
                    error = str(exc)
            error = broadcast_object(error)
            if error is not None:
                raise ConfigError(error)
            broadcast_module(self.model)
            state = broadcast_object(state)
        if state is not None:
            self.optimizer.load_state_dict(state["optimizer"])
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])
            self.step = int(state["step"])
            if self.entropy_bonus is not None and self.entropy_bonus.adaptive and state.get("entropy_control") is not None:
                self.entropy_bonus.load_state_dict(state["entropy_control"])

    def _read_checkpoint(self, path: str, map_location: Any = None) -> dict[str, Any] | None:
        """Load ``path``'s weights into the module; its optimizer state etc. (``None`` when absent)."""
        if not os.path.isdir(path):
            raise ConfigError(f"Policy.load: {path} is not a directory written by Policy.save")
        if is_peft_model(self.model):
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            set_peft_model_state_dict(self.model, load_file(os.path.join(path, "adapter_model.safetensors")))
        else:
            _load_full(base_model(self.model), path)
        state_path = os.path.join(path, _STATE_FILE)
        if not os.path.exists(state_path):
            return None
        try:  # tensors and plain data only: a pickle from a checkpoint someone hands you runs no code
            return torch.load(state_path, map_location=map_location or self.device, weights_only=True)
        except Exception as exc:  # noqa: BLE001 - the unpickler refused a non-plain object
            raise ConfigError(
                f"Policy.load: {state_path} holds something other than tensors and plain data "
                f"({str(exc).splitlines()[0][:160]}); refusing to load it — load the weights from a "
                "checkpoint Policy.save wrote, or delete that file to start the optimizer afresh"
            ) from None

    def _reference(self, reference: Any) -> Any:
        """The frozen reference for the KL term (see the ``reference`` argument)."""
        if reference is None:
            return None
        if isinstance(reference, str) and reference == "auto":
            from ..training.components import reference_model

            beta = float(self.loss_options.get("beta", 0.0) or 0.0)
            return reference_model(self.model, types.SimpleNamespace(beta=beta))
        if isinstance(reference, torch.nn.Module):
            reference.eval()
            for p in reference.parameters():
                p.requires_grad_(False)
            return reference
        raise ConfigError(f"Policy reference must be 'auto', None or a module, got {type(reference).__name__}")


def _is_lora_config(lora: Any) -> bool:
    return type(lora).__name__.endswith("Config") and hasattr(lora, "peft_type")


def _lora_args(lora: Any) -> Any:
    opts = dict(lora) if isinstance(lora, dict) else {}
    return types.SimpleNamespace(use_peft=True, lora_r=opts.get("r", 16), lora_alpha=opts.get("lora_alpha", 32),
                                 lora_dropout=opts.get("lora_dropout", 0.05),
                                 lora_target_modules=opts.get("target_modules"))


def _adamw(model: Any, lr: float, weight_decay: float, betas: tuple[float, float], eps: float) -> Any:
    """AdamW over the trainable parameters, biases and norm weights without decay (transformers'
    ``Trainer.create_optimizer`` grouping, so a Policy and the trainer take the same steps)."""
    from transformers import Trainer

    decay = set(Trainer.get_decay_parameter_names(None, model))  # uses no trainer state
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in named if n in decay], "weight_decay": weight_decay},
        {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
    ]
    params = [g for g in groups if g["params"]]
    try:  # fused, as GRPOTrainer's default ``optim`` (adamw_torch_fused) builds it
        return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, fused=True)
    except (RuntimeError, TypeError, ValueError):  # a device/dtype the fused kernel does not cover
        return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps)


def _load_full(model: Any, path: str) -> None:
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        from transformers.modeling_utils import load_sharded_checkpoint

        load_sharded_checkpoint(model, path, strict=False)
        return
    from safetensors.torch import load_file

    file = os.path.join(path, "model.safetensors")
    if not os.path.exists(file):
        raise ConfigError(f"Policy.load: {path} has no model.safetensors; was it written by Policy.save?")
    missing, unexpected = model.load_state_dict(load_file(file), strict=False)
    tied = {n for n in missing if "lm_head" in n}
    if unexpected or set(missing) - tied:
        raise ConfigError(f"Policy.load: {path} does not fit this model (missing {sorted(set(missing) - tied)[:3]}, "
                          f"unexpected {sorted(unexpected)[:3]})")
