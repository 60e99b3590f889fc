"""Datasets → :class:`rlcore.Prompt`: loading rows and encoding prompts with the chat template.

A row becomes a conversation from its ``messages`` column (a list of role/content dicts), its
``prompt`` column (text or messages), or a question-style column (``question``, ``problem``,
``query``, ``instruction`` — or whichever ``prompt_column`` names). Every other column (``answer``,
``solution``, ``env_config`` …) stays in ``Prompt.data`` so rewards and environments can read it.
The prompt ids are encoded once (the rollout engine never re-tokenises them) by one rule,
:func:`row_to_prompt`, which every command uses (the trainer, the loop API's ``make_prompts``,
``rlcore rollout``, :func:`load_prompts`): TRL's — a plain-text ``prompt`` column is tokenized as is,
anything conversational gets the chat template with the generation prompt.

Rows can also come from a *dataset source* a plugin registers (``register_datasets``):
``SOURCE:SPEC?key=value&…`` calls the source with ``SPEC`` and the options. The core knows
nothing about what a source generates.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence
from urllib.parse import parse_qsl

from ..errors import DatasetError
from ..types import Prompt

BUILTIN_DATASET_PATH = Path(__file__).with_name("builtin") / "arithmetic.jsonl"
BUILTIN_NAMES = ("builtin", "arithmetic", "rlcore:arithmetic")
QUESTION_COLUMNS = ("question", "problem", "query", "instruction", "input")
#: the columns a prompt is read from, in the order they are looked for (an explicit prompt_column aside)
PROMPT_COLUMNS = ("messages", "prompt", *QUESTION_COLUMNS)
_LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


def builtin_dataset() -> list[dict[str, Any]]:
    """The small built-in task: 48 generated arithmetic questions with their answers."""
    return _read_jsonl(BUILTIN_DATASET_PATH)


def load_rows(source: str | Path | None = None, *, split: str = "train", limit: int | None = None,
              options: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Rows from a local ``.jsonl``/``.json``/``.parquet`` file, the built-in set (``None`` or
    ``"builtin"``), a registered dataset source (``source:spec?key=value``; ``options`` are merged
    into the query's), or a Hugging Face ``datasets`` name (``name`` or ``name:config``)."""
    parsed = None if source is None or isinstance(source, Path) else parse_dataset_source(str(source))
    if options and parsed is None:
        raise DatasetError(
            f"dataset options ({', '.join(map(str, options))}) apply only to a registered dataset source "
            f"(SOURCE:SPEC); {str(source or 'builtin')!r} is not one: drop the options or name a source"
        )
    if parsed is not None:
        name, spec, query = parsed
        rows = rows_from_source(name, spec, {**query, **dict(options or {})})
    elif source is None or str(source) in BUILTIN_NAMES:
        rows = builtin_dataset()
    else:
        path = Path(str(source)).expanduser()
        if path.exists() and path.is_file():
            rows = _read_file(path)
        elif path.suffix.lower() in _LOCAL_SUFFIXES or str(source).startswith((".", "/", "~")):
            raise DatasetError(f"dataset file {str(source)!r} does not exist; pass an existing .jsonl/.json/.parquet file or a datasets name")
        else:
            rows = _read_hub(str(source), split)
    if limit is not None:
        rows = rows[: max(0, int(limit))]
    if not rows:
        raise DatasetError(f"dataset {str(source or 'builtin')!r} has no rows")
    return rows


def load_prompts(
    source: str | Path | Sequence[dict[str, Any]] | None,
    tokenizer: Any,
    *,
    split: str = "train",
    prompt_column: str | None = None,
    system_prompt: str | None = None,
    limit: int | None = None,
    tools: list[dict[str, Any]] | None = None,
    options: Mapping[str, Any] | None = None,
) -> list[Prompt]:
    """Load a dataset (path, name, source, rows, or ``None`` for the built-in one) as encoded prompts,
    each by :func:`row_to_prompt`. Here ``Prompt.data`` is the row's other columns only (not the
    copy of its prompt a command keeps for TRL-style rewards)."""
    rows = list(source) if isinstance(source, (list, tuple)) else load_rows(source, split=split, limit=limit, options=options)
    if isinstance(source, (list, tuple)) and limit is not None:
        rows = rows[:limit]
    return [row_to_prompt(r, tokenizer, prompt_column=prompt_column, system_prompt=system_prompt, tools=tools,
                          index=i, prompt_in_data=False) for i, r in enumerate(rows)]


def prompt_column_of(row: Mapping[str, Any], prompt_column: str | None = None) -> str | None:
    """The column a row's prompt is read from: ``prompt_column``, else the first of :data:`PROMPT_COLUMNS` it has."""
    return prompt_column if prompt_column is not None else next((c for c in PROMPT_COLUMNS if c in row), None)


def row_messages(row: dict[str, Any], *, prompt_column: str | None = None, system_prompt: str | None = None,
                 index: int = 0) -> tuple[list[dict[str, Any]], set[str]]:
    """The conversation a row starts, and the columns consumed to build it."""
    if not isinstance(row, dict):
        raise DatasetError(f"dataset row {index} is a {type(row).__name__}, expected an object with columns")
    if prompt_column is not None:
        if prompt_column not in row:
            raise DatasetError(
                f"dataset row {index} has no column {prompt_column!r} (prompt_column); columns: {', '.join(map(str, row)) or 'none'}"
            )
        col = prompt_column
    else:
        col = prompt_column_of(row)
        if col is None:
            raise DatasetError(
                f"dataset row {index} has none of the columns messages, prompt, {', '.join(QUESTION_COLUMNS)} "
                f"(it has: {', '.join(map(str, row)) or 'none'}); name the prompt column with --prompt-column"
            )
    value = row[col]
    if isinstance(value, str):
        messages = [{"role": "user", "content": value}]
    elif isinstance(value, (list, tuple)) and all(isinstance(m, dict) and "role" in m for m in value):
        messages = [dict(m) for m in value]
        for i, m in enumerate(messages):
            problem = message_problem(m)
            if problem:
                raise DatasetError(f"dataset row {index} column {col!r}: message {i} {problem}")
    else:
        raise DatasetError(f"dataset row {index} column {col!r} must be text or a list of role/content messages")
    if system_prompt and not (messages and messages[0].get("role") == "system"):
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages, {col} if col in ("messages", "prompt") else set()


#: the roles a prompt's messages may have (what chat templates render; ``ipython`` is Llama 3's tool role)
MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool", "function", "ipython")


def message_problem(m: Mapping[str, Any]) -> str | None:
    """What is wrong with one prompt message, or None. A message has a known role and a content that
    is text or a list of content parts (``{"type": "text", "text": …}``, images …); only an assistant
    message that makes tool calls may leave its content out (or null). Why: a template renders a
    missing content as empty and an unknown role as it likes, so the run trained on a turn nobody wrote."""
    role = m.get("role")
    if not isinstance(role, str) or role not in MESSAGE_ROLES:
        return f"has role {role!r}; a message's role is one of {', '.join(MESSAGE_ROLES)}"
    content = m.get("content")
    if content is None:
        if role == "assistant" and m.get("tool_calls"):
            return None
        said = "no content" if "content" not in m else "content null"
        return (f"(role {role!r}) has {said}; give it its text (only an assistant message with tool_calls "
                "may go without)")
    if isinstance(content, str):
        return None
    if isinstance(content, (list, tuple)):
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
                return (f"(role {role!r}) has content part {j} {part!r:.60}; a content list holds parts like "
                        "{'type': 'text', 'text': '…'}")
        return None
    return (f"(role {role!r}) has content {content!r:.60} ({type(content).__name__}); content is text or a list "
            "of content parts ({'type': 'text', 'text': '…'})")


def is_standard_prompt(row: Mapping[str, Any], *, prompt_column: str | None = None, system_prompt: str | None = None) -> bool:
    """True for TRL's *standard* (not conversational) prompt: the row's prompt is a plain-text ``prompt``
    column (TRL 1.16 ``is_conversational`` is False for it), and none of rlcore's own ways of asking for
    a conversation is used (a ``messages`` column, an explicit ``prompt_column``, a ``system_prompt``)."""
    return prompt_column is None and not system_prompt and "messages" not in row and isinstance(row.get("prompt"), str)


def row_to_prompt(row: dict[str, Any], tokenizer: Any, *, prompt_column: str | None = None,
                  system_prompt: str | None = None, tools: list[dict[str, Any]] | None = None,
                  max_prompt_length: int | None = None, index: int = 0, prompt_in_data: bool = True) -> Prompt:
    """One row as a fresh :class:`Prompt` (a new group id each time): the one rule every command uses.

    As in TRL, a plain-text ``prompt`` column is a *standard* prompt (:func:`is_standard_prompt`): its
    text is tokenized as is, with no chat template (TRL 1.16 ``GRPOTrainer._tokenize_prompts``); a
    message-list ``prompt`` is conversational and gets the template (with ``tools``), and so do
    rlcore's other prompt columns (``messages``, ``question`` …, an explicit ``prompt_column``) and any
    row given a ``system_prompt``. ``data`` holds the row's other columns, and ``data["prompt"]`` the
    row's prompt as written (its text or message list, else the messages), which is what TRL-style
    rewards receive (``prompt_in_data=False``: the other columns only, as :func:`load_prompts` gives).
    Over ``max_prompt_length`` tokens, a prompt keeps its last ones (``truncated_tokens``)."""
    from ..chat_template import encode_prompt

    messages, used = row_messages(row, prompt_column=prompt_column, system_prompt=system_prompt, index=index)
    others = {k: v for k, v in row.items() if k not in used}
    if is_standard_prompt(row, prompt_column=prompt_column, system_prompt=system_prompt):
        p = Prompt(messages=messages, prompt_ids=list(tokenizer(text=row["prompt"])["input_ids"]),
                   data=dict(row) if prompt_in_data else others)
    else:
        data = {**others, "prompt": _as_written(row, messages, prompt_column)} if prompt_in_data else others
        p = Prompt(messages=messages, prompt_ids=encode_prompt(tokenizer, messages, tools=tools), data=data)
    if max_prompt_length and len(p.prompt_ids) > max_prompt_length:
        p.truncated_tokens = len(p.prompt_ids) - max_prompt_length
        p.prompt_ids = p.prompt_ids[-max_prompt_length:]
    return p


def _as_written(row: Mapping[str, Any], messages: list[dict[str, Any]], prompt_column: str | None) -> Any:
    """The prompt a TRL-style reward sees: the row's own text or message list, else the messages."""
    col = prompt_column_of(row, prompt_column)
    value = row.get(col) if col else None
    if isinstance(value, str) or (isinstance(value, list) and col != "messages"):
        return value
    return messages


# --- dataset sources (register_datasets) ------------------------------------------------------------
def parse_dataset_source(text: str, registry: Any = None) -> tuple[str, str, dict[str, Any]] | None:
    """``"src:spec?a=1&b=x"`` -> ``("src", "spec", {"a": 1, "b": "x"})`` when ``src`` is a registered
    dataset source (or one an installed plugin distribution declares, so a plugin left out of
    ``RLCORE_PLUGINS`` or failing to load is named); else None.

    Query values are parsed as JSON where they parse (``3`` -> 3, ``true`` -> True, ``[1,2]`` -> a
    list) and kept as text otherwise. Local paths never count as sources.
    """
    from ..plugins import plugins, provider_of

    name, colon, rest = text.partition(":")
    if not colon or not name or "/" in name or "\\" in name or Path(text).expanduser().exists():
        return None
    registry = registry or plugins()
    if name not in registry.available("dataset"):
        if provider_of(name):
            registry.component("dataset", name)  # raises the one-line "pip install …" error
        return None
    spec, _, query = rest.partition("?")
    options: dict[str, Any] = {}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return name, spec, options


def rows_from_source(name: str, spec: str, options: Mapping[str, Any], registry: Any = None) -> Sequence[dict[str, Any]]:
    """Call the dataset source ``name`` and check it returned row dicts: a list, or a sequence
    that generates rows when read (kept lazy: ``len`` and indexing only)."""
    from ..errors import RlcoreError
    from ..plugins import plugins

    component = (registry or plugins()).component("dataset", name)
    try:
        rows = component.resolve()(spec, **dict(options))
    except RlcoreError:
        raise
    except Exception as exc:  # noqa: BLE001 - a source's failure is reported as one line naming it
        detail = str(exc).splitlines()[0] if str(exc) else ""
        raise DatasetError(f"dataset source {name!r} ({component.dist}) failed on {spec!r}: {type(exc).__name__}: {detail}") from exc
    # a list is checked row by row; a lazy sequence (rows generated when read) by its first row only
    lazy = isinstance(rows, Sequence) and not isinstance(rows, (list, tuple, str, bytes))
    if not (isinstance(rows, list) or lazy) or not all(isinstance(r, dict) for r in (rows[:1] if lazy else rows)):
        raise DatasetError(f"dataset source {name!r} ({component.dist}) must return a list (or sequence) of row dicts, got {type(rows).__name__}")
    return rows


def parse_dataset_options(value: Any) -> dict[str, Any]:
    """``--dataset-options``: a mapping (config files), JSON text, or ``key=value,key=value``."""
    if value is None or value == "":
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    text = str(value).strip()
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except ValueError as exc:
            raise DatasetError(f"--dataset-options is not valid JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise DatasetError("--dataset-options must be a JSON object")
        return obj
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, raw = part.partition("=")
        if not eq or not key.strip():
            raise DatasetError(f"--dataset-options: {part!r} is not key=value (use key=value,key=value or a JSON object)")
        try:
            out[key.strip()] = json.loads(raw)
        except ValueError:
            out[key.strip()] = raw
    return out


# --- readers ---------------------------------------------------------------------------------------
def _read_file(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    try:
        if suffix == ".jsonl":
            return _read_jsonl(path)
        if suffix == ".json":
            obj = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(obj, dict):  # {"data": [...]} or column-oriented {"col": [...]}
                if isinstance(obj.get("data"), list):
                    obj = obj["data"]
                elif obj and all(isinstance(v, list) for v in obj.values()):
                    keys = list(obj)
                    obj = [dict(zip(keys, vals)) for vals in zip(*obj.values())]
            if not isinstance(obj, list):
                raise DatasetError(f"{path}: expected a JSON list of row objects")
            return list(obj)
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
    except DatasetError:
        raise
    except Exception as exc:  # noqa: BLE001 - unreadable file is a user error
        raise DatasetError(f"cannot read dataset {path}: {type(exc).__name__}: {exc}") from exc
    raise DatasetError(f"dataset {path} has an unsupported extension {suffix!r}; use .jsonl, .json or .parquet")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path} line {lineno} is not valid JSON: {exc.msg}") from exc
    return rows


def _source_hint(prefix: str) -> str:
    """For ``prefix:spec`` that was tried as a hub name: the dataset sources it might have meant."""
    from ..plugins import plugins

    available = sorted(plugins().available("dataset"))
    return (f"{prefix!r} is not a registered dataset source either (sources: {', '.join(available) or 'none'}; "
            "`rlcore components dataset`); ")


def _read_hub(name: str, split: str) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - datasets is a dependency
        raise DatasetError("reading a datasets name needs the 'datasets' package: pip install datasets") from exc
    repo, _, config = name.partition(":")
    try:
        ds = datasets.load_dataset(repo, config or None, split=split)
    except Exception as exc:  # noqa: BLE001
        raise DatasetError(
            f"cannot load dataset {name!r} (split {split!r}): {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}; "
            f"{_source_hint(repo) if config else ''}pass a local .jsonl/.json/.parquet file instead"
        ) from exc
    return [dict(r) for r in ds]
