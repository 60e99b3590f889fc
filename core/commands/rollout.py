"""``rlcore rollout``: run rollouts only (no training) and write one JSON object per trajectory.

Defaults make it work with no arguments: the built-in tiny model, the built-in arithmetic dataset,
the single-turn scheduler and the ``hf`` sampler. A scheduler with an embedded default
(``default_task()``, e.g. ``openenv_scheduler``, ``gym_scheduler``) brings its own prompts, per-turn
token cap, ``max_turns`` and scheduler options (stop strings …) when no ``--dataset`` is given.
Options a scheduler, sampler or env declares (its factory's keyword parameters) are accepted as
flags: ``--env-url X`` → ``env_url="X"``. The other options are ``rlcore train``'s names (TRL's),
in either spelling; rlcore 0.1's ``--max-tokens``/``--concurrency``/``--timeout``/``--split`` stay.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click

from ..chat_template import check_vocabulary
from ..errors import ConfigError, RunFailedError


def register(cli: Any) -> None:
    """Add the ``rollout`` and ``check-rollouts`` commands to the ``rlcore`` group."""
    cli.add_command(rollout_command)
    cli.add_command(check_rollouts_command)


def _flag(name: str, *aliases: str) -> tuple[str, ...]:
    """``--max-completion-length`` → both spellings (``--max_completion_length`` too, as ``rlcore
    train`` and TRL accept) plus rlcore 0.1's ``aliases`` (``--max-tokens``), then the option's key."""
    spellings = [f"--{name.replace('_', '-')}"]
    if "_" in name:
        spellings.append(f"--{name}")
    return (*spellings, *aliases, name)


#: ``rlcore rollout``'s rlcore 0.1 spellings -> the names it shares with ``rlcore train`` (TRL's)
OLD_ROLLOUT_NAMES = {"max_tokens": "max_completion_length", "concurrency": "rollout_concurrency",
                     "timeout": "rollout_timeout", "split": "dataset_split"}


@click.command(
    name="rollout",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
@click.option("--scheduler", default="default", show_default=True, help="Scheduler name (rlcore components scheduler).")
@click.option("--model", default=None, help="Model directory, hub id or .gguf file [default: the built-in tiny model].")
@click.option("--dataset", default=None, help=".jsonl/.json/.parquet file, datasets name, or SOURCE:SPEC?key=value of a dataset source [default: built-in arithmetic].")
@click.option(*_flag("dataset_options"), default=None, help="Options for a dataset source (SOURCE:SPEC): key=value,key=value or JSON.")
@click.option(*_flag("dataset_split", "--split"), default="train", show_default=True, help="Dataset split (datasets names).")
@click.option(*_flag("prompt_column"), default=None, help="Column holding the prompt when it is not messages/prompt/question.")
@click.option(*_flag("system_prompt"), default=None, help="System message prepended to every prompt.")
@click.option("--limit", type=int, default=8, show_default=True, help="Number of prompts (0: all).")
@click.option(*_flag("num_generations"), type=int, default=1, show_default=True, help="Trajectories per prompt.")
@click.option(*_flag("max_turns"), type=int, default=None, help="Turn limit [default: the scheduler's].")
@click.option(*_flag("max_completion_length", "--max-tokens"), type=int, default=None,
              help="Most tokens sampled per assistant turn [default: the scheduler's default task's, else 64].")
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option(*_flag("top_p"), type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=None, help="Sampling seed (per trajectory: seed + index).")
@click.option("--sampler", default="hf", show_default=True, help="Sampler backend name.")
@click.option("--reward", "rewards", multiple=True, help="Reward name, repeatable; NAME=WEIGHT sets a weight.")
@click.option(*_flag("rollout_concurrency", "--concurrency"), type=int, default=64, show_default=True, help="Trajectories in flight.")
@click.option(*_flag("rollout_timeout", "--timeout"), type=float, default=None, help="Seconds per trajectory before it fails.")
@click.option("--output", "-o", default="rollouts.jsonl", show_default=True,
              help="Output JSONL file, written as trajectories finish (flushed: an interrupted run keeps them).")
@click.option("--overwrite", is_flag=True, help="Replace an existing --output file (else: refused before the model loads).")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar.")
@click.option(*_flag("scheduler_options"), default=None, help="JSON object of scheduler options (merged under --flags).")
@click.option(*_flag("sampler_options"), default=None, help="JSON object of sampler options (merged under --flags).")
@click.option("--observer", "--observers", "observers", multiple=True, help="Installed observer plugin to run alongside (repeatable).")
@click.option(*_flag("chat_template"), default=None,
              help="A Jinja chat template file to render prompts and turns with instead of the tokenizer's own.")
@click.option(*_flag("multi_turn_mode"), type=click.Choice(["auto", "append", "per_turn"]), default="auto", show_default=True,
              help="How a multi-turn episode becomes sequences, as in training (docs/chat-templates.md).")
@click.option("--check/--no-check", default=True, show_default=True,
              help="Hold every trajectory to the rollout invariants (a violation fails it; see check-rollouts).")
@click.pass_context
def rollout_command(ctx: click.Context, **opts: Any) -> None:
    """Run rollouts with a scheduler and write trajectories as JSONL (no training).

    Extra --flags go to the scheduler, sampler, env (of an env scheduler) or reward class that
    declares them, e.g. --env-url, --env.
    """
    try:
        summary = asyncio.run(run_rollout_command(extra_args=list(ctx.args), **opts))
    except KeyboardInterrupt:  # Ctrl-C: run_rollout_command said what the file holds
        sys.exit(130)
    click.echo(summary, err=True)


def check_options(opts: dict[str, Any]) -> None:
    """Every numeric option, before anything loads: one line naming the flag."""
    def need(ok: bool, flag: str, rule: str) -> None:
        if not ok:
            raise ConfigError(f"{flag} must be {rule}, got {opts[flag.lstrip('-').replace('-', '_')]}")

    need(opts["num_generations"] >= 1, "--num-generations", "at least 1")
    need(opts["max_completion_length"] is None or opts["max_completion_length"] >= 1, "--max-completion-length", "at least 1")
    need(opts["limit"] >= 0, "--limit", "0 (all prompts) or a positive number of prompts")
    need(opts["rollout_concurrency"] >= 1, "--rollout-concurrency", "at least 1")
    need(opts["max_turns"] is None or opts["max_turns"] >= 1, "--max-turns", "at least 1")
    need(opts["rollout_timeout"] is None or opts["rollout_timeout"] > 0, "--rollout-timeout", "a positive number of seconds")
    need(opts["temperature"] >= 0, "--temperature", ">= 0")
    need(0 < opts["top_p"] <= 1, "--top-p", "in (0, 1]")


def check_output(output: str, overwrite: bool = False) -> Path:
    """The ``--output`` file, checked before anything loads: not a directory, in a directory that
    exists and takes files, not an existing file unless ``overwrite``. One line naming it otherwise."""
    import os
    import tempfile

    out = Path(output)
    where = f"--output {output}"
    if out.is_dir():
        raise ConfigError(f"{where} is a directory; name a file (e.g. {out / 'rollouts.jsonl'})")
    if out.exists():
        if out.is_file() and not overwrite:
            raise ConfigError(f"{where} already exists; pass --overwrite to replace it, or pick another --output")
        if not os.access(out, os.W_OK):
            raise ConfigError(f"{where} is not writable; pick another --output")
        return out
    parent = out.parent
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise ConfigError(f"{where}: {parent} {what}; create the directory or pick another --output")
    try:  # the real test (root ignores permission bits; read-only mounts, quotas): a file made and removed
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".rlcore-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot write in {parent} ({exc.strerror or exc}); pick another --output") from None
    return out


class _JsonlSink:
    """The ``--output`` file, one flushed line per finished trajectory; a failed write is one line."""

    def __init__(self, path: Path) -> None:
        self.path, self.written, self.opened, self._fh = path, 0, False, None

    def open(self) -> None:
        try:
            self._fh = open(self.path, "w", encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot write {self.path}: {exc.strerror or exc}; pick another --output") from None
        self.opened = True

    def write(self, trajectories: list[Any]) -> None:
        try:
            for t in trajectories:
                self._fh.write(t.to_json() + "\n")  # type: ignore[union-attr]
            self._fh.flush()  # type: ignore[union-attr]
        except OSError as exc:
            raise RunFailedError(
                f"cannot write {self.path}: {exc.strerror or exc} (after {self.written} trajectories); "
                "free space or pick another --output") from None
        self.written += len(trajectories)

    def close(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            try:
                fh.close()
            except OSError:  # its write already failed and said so; the lines flushed before are kept
                pass


async def run_rollout_command(*, extra_args: list[str], **opts: Any) -> str:
    """The command's work as a coroutine (tests call it in-process)."""
    from .. import plugins as registry

    for old, new in OLD_ROLLOUT_NAMES.items():  # callers written against rlcore 0.1's keyword names
        if old in opts:
            opts.setdefault(new, opts.pop(old))
    opts.setdefault("sampler_options", None)
    check_options(opts)
    from ..data import parse_dataset_options, row_to_prompt
    from ..plugins import RunHooks
    from ..rewards import as_reward, compute_rewards
    from ..types import SamplingParams
    from ..rollout.driver import run_rollouts, template_tools
    from ..rollout.scheduler import build_scheduler
    from ..rollout.env_scheduler import chosen_env
    from ..rollout.options import component_parameters, json_object, parse_flags, resolve_options

    scheduler_factory = registry.get("scheduler", opts["scheduler"])
    sampler_factory = registry.get("sampler", opts["sampler"])
    flags = parse_flags(extra_args)
    given_sched_opts = json_object(opts.get("scheduler_options"), "--scheduler-options")
    sched_label, sampler_label = f"scheduler {opts['scheduler']!r}", f"sampler {opts['sampler']!r}"
    labels: dict[str, Any] = {sched_label: scheduler_factory, sampler_label: sampler_factory}
    env = chosen_env(scheduler_factory, {**given_sched_opts, **flags})
    if env is not None:  # the env an env scheduler plays takes its own flags (through env_kwargs)
        labels[f"env {env[0]!r}"] = component_parameters("env", env[1])
    reward_names = list(dict.fromkeys(spec.partition("=")[0] for spec in opts["rewards"]))
    for name in reward_names:  # a Reward class's options are flags too (a reward function has none)
        labels[f"reward {name!r}"] = component_parameters("reward", registry.get("reward", name))
    routed = resolve_options(flags, labels)
    sched_opts, sampler_opts = routed[sched_label], routed[sampler_label]
    given_sampler_opts = json_object(opts.get("sampler_options"), "--sampler-options")
    if given_sampler_opts:  # checked like flags: a misspelt key is one line naming what the sampler accepts
        given_sampler_opts = resolve_options(given_sampler_opts, {sampler_label: sampler_factory})[sampler_label]
    sampler_opts = {**given_sampler_opts, **sampler_opts}
    if given_sched_opts:  # the same for the scheduler's: a key it does not declare is one line naming those it does
        given_sched_opts = resolve_options(
            given_sched_opts, {sched_label: component_parameters("scheduler", scheduler_factory)})[sched_label]
    sched_opts = {**given_sched_opts, **sched_opts}
    if isinstance(sched_opts.get("tool_parser"), str):  # a misspelt --tool-parser is one line before the model loads
        from ..rollout.tool_parsers import check_tool_parser_name

        check_tool_parser_name(sched_opts["tool_parser"])
    if env is not None and routed[f"env {env[0]!r}"]:
        sched_opts["env_kwargs"] = {**json_object(sched_opts.get("env_kwargs"), "env_kwargs"), **routed[f"env {env[0]!r}"]}
    reward_objs, weights = _rewards(opts["rewards"], registry, as_reward,
                                    {name: routed[f"reward {name!r}"] for name in reward_names})
    out = check_output(opts["output"], bool(opts.get("overwrite")))  # before the rows and the model load
    if opts.get("chat_template") and not Path(opts["chat_template"]).is_file():
        raise ConfigError(f"--chat-template {opts['chat_template']}: no such file; pass a Jinja chat template file")
    dataset: Any = opts["dataset"]
    from ..rollout.env_scheduler import EnvScheduler

    own_default = callable(getattr(scheduler_factory, "default_task", None)) or (
        isinstance(scheduler_factory, type) and issubclass(scheduler_factory, EnvScheduler))  # env schedulers: env_task
    if dataset is None and own_default:
        from ..data.tasks import default_task_for

        task = default_task_for(scheduler_factory)
        dataset = list(task.rows)
        sched_opts = {**task.scheduler_options, **sched_opts}
        if opts["max_turns"] is None and task.task_config.get("max_turns") is not None:
            opts["max_turns"] = task.task_config["max_turns"]
        if opts["max_completion_length"] is None:
            opts["max_completion_length"] = task.task_config.get("max_completion_length")
    if opts["max_completion_length"] is None:
        opts["max_completion_length"] = 64
    # the rows are read and checked before the model loads: a missing column is one line, nothing loaded
    from ..data import load_rows
    from ..data.cursor import check_columns

    limit = opts["limit"] or None
    if isinstance(dataset, (list, tuple)):
        rows = list(dataset)[:limit]
    else:
        rows = list(load_rows(dataset, split=opts["dataset_split"], limit=limit,
                              options=parse_dataset_options(opts.get("dataset_options"))))
    check_columns(rows, opts["prompt_column"], f"dataset {dataset if isinstance(dataset, str) else 'rows'}")

    model = opts["model"]
    if model is None:
        from ..data.demo import tiny_model_path

        model = tiny_model_path()
    else:
        from ..training.components import check_model_path

        check_model_path(model)
    try:  # transformers' "Loading weights" bar is noise between the command and its own progress bar
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - a sampler that needs no transformers
        pass
    sampler = sampler_factory(model=model, **sampler_opts)
    sink = _JsonlSink(out)
    try:
        tokenizer = getattr(sampler, "tokenizer", None)
        if tokenizer is None:
            raise ConfigError(f"sampler {opts['sampler']!r} has no tokenizer; it is needed to encode prompts")
        check_vocabulary(tokenizer, model, "")
        from ..chat_template import check_renders_in_time

        from ..chat_template import prepare_multi_turn

        # the run's template set up as the trainer sets it up (a family's training template, …)
        multi_turn_note = prepare_multi_turn(tokenizer, opts.get("multi_turn_mode") or "auto", chat_template=opts.get("chat_template"))
        check_renders_in_time(tokenizer)  # a template that loops forever is one line, not a silent hang
        if opts["max_turns"] is not None:
            sched_opts["max_turns"] = opts["max_turns"]
        scheduler = build_scheduler(scheduler_factory, sampler, tokenizer, **sched_opts)
        if int(getattr(scheduler, "max_turns", 1) or 1) > 1:  # how the episodes become sequences
            click.echo(f"multi-turn  {multi_turn_note}", err=True)
        # the trainer's rule (TRL's: a plain-text prompt column is not chat-templated) and its Prompt.data
        tools = template_tools(scheduler)
        prompts = [row_to_prompt(r, tokenizer, prompt_column=opts["prompt_column"], system_prompt=opts["system_prompt"],
                                 tools=tools, index=i) for i, r in enumerate(rows)]
        params = SamplingParams(max_tokens=opts["max_completion_length"], temperature=opts["temperature"],
                                top_p=opts["top_p"], seed=opts["seed"])
        reward_hooks = RunHooks(*reward_objs) if reward_objs else None
        # streamed a group at a time: rewards score a prompt's whole group together, as in training
        # (a reward may compare a group's completions), then the group is written and forgotten
        groups: dict[str, list[Any]] = {}
        requests: dict[str, int] = {}

        async def finished(trajectories: list[Any]) -> None:
            if not trajectories:
                return
            gid = trajectories[0].group_id
            groups.setdefault(gid, []).extend(trajectories)
            requests[gid] = requests.get(gid, 0) + 1
            if requests[gid] < opts["num_generations"]:
                return
            group = groups.pop(gid)
            del requests[gid]
            if reward_hooks is not None:
                await compute_rewards(reward_hooks, group, weights)
            sink.write(group)

        sink.open()
        try:
            result = await run_rollouts(
                scheduler, prompts, num_generations=opts["num_generations"], sampling_params=params,
                concurrency=opts["rollout_concurrency"], progress=opts["progress"], timeout=opts["rollout_timeout"],
                observers=opts.get("observers") or (), check=opts.get("check", True), on_finished=finished,
            )  # (no trajectory kept: memory stays flat however many there are)
        except (asyncio.CancelledError, KeyboardInterrupt):
            for group in groups.values():  # groups cut short: their finished trajectories, unscored
                sink.write(group)
            sink.close()
            click.echo(f"interrupted: wrote {sink.written} finished trajectories to {out}", err=True)
            raise
        finally:
            sink.close()
        await _maybe(scheduler.close())
    except (asyncio.CancelledError, KeyboardInterrupt):
        if not sink.opened:  # before any trajectory ran
            click.echo(f"interrupted: nothing written to {out}", err=True)
        raise
    finally:
        await _maybe(sampler.close())
    s = result.stats
    line = (f"wrote {s['trajectories']} trajectories to {out}: {s['ok']} ok, {s['truncated']} truncated, "
            f"{s['failed']} failed, {s['turns']} turns"
            + (f" ({s['turns'] / s['trajectories']:.1f} per trajectory)" if s["trajectories"] else "")
            + f", {s['wall_s']:.1f}s")
    if s["failure_reasons"]:
        line += "; failures: " + json.dumps(s["failure_reasons"])
    if s["trajectories"] and not s["ok"] and not s["truncated"]:
        raise RunFailedError(f"no trajectory succeeded: {line}")  # the file is written: the reasons are in it
    return line


@click.command(name="check-rollouts")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--model", default=None, help="Tokenizer (model dir or hub id) the rollouts were made with [default: the built-in tiny model].")
@click.option("--tools", "tools_path", default=None, type=click.Path(exists=True, dir_okay=False),
              help="JSON file with the tool schemas the prompts were rendered with.")
@click.option("--strict-logprobs", is_flag=True, help="Every trained token must carry a logprob (else: all or none).")
@click.option("--chat-template", "chat_template", default=None, type=click.Path(exists=True, dir_okay=False),
              help="The --chat-template the rollouts were made with.")
def check_rollouts_command(path: str, model: str | None, tools_path: str | None, strict_logprobs: bool,
                           chat_template: str | None) -> None:
    """Check a JSONL of trajectories (``rlcore rollout`` output) against the rollout invariants.

    Tokens vs the chat-template rendering of the final messages, prompt tokens vs prompt messages,
    a logprob for each trained token, status, unique uuids. Exits 1 when anything is violated.
    """
    from ..types import Trajectory
    from ..rollout.invariants import check_batch

    if model is None:
        from ..data.demo import tiny_model_path

        model = tiny_model_path()
    from transformers import AutoTokenizer

    from ..training.components import check_model_path, from_pretrained

    check_model_path(model)
    tok = from_pretrained(AutoTokenizer, model, "tokenizer")
    from ..chat_template import prepare_multi_turn

    prepare_multi_turn(tok, "auto", chat_template=chat_template)  # the template as rollout and train render it
    tools = json.loads(Path(tools_path).read_text()) if tools_path else None
    trajs = []
    vocab = len(tok)
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    record = json.loads(line)
                    bad = _bad_token_id(record, vocab) if isinstance(record, dict) else None
                    if bad:  # a tokenizer fed -1, 1.5 or 10**30 raises deep inside (OverflowError, TypeError)
                        raise click.ClickException(f"{path}:{n}: {bad}")
                    trajs.append(Trajectory.from_dict(record))
                except (ValueError, KeyError, TypeError) as exc:
                    raise click.ClickException(f"{path}:{n} is not a trajectory ({type(exc).__name__}: {exc})") from None
    violations = check_batch(trajs, tok, tools=tools, require_logprobs=True if strict_logprobs else None)
    for v in violations:
        click.echo(f"{v.uuid}: {v}")
    bad = len({v.uuid for v in violations})
    click.echo(f"checked {len(trajs)} trajectories in {path}: {len(trajs) - bad} sound, {bad} with violations", err=True)
    if violations:
        raise SystemExit(1)


def _bad_token_id(record: dict[str, Any], vocab: int) -> str | None:
    """The first token-id field of a trajectory line holding something other than a token id of a
    ``vocab``-sized tokenizer (an integer in 0..vocab-1), said in one line; None when all are ids."""
    turns = record.get("turns")
    fields: list[tuple[str, Any]] = [("prompt_ids", record.get("prompt_ids"))]
    if turns and isinstance(turns, list):
        fields += [(f"turns[{i}].token_ids", t.get("token_ids")) for i, t in enumerate(turns) if isinstance(t, dict)]
    else:  # a line without turns is read from its flat completion_ids
        fields.append(("completion_ids", record.get("completion_ids")))
    for name, ids in fields:
        if ids is None:
            continue
        if not isinstance(ids, list):
            return f"{name} is {type(ids).__name__} {json.dumps(ids)[:40]}, not a list of token ids"
        for j, x in enumerate(ids):
            if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < vocab:
                hint = "; pass the --model the rollouts were made with" if isinstance(x, int) and vocab <= x < 2**63 else ""
                return (f"{name}[{j}] is {json.dumps(x)[:40]}, not a token id of this tokenizer "
                        f"(an integer from 0 to {vocab - 1}{hint})")
    return None


def _rewards(specs: tuple[str, ...], registry: Any, as_reward: Any,
             options: dict[str, dict[str, Any]] | None = None) -> tuple[list[Any], dict[str, float]]:
    objs, weights = [], {}
    for spec in specs:
        name, eq, w = spec.partition("=")
        try:
            weight = float(w) if eq else 1.0
        except ValueError:
            raise ConfigError(f"--reward {spec!r}: the weight after '=' must be a number") from None
        factory = registry.get("reward", name)
        given = (options or {}).get(name)
        objs.append(as_reward(name, factory(**given) if given else factory))
        weights[name] = weight
    return objs, weights


async def _maybe(value: Any) -> Any:
    from ..asyncutil import await_me_maybe

    return await await_me_maybe(value)
