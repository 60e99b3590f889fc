"""``rlcore train``: flags straight from :class:`GRPOConfig` (transformers' HfArgumentParser, as
TRL's CLI does), plus ``--config FILE.yaml|toml``, ``--model``, ``--dataset``, ``--reward NAME``
(repeatable) and component options as flags (``--env-url X`` reaches whichever of the run's
scheduler, sampler, env, loss, advantage estimator or reward classes declares ``env_url``).

With no arguments it trains the built-in tiny model on the built-in ``digits`` task on the CPU
(see :mod:`rlcore.data.tasks`). Every check — flags, names, dataset columns — runs before any model
is loaded, and a problem is one line.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any, Sequence

import click

from ..errors import ConfigError

#: flags handled here rather than by GRPOConfig
SCRIPT_FLAGS = {
    "config": "YAML/TOML file of GRPOConfig values (flags override it)",
    "model": "HF model id, local path or .gguf file [default: the built-in tiny model]",
    "dataset": ".jsonl/.json/.parquet file, datasets name, or SOURCE:SPEC?key=value of a dataset source [default: the built-in digits task]",
    "dataset_split": "split of a datasets name [default: train]",
    "eval_dataset": "evaluation set, read like --dataset (FILE, datasets name or SOURCE:SPEC); evaluated per --eval_strategy steps|epoch, which needs it",
    "eval_dataset_split": "split of an --eval-dataset datasets name [default: test]",
    "dataset_options": "options for a dataset source (SOURCE:SPEC), key=value,key=value or JSON, e.g. size=2000,seed=3",
    "prompt_column": "column holding the prompt when it is not prompt/messages/question",
    "system_prompt": "system message prepended to every prompt",
    "reward": "reward name (repeatable; NAME=WEIGHT sets its weight): `rlcore components reward`",
}


def register(cli: Any) -> None:
    cli.add_command(train_command)


@click.command(
    name="train",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
)
@click.pass_context
def train_command(ctx: click.Context) -> None:
    """Train with GRPO. No arguments: the built-in tiny model learns the built-in task on the CPU.
    `rlcore train --help` shows the run options and the fields most runs set; `--help-all` every flag."""
    argv = list(ctx.args)
    if "--help-all" in argv:
        click.echo(help_text(full=True))
        return
    if "-h" in argv or "--help" in argv:
        click.echo(help_text())
        return
    from .distributed import run_distributed_plan, split_distributed_flags

    distributed, argv = split_distributed_flags(argv)
    plan = build_plan(argv)
    if distributed is not None and (plan.eval_rows is not None or _evaluates(plan.args)):
        raise ConfigError("distributed training (--distributed) does not evaluate: drop --eval-dataset and --eval_strategy")
    if distributed is not None:
        for note in plan.notes:
            click.echo(f"⚠ {note}", err=True)
        apply_component_options(plan.args, plan.component_options)  # here, so distributed.cli needs nothing of this module
        run_distributed_plan(plan, distributed)
        return
    run_plan(plan)


# --- parsing ---------------------------------------------------------------------------------------
def _parser() -> Any:
    from transformers import HfArgumentParser

    from ..training.config import GRPOConfig

    # allow_abbrev=False: plugin flags such as --env must not be read as a prefix of --env_options
    parser = HfArgumentParser(GRPOConfig, prog="rlcore train", allow_abbrev=False)

    def error(message: str) -> None:
        raise ConfigError(message.splitlines()[0])

    parser.error = error  # type: ignore[method-assign]
    return parser


#: what ``rlcore train --help`` shows first: rlcore's run options and the GRPOConfig fields most runs
#: set, grouped (``--help-all`` adds every other field). Entries: (flag, metavar, what).
HELP_GROUPS: dict[str, list[tuple[str, str, str]]] = {
    "model & data": [
        ("model", "ID|DIR|FILE.gguf", SCRIPT_FLAGS["model"]),
        ("dataset", "FILE|NAME|SOURCE:SPEC", SCRIPT_FLAGS["dataset"]),
        ("prompt_column", "NAME", SCRIPT_FLAGS["prompt_column"]),
        ("system_prompt", "TEXT", SCRIPT_FLAGS["system_prompt"]),
        ("max_prompt_length", "N", "prompts longer than this keep their last N tokens"),
    ],
    "rewards": [
        ("reward", "NAME[=WEIGHT]", SCRIPT_FLAGS["reward"]),
        ("scale_rewards", "group|batch|none", "how advantages are scaled"),
    ],
    "generation": [
        ("num_generations", "N", "completions per prompt (the group GRPO compares)"),
        ("max_completion_length", "N", "most tokens sampled per completion (per assistant turn)"),
        ("temperature", "T", "sampling temperature"),
        ("scheduler", "NAME", "rollout scheduler: default, multi_turn, env_scheduler, a plugin's (`rlcore components scheduler`)"),
        ("max_turns", "N", "turns per episode (multi-turn schedulers)"),
        ("sampler", "NAME", "generation backend: hf, vllm, openai (alias vllm_server)"),
    ],
    "optimisation": [
        ("learning_rate", "LR", "AdamW learning rate"),
        ("loss_type", "NAME", "grpo, bnpo, dr_grpo, dapo, gspo, cispo, sapo, … (`rlcore components loss`)"),
        ("beta", "B", "KL coefficient to the reference model (0: no reference model)"),
        ("per_device_train_batch_size", "N", "completions per micro-batch"),
        ("gradient_accumulation_steps", "N", "micro-batches per optimizer step"),
        ("max_steps", "N", "optimizer steps to run (-1: num_train_epochs over the dataset)"),
        ("use_peft", "BOOL", "train LoRA adapters instead of every weight"),
        ("bf16", "BOOL", "bf16 mixed precision (default: on where a GPU supports it)"),
    ],
    "output": [
        ("output_dir", "DIR", "where checkpoints, metrics.jsonl and plots go"),
        ("save_steps", "N", "write a checkpoint every N steps (turns saving on)"),
        ("resume_from_checkpoint", "true|DIR", "continue a run: its newest checkpoint (true) or the one named"),
        ("log_completions", "BOOL", "append every prompt, completion and reward to OUTPUT_DIR/completions.jsonl"),
        ("report_to", "NAME", "also log to wandb, tensorboard, …"),
    ],
}


def _default_of(name: str) -> str:
    """GRPOConfig's default of ``name``, and the built-in task's when its recipe sets another."""
    from ..data.tasks import DEFAULT_TRAIN_CONFIG
    from ..training.config import GRPOConfig

    field = GRPOConfig.__dataclass_fields__.get(name)
    if field is None:
        return ""
    value = field.default if field.default is not dataclasses.MISSING else None
    value = getattr(value, "value", value)
    shown = "" if value is None else f"default: {value}"
    task = DEFAULT_TRAIN_CONFIG.get(name)
    if task is not None and task != value and name != "output_dir":
        shown += ("; " if shown else "") + f"built-in task: {task}"
    return f" [{shown}]" if shown else ""


def help_text(full: bool = False) -> str:
    """``rlcore train --help``: the run options and the fields most runs set, grouped; ``full``
    (``--help-all``) adds every GRPOConfig field. Why not argparse's help alone: it listed all
    ~220 fields alphabetically over 1,000 lines, with ``--model`` and ``--dataset`` at line 1,058."""
    from ..training.config import GRPOConfig

    n_fields = len(dataclasses.fields(GRPOConfig))
    lines = [
        "Usage: rlcore train [--config FILE] [--model M] [--dataset D] [--reward NAME ...] [--FIELD VALUE ...]",
        "",
        "  Train with GRPO. No arguments: the built-in tiny model learns the built-in digits task on the CPU.",
        "  Every GRPOConfig field is a flag (--num-generations and --num_generations both work).",
        "",
        "run options:",
    ]
    width = 36

    def entry(flag: str, text: str) -> str:
        return f"{flag:<{width}}{text}" if len(flag) < width else f"{flag}\n{' ' * width}{text}"

    lines.append(entry("  --config FILE", SCRIPT_FLAGS["config"]))
    lines.append(entry("  --help-all", f"every flag: the options below, then all {n_fields} GRPOConfig fields"))
    for group, entries in HELP_GROUPS.items():
        lines += ["", f"{group}:"]
        for name, metavar, text in entries:
            flag = f"  --{name.replace('_', '-') if name in SCRIPT_FLAGS else name} {metavar}"
            lines.append(entry(flag, text + _default_of(name)))
    shown = {name for entries in HELP_GROUPS.values() for name, _, _ in entries}
    rest = [name for name in SCRIPT_FLAGS if name not in shown and name != "config"]
    lines += ["", "more rlcore options:"]
    for name in rest:
        lines.append(entry(f"  --{name.replace('_', '-')} VALUE", SCRIPT_FLAGS[name]))
    lines.append("  component options: any --flag the run's scheduler, sampler, env, loss, advantage estimator or reward\n"
                 "  class declares (e.g. --env-url, --max-env-calls, gigpo's --gamma); see `rlcore components KIND NAME`")
    from .distributed import help_lines

    lines += [""] + help_lines()
    if not full:
        lines += ["", f"The other {n_fields - len(shown & set(GRPOConfig.__dataclass_fields__))} GRPOConfig fields "
                      "(losses, clipping, KL, vLLM, evaluation, checkpoints, logging …): rlcore train --help-all"]
        return "\n".join(lines) + "\n"
    every = _parser().format_help()
    every = every[every.find("\n\n") + 2:] if "\n\n" in every else every  # argparse's 200-line usage block left out
    every = every.replace("options:\n", "", 1).replace("  -h, --help            show this help message and exit\n", "", 1)
    lines += ["", f"every GRPOConfig field ({n_fields}):", every]
    return "\n".join(lines) + "\n"


def _read_config_file(path: str) -> dict[str, Any]:
    if not os.path.exists(path):
        raise ConfigError(f"config file {path} does not exist")
    ext = os.path.splitext(path)[1].lower()
    try:
        if ext in (".yaml", ".yml"):
            import yaml

            with open(path, encoding="utf-8") as f:
                data = yaml.safe_load(f) or {}
        elif ext == ".toml":
            import tomllib

            with open(path, "rb") as f:
                data = tomllib.load(f)
        else:
            raise ConfigError(f"config file {path}: use .yaml, .yml or .toml")
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - a malformed file is a user error
        raise ConfigError(f"config file {path} is not valid: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of option: value")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def _split_script_args(argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """Pull out rlcore's own flags (``--reward`` may repeat); the rest goes to HfArgumentParser."""
    script: dict[str, Any] = {"reward": []}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        key = name.replace("-", "_")
        if key in SCRIPT_FLAGS:
            if not eq:
                if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                    raise ConfigError(f"--{name} needs a value")
                value = argv[i + 1]
                i += 1
            if key == "reward":
                script["reward"].extend(v for v in value.split(",") if v)
            else:
                script[key] = value
        else:
            rest.append(arg)
        i += 1
    return script, rest


def _reward_weights(specs: Sequence[str]) -> dict[str, float]:
    """``{name: weight}`` for the ``--reward NAME=WEIGHT`` entries (plain names weigh 1)."""
    weights: dict[str, float] = {}
    for spec in specs:
        name, eq, w = spec.partition("=")
        if eq:
            try:
                weights[name] = float(w)
            except ValueError:
                raise ConfigError(f"--reward {spec!r}: the weight after '=' must be a number") from None
    return weights


@dataclasses.dataclass
class TrainPlan:
    """Everything decided before the model loads."""

    args: Any
    model: str
    rows: list[dict[str, Any]]
    task: str
    prompt_column: str | None
    system_prompt: str | None
    component_options: dict[str, dict[str, Any]]
    task_description: str = ""
    notes: list[str] = dataclasses.field(default_factory=list)  # settings changed on the way, said in the header
    eval_rows: list[dict[str, Any]] | None = None  # --eval-dataset's rows (checked like the training rows)


def build_plan(argv: Sequence[str]) -> TrainPlan:
    """Parse and validate everything (no model load). Raises ConfigError/DatasetError/UnknownComponentError."""
    from ..data.tasks import default_task_for
    from ..training.config import GRPOConfig, validate_components

    script, rest = _split_script_args(argv)
    file_values: dict[str, Any] = {}
    if script.get("config"):
        file_values = _read_config_file(script["config"])
        for key in list(file_values):
            if key in SCRIPT_FLAGS:
                v = file_values.pop(key)
                if key == "reward":
                    script["reward"] = list(v if isinstance(v, list) else [v]) + script["reward"]
                else:
                    script.setdefault(key, v)
    default_task = not script.get("dataset")
    # no dataset: the chosen scheduler's embedded default (digits for single-turn schedulers)
    embedded = default_task_for(_scheduler_factory(rest, file_values)) if default_task else None
    defaults: dict[str, Any] = embedded.config(tiny_model=script.get("model") is None) if embedded else {}
    field_names = {f.name for f in dataclasses.fields(GRPOConfig)}
    plugin_from_file = {k: v for k, v in file_values.items() if k not in field_names}
    defaults.update({k: v for k, v in file_values.items() if k in field_names})

    parser = _parser()
    parser.set_defaults(**defaults)
    (args_ns, leftover) = parser.parse_known_args(list(rest))
    # rebuild through the dataclass so __post_init__ runs its checks
    values = {k: v for k, v in vars(args_ns).items() if k in field_names}
    given_weights = _reward_weights(script["reward"])  # --reward NAME=WEIGHT, as in rlcore rollout
    script["reward"] = [spec.partition("=")[0] for spec in script["reward"]]
    if script["reward"]:
        values["reward_funcs"] = list(dict.fromkeys((values.get("reward_funcs") or []) + script["reward"])) \
            if not default_task else list(dict.fromkeys(script["reward"]))
    if given_weights:
        if "reward_weights" in file_values or any(a.split("=")[0] in ("--reward_weights", "--reward-weights") for a in rest):
            raise ConfigError("give reward weights either as --reward NAME=WEIGHT or with reward_weights, not both")
        values["reward_weights"] = [given_weights.get(n, 1.0) for n in values["reward_funcs"]]
    if values.get("output_dir") is None:
        values["output_dir"] = "rlcore-output"
    from ..training import checkpoint as ckpt

    def named(key: str) -> bool:
        """Whether the user set ``key`` (a flag, either spelling, or the config file)."""
        flags = (f"--{key}", f"--{key.replace('_', '-')}")
        return key in file_values or any(a.split("=")[0] in flags for a in rest)

    # before anything loads or is written: a resume names a checkpoint that exists, is intact and is this run's
    # (and no other live run, nor a symbolic link, is in the directory it continues)
    asked = values.get("resume_from_checkpoint")
    if asked not in (None, False) and str(asked).strip().lower() not in ckpt.RESUME_NONE:
        ckpt.check_not_in_use(str(values["output_dir"]))
        ckpt.check_no_links(str(values["output_dir"]))
    resume = ckpt.resolve_resume(values.get("resume_from_checkpoint"), str(values["output_dir"]),
                                 str(values.get("resume_without_optimizer_state")).lower() in ("true", "1", "yes"))
    values["resume_from_checkpoint"] = resume
    save_named = [k for k in ("save_steps", "save_total_limit", "save_only_model") if named(k)]
    if str(getattr(values.get("save_strategy"), "value", values.get("save_strategy"))).lower() == "no" \
            and not named("save_strategy"):
        if save_named:  # --save-steps 2 under a recipe that saves nothing: the user asked for checkpoints
            values["save_strategy"] = "steps"
        elif resume:  # a resumed run keeps saving as the run it continues did
            saved_every = _saved_every(resume)
            if saved_every:
                values["save_strategy"], values["save_steps"] = "steps", saved_every
    notes = _bf16_fallback(values)
    try:
        args = GRPOConfig(**values)
    except (ValueError, TypeError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(str(exc).splitlines()[0]) from None
    validate_components(args)
    if not args.resume_from_checkpoint:  # before the model loads: never train into another run's directory
        if not named("output_dir") and not args.overwrite_output_dir:
            args.output_dir = ckpt.next_free_dir(args.output_dir)  # the default dir is taken: rlcore-output/digits-2 …
        ckpt.check_not_in_use(args.output_dir)  # --overwrite_output_dir never deletes a live run's files
        ckpt.check_no_links(args.output_dir)
        ckpt.check_fresh_output_dir(args.output_dir, args.overwrite_output_dir)
    component_options = _plugin_options(args, leftover, plugin_from_file)
    if embedded is not None and embedded.scheduler_options:
        # the task's scheduler options sit under everything the user said (flags, file, env_options)
        user = {**(args.env_options or {}), **(args.scheduler_options or {}), **component_options["scheduler"]}
        component_options["scheduler"] = {
            **{k: v for k, v in embedded.scheduler_options.items() if k not in user}, **component_options["scheduler"]
        }

    model = script.get("model")
    if model is None:
        from ..data.demo import tiny_model_path

        model = tiny_model_path()
    else:
        from ..training.components import check_model_path

        check_model_path(model)  # a missing path or a directory that is not a saved model: one line, nothing loaded
    if embedded is not None:
        if script.get("dataset_options"):
            raise ConfigError("--dataset-options needs --dataset SOURCE:SPEC (a registered dataset source)")
        rows, task = list(embedded.rows), embedded.name
    else:
        from ..data import load_rows, parse_dataset_options

        rows = load_rows(script["dataset"], split=script.get("dataset_split") or "train",
                         options=parse_dataset_options(script.get("dataset_options")))
        task = str(script["dataset"])
    from ..data.cursor import check_columns

    eval_rows = _eval_rows(script, args, notes)  # an eval set, or a one-line refusal of an eval without one
    check_columns(rows, script.get("prompt_column"), f"dataset {task}")
    from ..plugins import get
    from ..rewards import check_reward_columns

    check_reward_columns([(n, get("reward", n)) for n in args.reward_funcs or []], rows, f"dataset {task}")
    if eval_rows is not None:
        source = f"eval dataset {script['eval_dataset']}"
        check_columns(eval_rows, script.get("prompt_column"), source)
        check_reward_columns([(n, get("reward", n)) for n in args.reward_funcs or []], eval_rows, source)
    return TrainPlan(args, os.path.expanduser(model), rows, task, script.get("prompt_column"),
                     script.get("system_prompt"), component_options, _task_description(embedded, args), notes,
                     eval_rows)


def _evaluates(args: Any) -> bool:
    """Whether the run evaluates during training (``eval_strategy`` steps or epoch)."""
    return str(getattr(args.eval_strategy, "value", args.eval_strategy)) != "no"


def _eval_rows(script: dict[str, Any], args: Any, notes: list[str]) -> list[dict[str, Any]] | None:
    """``--eval-dataset``'s rows. Why here: ``--eval_strategy steps`` without an eval set failed with
    transformers' 40-line traceback after the model loaded, and the command line had no way to give one."""
    strategy = str(getattr(args.eval_strategy, "value", args.eval_strategy))
    if not script.get("eval_dataset"):
        if strategy != "no":
            raise ConfigError(f"--eval_strategy {strategy} evaluates on an eval set, and none was given: pass "
                              "--eval-dataset FILE|NAME (read like --dataset), or drop --eval_strategy")
        if script.get("eval_dataset_split"):
            raise ConfigError("--eval-dataset-split needs --eval-dataset NAME (a datasets name)")
        return None
    from ..data import load_rows

    rows = load_rows(script["eval_dataset"], split=script.get("eval_dataset_split") or "test")
    if strategy == "no":
        notes.append(f"--eval-dataset {script['eval_dataset']} is never evaluated: eval_strategy is no "
                     "(pass --eval_strategy steps --eval_steps N, or epoch)")
    return rows


def _bf16_fallback(values: dict[str, Any]) -> list[str]:
    """bf16 asked for (the GPU recipes' ``bf16: true``) where no device supports it: off, with a note.

    Why: transformers stops with ``Your setup doesn't support bf16/gpu. You need to assign use_cpu …``,
    which names neither the flag nor the fix, so the GSM8K config could not even be tried on a CPU."""
    asked = [k for k in ("bf16", "bf16_full_eval") if str(values.get(k)).lower() in ("true", "1")]
    if not asked or str(values.get("use_cpu")).lower() in ("true", "1"):
        return []
    from transformers.utils import is_torch_bf16_gpu_available, is_torch_xla_available

    if is_torch_bf16_gpu_available() or is_torch_xla_available():
        return []
    for k in asked:
        values[k] = False
    return [f"{' and '.join(asked)} is on, but this machine has no GPU that supports bf16: training in float32 "
            f"(pass {' '.join(f'--{k} false' for k in asked)} to say so)"]


def _saved_every(checkpoint_dir: str) -> int:
    """The ``save_steps`` of the run that wrote a checkpoint when it saved by steps, else 0."""
    import json

    try:
        with open(os.path.join(checkpoint_dir, "trainer_state.json"), encoding="utf-8") as f:
            return max(0, int(json.load(f).get("save_steps") or 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


def _task_description(embedded: Any, args: Any) -> str:
    """The embedded task's description, saying so when the run scores it with other rewards (its
    description names the task's own reward, which ``--reward`` replaced)."""
    if embedded is None:
        return ""
    own = list(embedded.task_config.get("reward_funcs") or [])
    chosen = list(args.reward_funcs or [])
    if not own or chosen == own:
        return embedded.description
    return f"{embedded.description} (its reward {', '.join(own)}; this run scores with {', '.join(chosen)})"


def _scheduler_factory(rest: Sequence[str], file_values: dict[str, Any]) -> Any:
    """The scheduler the run names (flag over config file over GRPOConfig's default), before parsing."""
    from ..plugins import get

    name: Any = file_values.get("scheduler")
    for i, arg in enumerate(rest):
        if arg == "--scheduler" and i + 1 < len(rest):
            name = rest[i + 1]
        elif arg.startswith("--scheduler="):
            name = arg.partition("=")[2]
    return get("scheduler", str(name or "default"))


#: the component kinds a run's leftover flags may reach (env: through its scheduler's env_kwargs)
OPTION_KINDS = ("scheduler", "sampler", "env", "reward", "loss", "advantage", "prompt_sampler")


def option_targets(args: Any, scheduler_options: dict[str, Any] | None = None) -> dict[str, tuple[str, str, Any]]:
    """label -> (kind, name, accepted parameters) for every component the run chose: its scheduler,
    sampler, loss, advantage estimator, each reward class, and the env an env scheduler is told to
    build (``env`` in the scheduler's options)."""
    from ..plugins import get
    from ..rollout.env_scheduler import chosen_env
    from ..rollout.options import component_parameters

    chosen = [("scheduler", args.scheduler), ("sampler", args.sampler), ("loss", args.effective_loss_type),
              ("advantage", args.advantage), ("prompt_sampler", args.prompt_sampler)] + \
        [("reward", name) for name in (args.reward_funcs or [])]
    env = chosen_env(get("scheduler", args.scheduler), scheduler_options or {})
    if env is not None:
        chosen.append(("env", env[0]))
    targets: dict[str, tuple[str, str, Any]] = {}
    for kind, name in chosen:
        factory = env[1] if kind == "env" and env is not None else get(kind, name)
        targets[f"{kind} {name!r}"] = (kind, name, component_parameters(kind, factory))
    return targets


def _plugin_options(args: Any, leftover: list[str], from_file: dict[str, Any]) -> dict[str, Any]:
    """Route leftover flags (and unknown config-file keys) to whichever chosen component declares
    them: ``{"scheduler": {...}, "sampler": {...}, "env": {...}, "loss": {...}, "advantage": {...},
    "reward": {name: {...}}}``."""
    out: dict[str, Any] = {kind: {} for kind in OPTION_KINDS}
    if not leftover and not from_file:
        return out
    from ..rollout.options import parse_flags, resolve_options

    flags = {**from_file, **(parse_flags(leftover) if leftover else {})}
    scheduler_flags = {**(args.env_options or {}), **(args.scheduler_options or {}), **flags}
    targets = option_targets(args, scheduler_flags)
    routed = resolve_options(flags, {label: params for label, (_, _, params) in targets.items()})
    for label, (kind, name, _) in targets.items():
        if kind == "reward":
            if routed[label]:
                out["reward"][name] = routed[label]
        else:
            out[kind] = routed[label]
    return out


def apply_component_options(args: Any, options: dict[str, Any]) -> None:
    """Merge a plan's routed options into the config's ``<kind>_options`` (flags win); an env's
    options reach it through its scheduler's ``env_kwargs``."""
    args.scheduler_options = {**(args.scheduler_options or {}), **options.get("scheduler", {})}
    if options.get("env"):
        kwargs = args.scheduler_options.get("env_kwargs") or {}
        from ..rollout.options import json_object

        args.scheduler_options["env_kwargs"] = {**json_object(kwargs, "env_kwargs"), **options["env"]}
    args.sampler_options = {**(args.sampler_options or {}), **options.get("sampler", {})}
    args.loss_options = {**(args.loss_options or {}), **options.get("loss", {})}
    args.advantage_options = {**(args.advantage_options or {}), **options.get("advantage", {})}
    args.prompt_sampler_options = {**(args.prompt_sampler_options or {}), **options.get("prompt_sampler", {})}
    if options.get("reward"):
        merged = dict(args.reward_options or {})
        for name, opts in options["reward"].items():
            merged[name] = {**(merged.get(name) or {}), **opts}
        args.reward_options = merged


# --- running ----------------------------------------------------------------------------------------
def run_plan(plan: TrainPlan) -> Any:
    """Load the model, train, print a summary. Returns the trainer."""
    from rich.console import Console

    console = Console(stderr=False)
    args = plan.args
    apply_component_options(args, plan.component_options)
    _header(console, plan)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    from ..trainer.grpo import GRPOTrainer

    from ..training.checkpoint import acquire_run_lock, release_run_lock

    started = time.perf_counter()
    trainer = GRPOTrainer(plan.model, args=args, train_dataset=plan.rows, eval_dataset=plan.eval_rows,
                          prompt_column=plan.prompt_column, system_prompt=plan.system_prompt)
    if int(getattr(trainer.scheduler_obj, "max_turns", 1) or 1) > 1:  # how the episodes become sequences
        console.print(f"multi-turn  {trainer.multi_turn_note}", markup=False, highlight=False)
    # one live run per directory, through training and the final save (taken once the model loaded:
    # a model that cannot load starts nothing; GRPOTrainer refused a live run's directory before that)
    acquire_run_lock(args.output_dir)
    interrupted = False
    second_interrupt_exits(args.output_dir)  # Ctrl-C stops cleanly; a second one while that waits ends it now
    try:
        trainer.train(resume_from_checkpoint=args.resume_from_checkpoint or None)  # a checked path (build_plan)
    except KeyboardInterrupt:
        interrupted = True
    except BaseException:
        restore_interrupts()
        raise
    if not interrupted and args.save_strategy != "no":
        trainer.save_model(args.output_dir)
    release_run_lock(args.output_dir)  # (an error above leaves it to the process's end, which follows)
    _summary(console, trainer, time.perf_counter() - started, interrupted)
    if interrupted:
        sys.exit(130)  # (the handler stays: a reward thread still running holds the exit up until it returns)
    restore_interrupts()
    return trainer


_INTERRUPTS: dict[str, Any] = {}


def second_interrupt_exits(output_dir: str) -> None:
    """Ctrl-C during ``rlcore train``: the first stops the run as before (KeyboardInterrupt: the
    summary, the resume hint, exit code 130), which waits for a *sync* reward or environment call
    that is running — Python cannot stop a thread. A second Ctrl-C ends the process at once with
    one line and exit code 130: what was written (metrics.jsonl lines, finished checkpoints) stays;
    a checkpoint cut short is a hidden ``.incomplete-checkpoint-*`` that resume removes.

    Installed only over Python's own handler in the main thread (an ignored SIGINT, an embedding
    application's handler are left alone); :func:`restore_interrupts` puts that back."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return
    count = [0]

    def on_interrupt(signum: int, frame: Any) -> None:
        count[0] += 1
        if count[0] == 1:
            _INTERRUPTS["interrupted"] = True
            sys.stderr.write("interrupted: stopping once the running step's reward or environment calls return — "
                             "press Ctrl-C again to exit at once\n")
            sys.stderr.flush()
            raise KeyboardInterrupt
        try:
            hint = resume_hint(output_dir)
        except Exception:  # noqa: BLE001 - the exit must not wait on a hint
            hint = f"the checkpoints in {output_dir} are kept"
        os.write(2, (f"\ninterrupted again: exiting now without waiting (exit code 130); metrics.jsonl and the "
                     f"checkpoints written so far are kept; resume: {hint}\n").encode("utf-8", "replace"))
        os._exit(130)

    _INTERRUPTS["previous"] = signal.signal(signal.SIGINT, on_interrupt)


def restore_interrupts() -> None:
    """Python's own Ctrl-C handler again (the run ended without an interrupt)."""
    import signal

    previous = _INTERRUPTS.pop("previous", None)
    if previous is not None and not _INTERRUPTS.pop("interrupted", False):
        signal.signal(signal.SIGINT, previous)


def _header(console: Any, plan: TrainPlan) -> None:
    from rich.panel import Panel

    a = plan.args
    lines = [
        f"[bold]model[/]     {plan.model}",
        f"[bold]task[/]      {plan.task} ({len(plan.rows)} prompts) · rewards: {', '.join(a.reward_funcs or [])}",
        *([f"[bold]about[/]     {plan.task_description}"] if plan.task_description else []),
        f"[bold]algorithm[/] loss {a.effective_loss_type} · advantage {a.advantage} · scheduler {a.scheduler} · sampler {a.sampler}",
        f"[bold]batch[/]     {_count(a.prompts_per_generation, 'prompt')} × {_count(a.num_generations, 'generation')} · "
        f"{_count(a.max_completion_length, 'token')} max{' per turn' if a.max_turns and a.max_turns > 1 else ''} · "
        f"{'up to ' + str(a.max_turns) + ' turns · ' if a.max_turns and a.max_turns > 1 else ''}"
        f"{_count(a.max_steps, 'step') if a.max_steps > 0 else _count(a.num_train_epochs, 'epoch')}",
        f"[bold]output[/]    {a.output_dir}",
        f"[bold]saves[/]     {_saves(a)}",
        *([f"[bold]resumes[/]   from {a.resume_from_checkpoint} (step {_resume_step(a)})"] if a.resume_from_checkpoint else []),
    ]
    console.print(Panel("\n".join(lines), title="rlcore train", expand=False))
    for note in plan.notes:
        console.print(f"⚠ {note}", style="yellow", markup=False, highlight=False)


def _count(n: Any, noun: str) -> str:
    """``1 step``, ``2 steps``, ``1.5 epochs``."""
    return f"{n:g} {noun}{'' if float(n) == 1 else 's'}" if isinstance(n, (int, float)) else f"{n} {noun}s"


def _saves(a: Any) -> str:
    """What the run will checkpoint, for the header (a run that saves nothing cannot be resumed)."""
    strategy = str(getattr(a.save_strategy, "value", a.save_strategy))
    if strategy == "no":
        return "no checkpoints (--save-steps N saves every N steps, so the run can be resumed)"
    steps = float(a.save_steps)
    every = (f"every {strategy}" if strategy != "steps" else f"every {steps:.0%} of the run" if steps < 1
             else "every step" if steps == 1 else f"every {steps:g} steps")
    keep = f", keeps the last {a.save_total_limit}" if a.save_total_limit else ""
    only = ", model only (no optimizer state: not resumable)" if a.save_only_model else ""
    return f"a checkpoint {every} ({a.output_dir}/checkpoint-N{keep}{only})"


def _resume_step(a: Any) -> str:
    from ..training.checkpoint import checkpoint_step

    step = checkpoint_step(a.resume_from_checkpoint)
    return f"{step} of {a.max_steps}" if a.max_steps and a.max_steps > 0 else str(step)


def _first_last(values: list[float]) -> tuple[float, float]:
    k = max(1, len(values) // 10)
    return sum(values[:k]) / k, sum(values[-k:]) / k


def episode_rows(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Summary lines about episodes, for runs whose scheduler steps environments (``env_steps``)."""
    env = [r for r in rows if r.get("env_steps") is not None]
    if not env:
        return []
    turns = [float(r["num_turns"]) for r in env if r.get("num_turns") is not None]
    out = []
    if turns:
        first, last = _first_last(turns)
        out.append(("turns per episode (first 10% → last 10%)", f"{first:.2f} → {last:.2f}"))
    out.append(("env steps", f"{int(sum(r['env_steps'] for r in env))} in {len(env)} steps"))
    ended = {k.split("/", 1)[1]: sum(r.get(k) or 0.0 for r in env) / len(env)
             for k in env[-1] if k.startswith("episodes_ended/")}
    if ended:
        names = {"env_done": "env done", "max_turns": "max_turns", "length": "length", "failed": "failed"}
        out.append(("episodes ended by", " · ".join(f"{names.get(k, k)} {v:.0%}" for k, v in ended.items())))
    stops = [r["turns_ended_by_stop"] for r in env if r.get("turns_ended_by_stop") is not None]
    if stops:
        out.append(("turns ended by stop", f"{sum(stops) / len(stops):.0%}"))
    return out


def _summary(console: Any, trainer: Any, wall: float, interrupted: bool) -> None:
    from rich.table import Table

    from ..training.metrics import read_jsonl

    rows = read_jsonl(trainer.args.output_dir)
    rewards = [r["reward"] for r in rows if r.get("reward") is not None]
    table = Table(title="interrupted" if interrupted else "done", show_header=False, expand=False)
    table.add_column("what", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_row("steps", str(trainer.state.global_step))
    if rewards:
        first, last = _first_last(rewards)
        table.add_row("reward (first 10% → last 10%)", f"{first:.3f} → {last:.3f}" + (f"  ({last / first:.1f}×)" if first > 0 else ""))
    for label, value in episode_rows(rows):
        table.add_row(label, value)
    from rich.text import Text

    from ..training.diagnosis import diagnose

    for line in diagnose(rows, trainer.args):  # why the run could not learn, one line each
        table.add_row(Text("⚠ why no learning" if line.startswith("no learning") else "⚠ warning", style="yellow"),
                      Text(line, style="yellow"))
    table.add_row("time", f"{wall:.0f}s")
    table.add_row("metrics", os.path.join(trainer.args.output_dir, "metrics.jsonl"))
    if trainer.plot_paths:
        table.add_row("plots", "\n".join(trainer.plot_paths))
    if interrupted:
        table.add_row("resume", resume_hint(trainer.args.output_dir))
    elif trainer.args.save_strategy != "no":
        table.add_row("model", trainer.args.output_dir)
    console.print(table)


def resume_hint(output_dir: str) -> str:
    """After Ctrl-C: the command that continues from the last checkpoint, or why there is none."""
    from transformers.trainer_utils import get_last_checkpoint

    last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
    if last is None:
        return ("no checkpoint was written (save_strategy no, or before the first save); "
                "pass --save-strategy steps --save-steps N to be able to resume")
    return (f"add --resume_from_checkpoint true --output-dir {output_dir} to the same command "
            f"(continues from {os.path.basename(last)})")
