"""Plugin options from command-line flags: ``--env-url X`` → ``env_url="X"`` for whichever factory declares it.

Why: a plugin's options are its factory's keyword parameters, so new plugins get command-line flags
for free (``rlcore rollout --scheduler openenv_scheduler --env-url http://…``) and ``rlcore train``
reuses the same mapping. Values are converted with the parameter's annotation or default's type;
an option no factory accepts is one clear line listing what they do accept.
"""

from __future__ import annotations

import inspect
import json
import re
import typing
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..errors import ConfigError

#: parameters that are wiring, not user options
_INTERNAL = {"self", "sampler", "infer_engine", "tokenizer", "model", "sampling_params", "args", "kwargs"}


def parse_flags(args: Sequence[str]) -> dict[str, Any]:
    """``["--env-url", "X", "--verbose", "--no-cache", "--k=v"]`` → ``{"env_url": "X", "verbose": True,
    "cache": False, "k": "v"}``. A repeated flag collects a list."""
    out: dict[str, Any] = {}
    i = 0
    args = list(args)
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or arg == "--":
            raise ConfigError(f"unexpected argument {arg!r}; plugin options look like --name VALUE")
        name, eq, value = arg[2:].partition("=")
        key = name.replace("-", "_")
        val: Any
        if eq:
            val = value
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            val = args[i + 1]
            i += 1
        elif key.startswith("no_"):
            key, val = key[3:], False
        else:
            val = True
        if key in out:
            prev = out[key]
            out[key] = (prev if isinstance(prev, list) else [prev]) + [val]
        else:
            out[key] = val
        i += 1
    return out


def json_object(value: Mapping[str, Any] | str | None, name: str) -> dict[str, Any]:
    """An options dict given in code (a mapping) or on the command line (a JSON object string);
    ``None``/``""`` is empty. Anything else is one line naming ``name`` (a flag or option)."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{name} {value[:200]!r} is not a JSON object ({exc.msg}); pass one like '{{\"key\": \"value\"}}'"
            ) from None
    if not isinstance(value, Mapping):
        raise ConfigError(f"{name} must be a JSON object, got {type(value).__name__}")
    return dict(value)


def factory_parameters(factory: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    """The keyword options a factory accepts, following ``**kwargs`` up a class's ``__init__`` chain."""
    params: dict[str, inspect.Parameter] = {}
    targets: list[Any] = []
    if inspect.isclass(factory):
        targets = [c.__init__ for c in factory.__mro__ if "__init__" in vars(c) and c is not object]
    else:
        targets = [factory]
    for fn in targets:
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            continue
        hints = _hints(fn)
        var_kw = False
        for name, p in sig.parameters.items():
            if p.kind is p.VAR_KEYWORD:
                var_kw = True
                continue
            if p.kind is p.VAR_POSITIONAL or name in _INTERNAL:
                continue
            if name in params:  # a subclass re-declared it without a type: take the base's annotation
                if params[name].annotation is inspect.Parameter.empty and name in hints:
                    params[name] = params[name].replace(annotation=hints[name])
                continue
            if name in hints:
                p = p.replace(annotation=hints[name])
            params[name] = p
        if not var_kw:
            break
        for name in _kwargs_reads(fn):
            if name not in params and name not in _INTERNAL:
                params[name] = inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None)
    return params


#: per kind, parameters that are wiring rather than options
_WIRING: dict[str, set[str]] = {"advantage": {"config"}, "prompt_sampler": {"cursor"}}


def component_parameters(kind: str, factory: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    """The options a component of ``kind`` declares, the same rule for every kind: its factory's
    keyword parameters — except a loss (a function whose parameters are its inputs), which declares
    them as ``loss.options``, and a reward function, whose parameters are the columns it reads
    (a ``Reward`` class declares options in ``__init__`` like any factory)."""
    from ..protocols import declared_options

    if kind == "loss":
        return {name: inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
                for name, default in declared_options(factory).items()}
    if kind == "reward" and not inspect.isclass(factory):
        return {}
    return {k: v for k, v in factory_parameters(factory).items() if k not in _WIRING.get(kind, set())}


_KWARGS_READ = re.compile(r"""\b(\w*kw\w*)\s*(?:\.get\(\s*|\.pop\(\s*|\[\s*)['"]([A-Za-z_]\w*)['"]""")


def _kwargs_reads(fn: Any) -> list[str]:
    """Option names a constructor reads from its ``**kwargs`` (``kwargs.get('gym_env')``, ms-swift's
    style), so those options are flags too — and a typo is still an unknown option."""
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        return []
    var_kw = next((p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.VAR_KEYWORD), None)
    if var_kw is None:
        return []
    return [name for var, name in _KWARGS_READ.findall(src) if var == var_kw]


def _hints(fn: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolvable string annotations: fall back to defaults
        return {}


def convert(value: Any, param: inspect.Parameter | None) -> Any:
    """Convert a flag's string to the parameter's type (annotation, else the default's type)."""
    if param is None or not isinstance(value, str):
        return value
    kinds = _types_of(param)
    if bool in kinds:
        low = value.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
    for t in (int, float):
        if t in kinds:
            try:
                return t(value)
            except ValueError:
                continue
    if kinds & {list, dict, tuple}:
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            if list in kinds:
                return [v for v in value.split(",") if v]
    if str in kinds or not kinds:
        return value
    return value


def _types_of(param: inspect.Parameter) -> set[type]:
    ann = param.annotation
    kinds: set[type] = set()
    if ann is not inspect.Parameter.empty and not isinstance(ann, str):
        for a in typing.get_args(ann) or (ann,):
            origin = typing.get_origin(a) or a
            if isinstance(origin, type):
                kinds.add(origin)
    if not kinds and param.default not in (None, inspect.Parameter.empty):
        kinds.add(type(param.default))
    return kinds


def resolve_options(
    flags: dict[str, Any],
    factories: dict[str, Callable[..., Any]],
) -> dict[str, dict[str, Any]]:
    """Route each flag to every factory that declares it (converted to its type).

    ``factories`` maps a label (``"scheduler 'gym_scheduler'"``) to a factory, or to the parameters
    it accepts (:func:`component_parameters`). Returns label →
    kwargs. Raises :class:`ConfigError` naming an option none of them accepts and what they accept.
    """
    accepted = {label: dict(f) if isinstance(f, Mapping) else factory_parameters(f) for label, f in factories.items()}
    out: dict[str, dict[str, Any]] = {label: {} for label in factories}
    for key, value in flags.items():
        takers = [label for label, params in accepted.items() if key in params]
        if not takers:
            lists = "; ".join(
                f"{label} accepts {', '.join('--' + n.replace('_', '-') for n in sorted(params)) or 'nothing'}"
                for label, params in accepted.items()
            )
            raise ConfigError(f"unknown option --{key.replace('_', '-')}: {lists}")
        for label in takers:
            out[label][key] = convert(value, accepted[label][key])
    return out


def plugin_options(args: Sequence[str], factories: dict[str, Callable[..., Any]]) -> dict[str, dict[str, Any]]:
    """``parse_flags`` + ``resolve_options``: leftover command-line args → kwargs per factory."""
    return resolve_options(parse_flags(args), factories)


def describe_options(factory: Callable[..., Any], kind: str | None = None) -> list[str]:
    """``--name (type, default X)`` lines for help output (``kind``: by that kind's rule,
    :func:`component_parameters`)."""
    lines = []
    params = component_parameters(kind, factory) if kind else factory_parameters(factory)
    for name, p in params.items():
        types = {t.__name__ for t in _types_of(p)}
        # as a user reads it: "str | None", never Python's "NoneType"
        kinds = " | ".join(sorted(types - {"NoneType"}) + (["None"] if "NoneType" in types else [])) or "text"
        default = "" if p.default is inspect.Parameter.empty else f", default {p.default!r}"
        lines.append(f"--{name.replace('_', '-')} ({kinds}{default})")
    return lines


def accepts(factory: Callable[..., Any], names: Iterable[str]) -> dict[str, bool]:
    params = factory_parameters(factory)
    return {n: n in params for n in names}
