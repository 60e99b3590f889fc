"""Building a run's parts from its config: model (+LoRA), tokenizer, reference model, sampler,
scheduler, rewards and the advantage estimator. Kept apart from the trainer so the trainer reads
as the training loop and nothing else."""

from __future__ import annotations

import contextlib

import copy
import inspect
from typing import Any, Callable, Sequence

from ..plugins import get as get_component
from ..chat_template import check_vocabulary
from ..errors import ConfigError, MissingDependencyError
from ..gguf import is_gguf, resolve_model
from ..rewards import Reward, as_reward
from ..rollout.options import factory_parameters, json_object
from ..rollout.scheduler import build_scheduler
from ..types import SamplingParams
from ..sampling.weight_export import base_model, shares_module  # noqa: F401 - shares_module: re-exported for older imports
from .config import GRPOConfig


def load_model(model: Any, args: GRPOConfig, quantization_config: Any = None) -> Any:
    """A causal LM from a path / hub id (with TRL's ``model_init_kwargs``, ``trust_remote_code``
    and ``quantization_config``), or the given module as is."""
    if isinstance(model, str):
        from transformers import AutoModelForCausalLM

        model = resolve_model(model)  # a .gguf file: its converted float32 directory
        kwargs: dict[str, Any] = {"dtype": "auto", **(args.model_init_kwargs or {})}
        kwargs.setdefault("trust_remote_code", args.trust_remote_code)
        if quantization_config is not None:
            if "quantization_config" in kwargs:
                raise ConfigError("quantization_config is given both to the trainer and in model_init_kwargs; give it once")
            kwargs["quantization_config"] = quantization_config
        if _is_adapter_dir(model):  # a LoRA run's output: train its adapters further, as a PEFT model
            try:
                from peft import AutoPeftModelForCausalLM
            except ImportError as exc:  # pragma: no cover - peft is a test dependency
                raise MissingDependencyError(f"{model} is a LoRA adapter; loading it needs peft: pip install 'rlcore[peft]'") from exc
            if args.use_peft:
                raise ConfigError(f"{model} is already a LoRA adapter (it is trained further as it is); drop --use_peft")
            with _quiet_peft():
                model = from_pretrained(AutoPeftModelForCausalLM, model, "LoRA adapter", is_trainable=True, **kwargs)
        else:
            model = from_pretrained(AutoModelForCausalLM, model, "model", **kwargs)
    elif quantization_config is not None or args.model_init_kwargs:
        raise ConfigError("quantization_config / model_init_kwargs apply when the model is a path; "
                          "this model is already loaded (load it with those options yourself)")
    if args.disable_dropout:
        disable_dropout(model)
    return model


def _is_adapter_dir(path: str) -> bool:
    import os

    path = os.path.expanduser(path)
    return os.path.isfile(os.path.join(path, "adapter_config.json")) and not os.path.isfile(os.path.join(path, "config.json"))


def check_model_dir(path: str) -> None:
    """A local directory given as a model must be one ``save_pretrained`` wrote: without its
    ``config.json`` transformers fails deep inside the tokenizer or config loader instead."""
    import os

    path = os.path.expanduser(str(path))
    if is_gguf(path):
        if not os.path.isfile(path):
            raise ConfigError(f"GGUF file {path} does not exist; pass an existing .gguf file, a model directory or a Hugging Face id")
        return
    saved = ("config.json", "adapter_config.json")  # a model, or a LoRA adapter (transformers loads its base)
    if os.path.isdir(path) and not any(os.path.isfile(os.path.join(path, name)) for name in saved):
        raise ConfigError(f"model directory {path} has no config.json (nor adapter_config.json), so it is not a saved "
                          "transformers model; pass a directory written by save_pretrained (or a checkpoint-N "
                          "directory) or a Hugging Face id")


def check_model_path(model: str) -> None:
    """What a command checks before anything loads: a path (``./…``, ``/…``, ``~…``) must exist and
    be a saved model; anything else is a Hugging Face id."""
    import os

    if model.startswith((".", "/", "~")) and not os.path.exists(os.path.expanduser(model)):
        raise ConfigError(f"model path {model} does not exist; pass an existing directory or a Hugging Face id")
    check_model_dir(model)


def from_pretrained(loader: Any, path: Any, what: str, **kwargs: Any) -> Any:
    """``loader.from_pretrained(path)`` with the failures a user causes (a path that is not a model,
    a hub id that is neither cached nor reachable) as one :class:`ConfigError` line naming it."""
    check_model_dir(path)
    path = resolve_model(path)
    try:
        return loader.from_pretrained(path, **kwargs)
    except (OSError, ValueError) as exc:
        reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise ConfigError(f"cannot load the {what} of {str(path)!r}: {reason} — pass a local model directory or a "
                          "Hugging Face id that is cached (HF_HUB_OFFLINE=1) or reachable") from exc


def disable_dropout(model: Any) -> None:
    """Every dropout probability to 0 (TRL's ``disable_dropout``): the logprobs of the policy
    then do not depend on a dropout draw."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


def load_tokenizer(model: Any, processing_class: Any) -> Any:
    if processing_class is not None:
        return processing_class
    from transformers import AutoTokenizer

    path = model if isinstance(model, str) else getattr(getattr(model, "config", None), "_name_or_path", None)
    if not path:
        raise ConfigError("pass processing_class= (the tokenizer): the model has no path to load one from")
    tok = check_vocabulary(from_pretrained(AutoTokenizer, path, "tokenizer"), path, "or, in Python, pass processing_class=")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def apply_peft(model: Any, args: GRPOConfig, peft_config: Any = None) -> Any:
    """Wrap ``model`` with LoRA adapters when asked (``use_peft`` or an explicit ``peft_config``)."""
    if peft_config is None and not args.use_peft:
        return model
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:  # pragma: no cover - peft is a test dependency
        raise MissingDependencyError("LoRA needs peft: pip install 'rlcore[peft]'") from exc
    if peft_config is None:
        peft_config = LoraConfig(
            r=args.lora_r,
            lora_alpha=args.lora_alpha,
            lora_dropout=args.lora_dropout,
            target_modules=args.lora_target_modules or "all-linear",
            task_type="CAUSAL_LM",
        )
    with _quiet_peft():
        return get_peft_model(model, peft_config)


@contextlib.contextmanager
def _quiet_peft() -> Any:
    """peft reads transformers' deprecated ``is_gradient_checkpointing`` when it wraps a model: a
    FutureWarning on every ``--use_peft`` run (and every load of a LoRA run's output) that no user can
    act on — peft's call, not theirs. Only that warning is silenced."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def reference_model(model: Any, args: GRPOConfig) -> Any:
    """A frozen copy for the KL term; none when beta is 0, and none for LoRA (the base model with
    adapters disabled is the reference)."""
    if args.beta == 0.0 or hasattr(model, "disable_adapter"):
        return None
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def teacher_model(model: Any, args: GRPOConfig) -> Any:
    """The frozen on-policy distillation teacher ``args.teacher_model`` (a path, hub id, .gguf file or
    module), loaded once like the policy (``model_init_kwargs``, ``trust_remote_code``); ``None``
    without one. Its output vocabulary must be the policy's: the two score the same token ids."""
    source = getattr(args, "teacher_model", None)
    if source is None:
        return None
    kwargs: dict[str, Any] = {"dtype": "auto", "trust_remote_code": args.trust_remote_code, **(args.model_init_kwargs or {})}
    kwargs.pop("quantization_config", None)  # the policy's; the teacher loads in its own dtype
    teacher = source if not isinstance(source, str) else \
        from_pretrained(_auto_lm(), resolve_model(source), "teacher_model", **kwargs)
    ours, theirs = _vocab_size(model), _vocab_size(teacher)
    if ours != theirs:
        raise ConfigError(f"teacher_model {source if isinstance(source, str) else type(source).__name__!r} has a vocabulary "
                          f"of {theirs} tokens, the policy {ours}: on-policy distillation scores the same token ids — "
                          "use a teacher with the policy's tokenizer")
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


def _auto_lm() -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM


def _vocab_size(model: Any) -> int:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.vocab_size)


#: TRL/transformers generation_kwargs names -> SamplingParams fields
_GEN_ALIASES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "stop_strings": "stop",
                "eos_token_id": "stop_token_ids"}


def sampling_params(args: GRPOConfig) -> SamplingParams:
    """What every backend samples with; ``generation_kwargs`` override any field by name."""
    params = SamplingParams(
        max_tokens=args.max_completion_length,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p or 0.0,
        repetition_penalty=args.repetition_penalty,
    )
    extra = dict(getattr(args, "generation_kwargs", None) or {})
    if not extra:
        return params
    import attrs

    known = {f.name for f in attrs.fields(SamplingParams)}
    changes: dict[str, Any] = {}
    for key, value in extra.items():
        name = _GEN_ALIASES.get(key, key)
        if name not in known:
            raise ConfigError(f"generation_kwargs[{key!r}] is not a sampling setting rlcore's samplers share; "
                              f"use one of {', '.join(sorted(known | set(_GEN_ALIASES)))}")
        if name in ("stop", "stop_token_ids") and not isinstance(value, (list, tuple)):
            value = [value]
        changes[name] = value
    return params.replace(**changes)


def make_sampler(args: GRPOConfig, model: Any, tokenizer: Any, sampler: Any = None) -> Any:
    """The generation backend. A sampler class that declares ``shares_trainer_module`` (``hf``) gets
    the trainer's own module: colocated, no copy, no sync; any other gets the model's path."""
    if sampler is not None:
        return sampler
    from ..sampling import make_sampler as build_sampler

    opts = dict(args.sampler_options or {})
    if getattr(get_component("sampler", args.sampler), "shares_trainer_module", False):
        opts.setdefault("seed", args.seed)
        return build_sampler(args.sampler, model=model, tokenizer=tokenizer, **opts)
    path = getattr(getattr(base_model(model), "config", None), "_name_or_path", None)
    return build_sampler(args.sampler, model=path, tokenizer=tokenizer, **opts)


def check_sleeps(sampler: Any) -> None:
    """``sleep_sampler=True`` needs a sampler with ``sleep(level)`` and ``wake_up()``."""
    missing = [m for m in ("sleep", "wake_up") if not callable(getattr(sampler, m, None))]
    if missing:
        raise ConfigError(f"sleep_sampler=True, but the sampler {type(sampler).__name__} has no {' or '.join(missing)}(); "
                          "give it sleep(level)/wake_up() (rlcore.sampling.Sampler has no-op ones) or set sleep_sampler=False")


def make_scheduler(args: GRPOConfig, sampler: Any, tokenizer: Any, scheduler: Any = None) -> Any:
    """The rollout scheduler, with its options as keyword arguments. ``env_options`` are the env's:
    under an env scheduler, the keys the scheduler itself declares (``env_url`` …) stay its options
    and the rest reach the env through ``env_kwargs``; under any other scheduler they are scheduler
    options, as before."""
    if scheduler is not None and not isinstance(scheduler, str):
        if getattr(scheduler, "sampler", None) is None:
            scheduler.sampler = sampler
        if getattr(scheduler, "tokenizer", None) is None:  # the run's tokenizer (its chat template, its mode),
            scheduler.tokenizer = tokenizer  # not the sampler's: a remote pool's is the driver's plain copy
        return scheduler
    factory = get_component("scheduler", scheduler or args.scheduler)
    env_opts = _scheduler_env_options(factory, args.env_options or {})
    sched_opts = dict(args.scheduler_options or {})
    opts: dict[str, Any] = {**env_opts, **sched_opts}
    if "env_kwargs" in env_opts and "env_kwargs" in sched_opts:  # both name env options: the scheduler's win
        opts["env_kwargs"] = {**env_opts["env_kwargs"], **json_object(sched_opts["env_kwargs"], "env_kwargs")}
    if args.max_turns is not None:
        opts["max_turns"] = args.max_turns
    if "tool_parser" in factory_parameters(factory):  # tool schedulers: the run's tool_parser (scheduler_options win)
        opts.setdefault("tool_parser", args.tool_parser)
    return build_scheduler(factory, sampler, tokenizer, sampling_params=sampling_params(args), **opts)


def _scheduler_env_options(factory: Any, env_options: dict[str, Any]) -> dict[str, Any]:
    """``env_options`` as scheduler keyword arguments: under an env scheduler, the keys it does not
    declare itself are the env's own and go in ``env_kwargs``."""
    from ..rollout.env_scheduler import EnvScheduler

    if not (env_options and inspect.isclass(factory) and issubclass(factory, EnvScheduler)):
        return dict(env_options)
    declared = factory_parameters(factory)
    out = {k: v for k, v in env_options.items() if k in declared}
    to_env = {k: v for k, v in env_options.items() if k not in declared}
    if to_env:
        out["env_kwargs"] = {**to_env, **json_object(out.get("env_kwargs"), "env_kwargs")}
    return out


def build_reward(spec: Any, options: dict[str, Any] | None = None) -> Reward:
    """A registered reward name (a class gets ``options`` as keyword arguments), a function, or a
    :class:`Reward` object -> a Reward."""
    if isinstance(spec, str):
        factory = get_component("reward", spec)
        if options and inspect.isclass(factory):
            return as_reward(spec, factory(**options))
        return as_reward(spec, factory)
    if options:
        raise ConfigError("reward options apply to registered reward names only")
    return as_reward(getattr(spec, "name", None) or getattr(spec, "__name__", None) or type(spec).__name__, spec)


def make_rewards(args: GRPOConfig, reward_funcs: Sequence[Any] | None,
                 reward_processing_classes: Any = None, allow_none: bool = False) -> tuple[list[Reward], dict[str, float]]:
    """Reward objects (registered names from the config, plus functions/objects passed in, TRL
    style: functions, registered names, reward models or their paths) and the weight of each."""
    from ..rewards.models import RewardModel, is_reward_model, load_reward_model

    passed = list(reward_funcs or [])
    if reward_processing_classes is None:
        procs: list[Any] = [None] * len(passed)
    else:
        procs = list(reward_processing_classes) if isinstance(reward_processing_classes, (list, tuple)) else [reward_processing_classes]
        if len(procs) != len(passed):
            raise ConfigError(f"reward_processing_classes has {len(procs)} entries for {len(passed)} reward_funcs; give one per reward (None for functions)")
    rewards: list[Reward] = []
    for name in args.reward_funcs or []:
        rewards.append(build_reward(name, (args.reward_options or {}).get(name, {})))
    for fn, proc in zip(passed, procs):
        if isinstance(fn, str):
            if _registered(fn):
                rewards.append(as_reward(fn, get_component("reward", fn)))
            else:  # TRL: a string is a reward model's path or hub id
                rewards.append(RewardModel(load_reward_model(fn, args), proc))
        elif is_reward_model(fn):
            rewards.append(RewardModel(fn, proc))
        else:
            rewards.append(as_reward(getattr(fn, "__name__", None) or type(fn).__name__, fn))
    if not rewards and not allow_none:
        raise ConfigError("no reward: pass --reward NAME (see `rlcore components reward`) or reward_funcs=")
    names = [r.name for r in rewards]
    if len(set(names)) != len(names):
        raise ConfigError(f"two rewards share a name ({', '.join(names)}); names label metrics and weights")
    weights = args.reward_weights or [1.0] * len(rewards)
    if len(weights) != len(rewards):
        raise ConfigError(f"reward_weights has {len(weights)} values for {len(rewards)} rewards; give one per reward")
    return rewards, dict(zip(names, map(float, weights)))


def _registered(name: str) -> bool:
    from ..errors import UnknownComponentError

    try:
        get_component("reward", name)
    except UnknownComponentError:
        return False
    return True


def make_advantage(args: GRPOConfig) -> Any:
    """The advantage estimator, built with the run's config and its ``advantage_options``."""
    factory: Callable[..., Any] = get_component("advantage", args.advantage)
    return factory(config=args, **(getattr(args, "advantage_options", None) or {}))
