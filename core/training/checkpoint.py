"""Atomic checkpoints: everything is written into a hidden temporary directory, flushed, and only
then renamed to ``checkpoint-N``. A process killed mid-save leaves a ``.incomplete-*`` directory
that ``resume_from_checkpoint`` never picks (transformers only matches ``checkpoint-<digits>``),
so a resume always loads a complete checkpoint.

Checkpoints hold only JSON and plain tensors, loaded with ``torch.load(weights_only=True)``: a
crafted ``rlcore_buffer.pt`` cannot run code on ``--resume_from_checkpoint``.

Run identity: a run writes a random ``run_id`` into ``OUTPUT_DIR/rlcore_run.json`` when it starts
and into every checkpoint it saves. A fresh run refuses an output directory that already holds a
run (see :func:`check_fresh_output_dir`), and a resume refuses a checkpoint written by another run
(:func:`check_owner`), so a run never adopts a checkpoint it did not write.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from typing import Any

from ..errors import ConfigError

STATE_FILE = "rlcore_state.json"
BUFFER_FILE = "rlcore_buffer.pt"
INCOMPLETE_PREFIX = ".incomplete-checkpoint-"
RUN_FILE = "rlcore_run.json"
_CHECKPOINT_RE = re.compile(r"^checkpoint-\d+$")


def temp_run_dir(run_dir: str, step: int) -> str:
    """A fresh hidden directory under ``run_dir`` that will hold ``checkpoint-<step>`` while it is written."""
    tmp = os.path.join(run_dir, f"{INCOMPLETE_PREFIX}{step}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp, exist_ok=True)
    return tmp


def _fsync_tree(path: str) -> None:
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def publish(tmp_run_dir: str, run_dir: str, folder: str) -> str:
    """Move the finished ``tmp_run_dir/folder`` to ``run_dir/folder`` (replacing an older one of the
    same name) and remove the temporary directory. Returns the final path."""
    src = os.path.join(tmp_run_dir, folder)
    dst = os.path.join(run_dir, folder)
    _fsync_tree(src)
    if os.path.exists(dst):
        old = dst + ".old"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(dst, old)
        os.rename(src, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(src, dst)
    shutil.rmtree(tmp_run_dir, ignore_errors=True)
    return dst


def clean_incomplete(run_dir: str) -> list[str]:
    """Remove leftovers of interrupted saves; returns what was removed."""
    removed = []
    if os.path.isdir(run_dir):
        for name in os.listdir(run_dir):
            if name.startswith(INCOMPLETE_PREFIX):
                shutil.rmtree(os.path.join(run_dir, name), ignore_errors=True)
                removed.append(name)
    return removed


def write_state(checkpoint_dir: str, state: dict[str, Any], buffer: Any = None) -> None:
    """rlcore's own resumable state: data position, pending mini-batches, metric history length."""
    with open(os.path.join(checkpoint_dir, STATE_FILE), "w", encoding="utf-8") as f:
        json.dump(state, f)
    if buffer:
        import torch

        torch.save([_plain_microbatch(mb) for mb in buffer], os.path.join(checkpoint_dir, BUFFER_FILE))


def _plain_microbatch(mb: dict[str, Any]) -> dict[str, Any]:
    """A pending micro-batch as dicts of tensors and numbers (what ``weights_only`` loading accepts)."""
    import attrs

    out = {k: v for k, v in mb.items() if k != "batch"}
    out["batch"] = attrs.asdict(mb["batch"], recurse=False)
    return out


def read_state(checkpoint_dir: str) -> tuple[dict[str, Any], Any]:
    path = os.path.join(checkpoint_dir, STATE_FILE)
    if not os.path.exists(path):
        return {}, None
    with open(path, encoding="utf-8") as f:
        state = json.load(f)
    buffer = None
    bpath = os.path.join(checkpoint_dir, BUFFER_FILE)
    if os.path.exists(bpath):
        import torch

        from ..types import Batch

        try:
            plain = torch.load(bpath, weights_only=True, map_location="cpu")
        except Exception as exc:  # noqa: BLE001 - pickle refused a non-tensor object: not ours
            raise ConfigError(
                f"{bpath} holds something other than plain tensors ({str(exc).splitlines()[0][:160]}); "
                "refusing to load it — delete that checkpoint or resume from another"
            ) from None
        buffer = [dict(mb, batch=Batch(**mb["batch"])) for mb in plain]
    return state, buffer


# --- run identity -------------------------------------------------------------------------------------
def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def read_run_id(output_dir: str) -> str | None:
    """The run id recorded in ``output_dir`` (None when no rlcore run has claimed it)."""
    path = os.path.join(output_dir, RUN_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            return str(json.load(f)["run_id"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(f"{path} is unreadable; delete it or pick another --output_dir") from None


def write_run_id(output_dir: str, run_id: str) -> None:
    os.makedirs(output_dir, exist_ok=True)
    tmp = os.path.join(output_dir, f".{RUN_FILE}.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"run_id": run_id}, f)
    os.replace(tmp, os.path.join(output_dir, RUN_FILE))


def run_artefacts(output_dir: str) -> list[str]:
    """What in ``output_dir`` belongs to an earlier run: its run file, checkpoints, metrics."""
    if not os.path.isdir(output_dir):
        return []
    names = sorted(os.listdir(output_dir))
    ckpts = sorted((n for n in names if _CHECKPOINT_RE.match(n)), key=lambda n: int(n.split("-")[1]))
    return [n for n in (RUN_FILE, "metrics.jsonl") if n in names] + ckpts


def check_output_dir(output_dir: str) -> None:
    """``output_dir`` must be a directory this process can write (checked before the model loads)."""
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ConfigError(f"output_dir {output_dir} is a file, not a directory; pass a directory path")
    parent = output_dir
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    parent = parent or "."
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"output_dir {output_dir} cannot be created or written (no write access to {parent})")


def next_free_dir(output_dir: str) -> str:
    """``output_dir`` if it holds no run, else the first of ``output_dir-2``, ``-3`` … that does not.
    Only for a directory the user did not name (the CLI's default); a named one is refused instead."""
    if not run_artefacts(output_dir):
        return output_dir
    n = 2
    while run_artefacts(f"{output_dir}-{n}"):
        n += 1
    return f"{output_dir}-{n}"


def check_fresh_output_dir(output_dir: str, overwrite: bool = False) -> None:
    """A fresh (not resumed) run refuses a directory holding an earlier run, unless ``overwrite``.

    Why refuse rather than write into a new subdirectory: scripts, docs and ``save_model`` expect
    results in the directory they named; a silent detour surprises more than one line does, and
    refusing loses nothing."""
    found = run_artefacts(output_dir)
    if found and not overwrite:
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise ConfigError(
            f"output_dir {output_dir} already holds a run ({shown}); resume it with --resume_from_checkpoint, "
            "replace it with --overwrite_output_dir, or pick another --output_dir"
        )


def clear_previous_run(output_dir: str) -> list[str]:
    """``overwrite_output_dir``: remove the earlier run's run file, checkpoints, metrics and plots."""
    removed = run_artefacts(output_dir)
    for name in removed:
        path = os.path.join(output_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    if removed and os.path.isdir(os.path.join(output_dir, "plots")):
        shutil.rmtree(os.path.join(output_dir, "plots"))
    return removed


def check_owner(checkpoint_dir: str, state: dict[str, Any], output_dir: str) -> str | None:
    """The checkpoint's run id, after checking that ``output_dir``'s run wrote it (a checkpoint of
    another run, e.g. copied in or left by an earlier run, is refused)."""
    ckpt_id = state.get("run_id")
    dir_id = read_run_id(output_dir)
    if dir_id is not None and ckpt_id != dir_id:
        who = f"run {ckpt_id}" if ckpt_id else "a run without a run id"
        raise ConfigError(
            f"{checkpoint_dir} was written by {who}, not by run {dir_id} of {output_dir}; "
            "resume that run in its own output_dir, or start a fresh run in another --output_dir"
        )
    return ckpt_id


#: ``--resume_from_checkpoint`` values that mean "the newest checkpoint of output_dir" / "no resume"
RESUME_LATEST = ("true", "latest", "last")
RESUME_NONE = ("", "false", "no", "none")


def checkpoints_in(output_dir: str) -> list[str]:
    """The ``checkpoint-N`` directories of ``output_dir``, oldest first."""
    return [n for n in run_artefacts(output_dir) if _CHECKPOINT_RE.match(n)]


def checkpoint_step(checkpoint_dir: str) -> int:
    """The step a checkpoint was saved at (its trainer state, else its name)."""
    try:
        with open(os.path.join(checkpoint_dir, "trainer_state.json"), encoding="utf-8") as f:
            return int(json.load(f).get("global_step", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        tail = os.path.basename(os.path.normpath(checkpoint_dir)).rpartition("-")[2]
        return int(tail) if tail.isdigit() else 0


def resolve_resume(resume: Any, output_dir: str) -> str | None:
    """The checkpoint directory a resume continues from, checked before anything is loaded or written.

    ``True`` / ``"true"`` / ``"latest"`` / ``"last"``: the newest ``checkpoint-N`` of ``output_dir``;
    a path: it must be a directory a run saved (``trainer_state.json``) and, when ``output_dir``
    holds a run, written by that run (:func:`check_owner`). Why here and not in ``Trainer.train``:
    a mistyped path used to raise transformers' ``Can't find a valid checkpoint`` after the model
    loaded — and after ``rlcore_run.json`` was written, so the next fresh run into that directory
    was refused. ``None`` (or ``"false"``) means no resume."""
    if resume is None or resume is False or (isinstance(resume, str) and resume.strip().lower() in RESUME_NONE):
        return None
    found = checkpoints_in(output_dir)
    if resume is True or (isinstance(resume, str) and resume.strip().lower() in RESUME_LATEST):
        if not found:
            where = "it does not exist" if not os.path.isdir(output_dir) else "it holds no checkpoint-N directory"
            raise ConfigError(
                f"no checkpoint to resume from in {output_dir} ({where}); name the run's --output_dir, or drop "
                "--resume_from_checkpoint to start a fresh run"
            )
        return os.path.join(output_dir, found[-1])
    path = os.path.expanduser(str(resume))
    if not os.path.exists(path):
        have = f"; {output_dir} has {', '.join(found[-3:])}" if found else ""
        raise ConfigError(f"no such checkpoint: {path}{have} — pass a checkpoint-N directory a run saved, "
                          "or --resume_from_checkpoint true for the newest one in --output_dir")
    if not os.path.isfile(os.path.join(path, "trainer_state.json")):
        raise ConfigError(f"{path} is not a checkpoint (no trainer_state.json); pass a checkpoint-N directory a run saved")
    state_path = os.path.join(path, STATE_FILE)
    state: dict[str, Any] = {}
    if os.path.exists(state_path):
        try:
            with open(state_path, encoding="utf-8") as f:
                state = dict(json.load(f))
        except (OSError, ValueError, TypeError):
            raise ConfigError(f"{state_path} is unreadable; resume from another checkpoint") from None
    check_owner(path, state, output_dir)
    return path
