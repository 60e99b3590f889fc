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

One live run per output directory: a run holds an ``flock`` on ``OUTPUT_DIR/.rlcore.lock`` while it
trains (:func:`acquire_run_lock`); the OS drops it when the process ends, however it ends, so a
crashed run never leaves the directory stuck. Before resuming, a checkpoint is validated
(:func:`validate_checkpoint`: required files, sizes, JSON types, bounded reads), and nothing is
written, truncated or deleted through a symbolic link in the output directory (:func:`check_no_links`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
import struct
import time
import uuid
import zipfile
from typing import Any, Iterator

from ..errors import ConfigError, StorageError

STATE_FILE = "rlcore_state.json"
BUFFER_FILE = "rlcore_buffer.pt"
INCOMPLETE_PREFIX = ".incomplete-checkpoint-"
RUN_FILE = "rlcore_run.json"
LOCK_FILE = ".rlcore.lock"
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
    """``overwrite_output_dir``: remove the earlier run's run file, checkpoints, metrics and plots
    (a symbolic link among them is refused before anything is removed)."""
    check_no_links(output_dir)
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
    try:  # a bounded read: the file may be anything (a link to /dev/zero)
        return int(_read_json(os.path.join(checkpoint_dir, "trainer_state.json"), _MAX_TRAINER_STATE).get("global_step", 0))
    except (_Damaged, OSError, ValueError, TypeError, AttributeError):
        tail = os.path.basename(os.path.normpath(checkpoint_dir)).rpartition("-")[2]
        return int(tail) if tail.isdigit() else 0


def resolve_resume(resume: Any, output_dir: str, without_optimizer: bool = False) -> str | None:
    """The checkpoint directory a resume continues from, checked before anything is loaded or written.

    ``True`` / ``"true"`` / ``"latest"`` / ``"last"``: the newest ``checkpoint-N`` of ``output_dir``;
    a path: it must be a directory a run saved (``trainer_state.json``) and, when ``output_dir``
    holds a run, written by that run (:func:`check_owner`). Why here and not in ``Trainer.train``:
    a mistyped path used to raise transformers' ``Can't find a valid checkpoint`` after the model
    loaded — and after ``rlcore_run.json`` was written, so the next fresh run into that directory
    was refused. ``None`` (or ``"false"``) means no resume. Either way the checkpoint is validated
    first (:func:`validate_checkpoint`; ``without_optimizer``: a missing optimizer state is allowed)."""
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
        newest = os.path.join(output_dir, found[-1])
        if not os.path.lexists(os.path.join(newest, "trainer_state.json")):
            raise ConfigError(f"{newest} is not a checkpoint (no trainer_state.json); pass a checkpoint-N directory a run saved")
        check_owner(newest, validate_checkpoint(newest, without_optimizer), output_dir)
        return newest
    path = os.path.expanduser(str(resume))
    if not os.path.exists(path):
        have = f"; {output_dir} has {', '.join(found[-3:])}" if found else ""
        raise ConfigError(f"no such checkpoint: {path}{have} — pass a checkpoint-N directory a run saved, "
                          "or --resume_from_checkpoint true for the newest one in --output_dir")
    if not os.path.isdir(path) or not os.path.lexists(os.path.join(path, "trainer_state.json")):
        raise ConfigError(f"{path} is not a checkpoint (no trainer_state.json); pass a checkpoint-N directory a run saved")
    check_owner(path, validate_checkpoint(path, without_optimizer), output_dir)
    return path


# --- one live run per output directory ----------------------------------------------------------------
#: locks this process holds: realpath of the output dir -> [descriptor, holders]
_HELD: dict[str, list[int]] = {}


def _lock_key(output_dir: str) -> str:
    return os.path.realpath(output_dir)


def _holder(fd: int) -> str:
    """``pid N, started …`` from the lock file (bounded read; what a run wrote when it took the lock)."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
        return f"pid {int(info['pid'])}, started {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "pid unknown"


def _in_use(output_dir: str, fd: int) -> ConfigError:
    return ConfigError(f"output_dir {output_dir} is in use by a running run ({_holder(fd)}); "
                       "wait for it or pick another --output_dir")


def check_not_in_use(output_dir: str) -> None:
    """Refuse ``output_dir`` while another live process trains into it; creates nothing (the CLI
    calls it before the model loads). Why a lock and not a pid file: the OS releases an ``flock``
    when its process dies, however it dies, so a crashed run never leaves the directory stuck."""
    import fcntl

    if _lock_key(output_dir) in _HELD:
        return
    path = os.path.join(output_dir, LOCK_FILE)
    if os.path.islink(path):
        raise link_error(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # no lock file: nobody ever trained here (or it cannot be read; taking the lock will tell)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(output_dir, fd) from None
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def acquire_run_lock(output_dir: str) -> None:
    """Take ``output_dir`` for this process (re-entrant: the CLI and the trainer both take it).
    Raises ConfigError naming the live run that holds it. Released by :func:`release_run_lock`, or
    by the OS when the process ends."""
    import fcntl

    key = _lock_key(output_dir)
    if key in _HELD:
        _HELD[key][1] += 1
        return
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, LOCK_FILE)
    deadline = time.monotonic() + 1.0  # a check_not_in_use of another process holds it for microseconds
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if os.path.islink(path):
                raise link_error(path) from None
            raise ConfigError(f"cannot create the lock file {path}: {exc.strerror or exc}; pick another --output_dir") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if time.monotonic() > deadline:
                error = _in_use(output_dir, fd)
                os.close(fd)
                raise error from None
            os.close(fd)
            time.sleep(0.05)
            continue
        if _same_file(fd, path):
            break
        os.close(fd)  # its run removed that file as it finished: lock the one at path now
    info = json.dumps({"pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}).encode()
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, info, 0)
    except OSError:
        pass  # who holds it is a courtesy for the message; the lock itself holds
    _HELD[key] = [fd, 1]


def _same_file(fd: int, path: str) -> bool:
    try:
        st, mine = os.lstat(path), os.fstat(fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def release_run_lock(output_dir: str) -> None:
    """Give ``output_dir`` back (when the last holder in this process lets go). The lock file is
    removed while still locked (a run that opened it meanwhile sees it gone and opens the new one),
    so a finished run leaves nothing; a crashed run leaves an unlocked file, which takes nothing."""
    import fcntl

    key = _lock_key(output_dir)
    held = _HELD.get(key)
    if held is None:
        return
    held[1] -= 1
    if held[1] > 0:
        return
    del _HELD[key]
    path = os.path.join(output_dir, LOCK_FILE)
    try:
        if _same_file(held[0], path):
            os.unlink(path)
    except OSError:
        pass
    finally:
        try:
            fcntl.flock(held[0], fcntl.LOCK_UN)
        finally:
            os.close(held[0])


# --- symbolic links in the output directory ---------------------------------------------------------
def link_error(path: str) -> ConfigError:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return ConfigError(f"{path} is a symbolic link (to {target}); rlcore never writes or deletes through a link in "
                       "output_dir — remove the link (its target is left alone) or put the real file or directory "
                       "there, or pick another --output_dir")


def check_no_links(output_dir: str) -> None:
    """Refuse an output directory with a symbolic link among its entries (or in ``plots/``), before
    anything is written or deleted. Why refuse rather than remove the link: a link there was put
    there on purpose by someone, and refusing loses nothing; writing through it would change a file
    outside the run (``metrics.jsonl`` repaired on resume cut an outside file's last line), and
    ``--overwrite_output_dir`` deleted the earlier run's files, then failed on a linked checkpoint."""
    if not os.path.isdir(output_dir):
        return
    for folder in (output_dir, os.path.join(output_dir, "plots")):
        if os.path.islink(folder):
            raise link_error(folder)
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            if os.path.islink(os.path.join(folder, name)):
                raise link_error(os.path.join(folder, name))


# --- disk full ---------------------------------------------------------------------------------------
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_FULL_WORDS = ("no space left", "file too large", "disk quota", "storagefull", "filetoolarge", "quotaexceeded")


def _chain(exc: BaseException | None) -> list[BaseException]:
    out: list[BaseException] = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def _fsize_limit() -> int | None:
    """The process's file size limit (``ulimit -f``) in bytes, None when unlimited."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _free_bytes(path: str) -> int | None:
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        return int(shutil.disk_usage(path or ".").free)
    except OSError:
        return None


def _size(n: int | None) -> str:
    if n is None:
        return "unknown space"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def _files(folder: str) -> list[tuple[str, os.stat_result]]:
    out = []
    for root, _dirs, names in os.walk(folder):
        for name in names:
            try:
                out.append((os.path.join(root, name), os.lstat(os.path.join(root, name))))
            except OSError:
                continue
    return out


def out_of_space(exc: BaseException, written: str | None = None) -> bool:
    """Whether ``exc``, raised while writing (into the folder ``written``), means there was no room:
    ENOSPC, EDQUOT or EFBIG anywhere in its chain, or the words for them (safetensors' Rust error). torch's
    zip writer says neither (``unexpected pos …``, ``iostream error``), so the disk is asked as well:
    almost nothing free, or a file in ``written`` grown to the file size limit."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
            return True
        if any(w in str(e).lower().replace(" ", "") or w in str(e).lower() for w in _FULL_WORDS):
            return True
    if written is None:
        return False
    free = _free_bytes(written)
    if free is not None and free < (1 << 20):
        return True
    limit = _fsize_limit()
    return limit is not None and any(st.st_size >= limit for _, st in _files(written))


def storage_error(path: str, output_dir: str, exc: BaseException | None = None) -> StorageError:
    """One line: the file that could not be written, the room there is, and where a resume starts."""
    free = _free_bytes(os.path.dirname(path))
    limit = _fsize_limit()
    try:
        at_limit = limit is not None and (any(isinstance(e, OSError) and e.errno == errno.EFBIG for e in _chain(exc))
                                          or os.lstat(path).st_size >= limit)
    except OSError:
        at_limit = False
    room = (f"the file size limit (ulimit -f) of {_size(limit)} is reached ({_size(free)} free on its disk)" if at_limit
            else f"{_size(free)} free")
    done = checkpoints_in(output_dir)
    if done:
        where = (f"the last complete checkpoint is {os.path.join(output_dir, done[-1])} (free some space, then resume "
                 "with --resume_from_checkpoint true)")
    else:
        where = ("no checkpoint is complete, so there is nothing to resume — free some space and start the run again "
                 "(--overwrite_output_dir true)")
    return StorageError(f"no space left writing {path}: {room}; {where}")


@contextlib.contextmanager
def saving(run_dir: str, step: int) -> Iterator[str]:
    """The hidden temporary directory a checkpoint is written into (see :func:`temp_run_dir`). When
    the save fails it is removed, and a failure for want of room becomes one :class:`StorageError`
    line naming the file, the space and the last complete checkpoint (which stays intact)."""
    tmp = os.path.join(run_dir, f"{INCOMPLETE_PREFIX}{step}-{os.getpid()}")
    try:
        yield temp_run_dir(run_dir, step)
    except Exception as exc:
        error = None
        if out_of_space(exc, tmp):
            culprit = next((e.filename for e in _chain(exc) if isinstance(e, OSError) and isinstance(e.filename, str)), None)
            if culprit is None:  # the file written last is the one that did not fit
                files = _files(tmp)
                culprit = max(files, key=lambda f: (f[1].st_mtime_ns, f[1].st_size))[0] if files else tmp
            error = storage_error(culprit, run_dir, exc)
            shown = os.path.relpath(culprit, tmp) if culprit.startswith(tmp + os.sep) else None
            if shown is not None:  # the file as the user will look for it: D/checkpoint-4/optimizer.pt
                error = StorageError(str(error).replace(culprit, os.path.join(run_dir, shown), 1))
        shutil.rmtree(tmp, ignore_errors=True)
        if error is None:
            raise
        raise error from exc


# --- validating a checkpoint before resuming ------------------------------------------------------------
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors",
                "pytorch_model.bin", "pytorch_model.bin.index.json", "adapter_model.bin")
#: bounds on what a resume reads whole: a trainer state of a long run, rlcore's state, a shard index
_MAX_TRAINER_STATE = 256 << 20
_MAX_STATE = 64 << 20
_MAX_INDEX = 16 << 20
_MAX_HEADER = 100 << 20  # safetensors' own bound on its JSON header


class _Damaged(Exception):
    """What is wrong with one file of a checkpoint (becomes one ConfigError line)."""


def _regular(path: str) -> os.stat_result:
    """``path``'s stat, which must be a regular file (a link to ``/dev/zero`` or a FIFO is not)."""
    name = os.path.basename(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise _Damaged(f"{name} cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise _Damaged(f"{name} is not a regular file" + (f" (a link to {os.readlink(path)})" if os.path.islink(path) else ""))
    return st


def _read_json(path: str, limit: int) -> Any:
    """The JSON in ``path``, read to at most ``limit`` bytes."""
    name = os.path.basename(path)
    st = _regular(path)
    if st.st_size > limit:
        raise _Damaged(f"{name} holds {_size(st.st_size)}, more than the {_size(limit)} such a file can need")
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise _Damaged(f"{name} holds more than {_size(limit)}")
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise _Damaged(f"{name} is not valid JSON ({str(exc).splitlines()[0][:80]})") from None


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_TRAINER_STATE_TYPES: dict[str, tuple[Any, str]] = {
    "global_step": (_is_int, "an integer"),
    "epoch": (lambda v: v is None or _is_num(v), "a number"),
    "max_steps": (lambda v: v is None or _is_num(v), "a number"),
    "logging_steps": (lambda v: v is None or _is_num(v), "a number"),
    "eval_steps": (lambda v: v is None or _is_num(v), "a number"),
    "save_steps": (lambda v: v is None or _is_num(v), "a number"),
    "train_batch_size": (lambda v: v is None or _is_int(v), "an integer"),
    "num_train_epochs": (lambda v: v is None or _is_num(v), "a number"),
    "num_input_tokens_seen": (lambda v: v is None or _is_num(v), "a number"),
    "total_flos": (lambda v: v is None or _is_num(v), "a number"),
    "log_history": (lambda v: isinstance(v, list) and all(isinstance(r, dict) for r in v), "a list of objects"),
    "best_metric": (lambda v: v is None or _is_num(v), "a number"),
    "best_global_step": (lambda v: v is None or _is_int(v), "an integer"),
    "best_model_checkpoint": (lambda v: v is None or isinstance(v, str), "a string"),
    "is_local_process_zero": (lambda v: isinstance(v, bool), "true or false"),
    "is_world_process_zero": (lambda v: isinstance(v, bool), "true or false"),
    "is_hyper_param_search": (lambda v: isinstance(v, bool), "true or false"),
    "trial_name": (lambda v: v is None or isinstance(v, str), "a string"),
    "trial_params": (lambda v: v is None or isinstance(v, dict), "an object"),
    "stateful_callbacks": (lambda v: v is None or (isinstance(v, dict) and all(
        all(isinstance(d, dict) and isinstance(d.get("args", {}), dict) and isinstance(d.get("attributes", {}), dict)
            for d in (x if isinstance(x, list) else [x])) for x in v.values())), "an object of callback states"),
}

_STATE_TYPES: dict[str, tuple[Any, str]] = {
    "global_step": (_is_int, "an integer"),
    "cursor": (lambda v: isinstance(v, dict) and _is_int(v.get("epoch")) and _is_int(v.get("pos")), "an object with integer epoch and pos"),
    "generations": (_is_int, "an integer"),
    "gen_metrics": (lambda v: isinstance(v, dict), "an object"),
    "run_id": (lambda v: v is None or isinstance(v, str), "a string"),
    "entropy_control": (lambda v: v is None or isinstance(v, dict), "an object"),
    "dynamic_sampling": (lambda v: v is None or (isinstance(v, dict) and all(_is_int(v.get(k, 0)) for k in (
        "steps", "rounds", "groups", "spread"))), "an object of integer counts"),
    "prompt_sampler": (lambda v: v is None or (isinstance(v, dict) and isinstance(v.get("name"), str)
                                               and isinstance(v.get("state"), dict)), "an object with name and state"),
}


def _check_fields(name: str, data: Any, types: dict[str, tuple[Any, str]], required: tuple[str, ...],
                  known_only: bool) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise _Damaged(f"{name} holds {type(data).__name__}, not a JSON object")
    for key in required:
        if key not in data:
            raise _Damaged(f"{name} has no {key}")
    for key, value in data.items():
        if key in types:
            ok, what = types[key]
            if not ok(value):
                raise _Damaged(f"{name}: {key} is {json.dumps(value)[:40]}, not {what}")
        elif known_only:
            raise _Damaged(f"{name} has a field transformers does not know: {key!r}")
    if "global_step" in data and data["global_step"] < 0:
        raise _Damaged(f"{name}: global_step is {data['global_step']}")
    return data


def _check_safetensors(path: str) -> None:
    """The header's tensors end exactly where the file ends (a cut file is shorter)."""
    name = os.path.basename(path)
    size = _regular(path).st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise _Damaged(f"{name} is truncated ({size} bytes)")
        n = struct.unpack("<Q", head)[0]
        if n > min(size - 8, _MAX_HEADER):
            raise _Damaged(f"{name} is truncated or not a safetensors file (its header claims {n} bytes of {size})")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            raise _Damaged(f"{name} has an unreadable header (not a safetensors file)") from None
    if not isinstance(header, dict):
        raise _Damaged(f"{name} has an unreadable header (not a safetensors file)")
    end = 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets) and 0 <= offsets[0] <= offsets[1]):
            raise _Damaged(f"{name} has an unreadable header entry for {key!r}")
        end = max(end, offsets[1])
    expected = 8 + n + end
    if size < expected:
        raise _Damaged(f"{name} is truncated ({size} bytes; its header says {expected})")
    if size > expected:
        raise _Damaged(f"{name} has {size - expected} bytes more than its header says")


def _check_torch_file(path: str) -> None:
    """A ``torch.save`` file is a zip archive: a cut one has lost its central directory."""
    name = os.path.basename(path)
    size = _regular(path).st_size
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        raise _Damaged(f"{name} is truncated or not a file torch.save wrote ({size} bytes, no complete zip archive)") from None
    if not infos or any(i.header_offset + i.compress_size > size for i in infos):
        raise _Damaged(f"{name} is truncated ({size} bytes)")


def _check_weights(path: str) -> None:
    present = [f for f in WEIGHT_FILES if os.path.lexists(os.path.join(path, f))]
    if not present:
        if any(os.path.isdir(os.path.join(path, n)) for n in os.listdir(path)):
            return  # adapters in sub-folders, FSDP shards: transformers checks those itself
        raise _Damaged(f"there are no model weights ({WEIGHT_FILES[0]})")
    for f in present:
        full = os.path.join(path, f)
        if f.endswith(".index.json"):
            index = _read_json(full, _MAX_INDEX)
            shards = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(shards, dict) or not all(isinstance(v, str) for v in shards.values()):
                raise _Damaged(f"{f} has no weight_map of shard files")
            for shard in sorted(set(shards.values())):
                if os.path.basename(shard) != shard or not os.path.lexists(os.path.join(path, shard)):
                    raise _Damaged(f"{shard}, named by {f}, is missing")
                (_check_safetensors if shard.endswith(".safetensors") else _check_torch_file)(os.path.join(path, shard))
        elif f.endswith(".safetensors"):
            _check_safetensors(full)
        else:
            _check_torch_file(full)


def _optimizer_missing(path: str) -> list[str]:
    """The training-state files (optimizer, LR scheduler, RNG) a checkpoint lacks."""
    names = os.listdir(path)
    if any(n.startswith("global_step") or n.startswith("optimizer") and os.path.isdir(os.path.join(path, n)) for n in names):
        return []  # DeepSpeed / FSDP keep the optimizer in folders of their own
    missing = []
    if "optimizer.pt" not in names and "optimizer.bin" not in names:
        missing.append("optimizer.pt")
    if "scheduler.pt" not in names:
        missing.append("scheduler.pt")
    if not any(re.match(r"^rng_state(_\d+)?\.pth$", n) for n in names):
        missing.append("rng_state.pth")
    return missing


def _damage(path: str, without_optimizer: bool) -> tuple[str | None, dict[str, Any]]:
    """(what is wrong with the checkpoint ``path`` or None, its rlcore state)."""
    try:
        tstate = _check_fields("trainer_state.json", _read_json(os.path.join(path, "trainer_state.json"), _MAX_TRAINER_STATE),
                               _TRAINER_STATE_TYPES, ("global_step",), known_only=True)
        if not os.path.lexists(os.path.join(path, STATE_FILE)):
            raise _Damaged(f"{STATE_FILE} (rlcore's data position and run id) is missing")
        state = _check_fields(STATE_FILE, _read_json(os.path.join(path, STATE_FILE), _MAX_STATE), _STATE_TYPES,
                              ("global_step",), known_only=False)
        if state["global_step"] != tstate["global_step"]:
            raise _Damaged(f"{STATE_FILE} is of step {state['global_step']}, trainer_state.json of step {tstate['global_step']}")
        _check_weights(path)
        for name in sorted(os.listdir(path)):
            if name in ("optimizer.pt", "scheduler.pt", "scaler.pt", BUFFER_FILE) or re.match(r"^rng_state(_\d+)?\.pth$", name):
                _check_torch_file(os.path.join(path, name))
    except _Damaged as exc:
        return str(exc), {}
    missing = _optimizer_missing(path)
    if missing and not without_optimizer:
        return ("missing:" + ", ".join(missing)), state
    return None, state


def _intact_before(path: str, without_optimizer: bool) -> str | None:
    """The newest checkpoint beside ``path`` (same folder, an earlier step) that passes the checks."""
    parent = os.path.dirname(os.path.normpath(path))
    step = checkpoint_step(path)
    for name in reversed(checkpoints_in(parent)):
        other = os.path.join(parent, name)
        if int(name.split("-")[1]) < step and _damage(other, without_optimizer)[0] is None:
            return other
    return None


def validate_checkpoint(path: str, without_optimizer: bool = False) -> dict[str, Any]:
    """Check ``path`` before a resume loads anything from it: every required file there (trainer
    state, rlcore state, model weights; the optimizer, LR scheduler and RNG state unless
    ``without_optimizer``), each a regular file of a plausible size (JSON read to a bound, never a
    link to ``/dev/zero``), JSON of the right types, safetensors and torch files complete. Returns
    the rlcore state; raises one ConfigError line naming what is wrong and the newest earlier
    checkpoint that is intact. Why here: each of these faults was a 42–55-line traceback after the
    model loaded, or a silent resume with a fresh optimizer."""
    problem, state = _damage(path, without_optimizer)
    if problem is None:
        missing = _optimizer_missing(path)
        if missing:
            import logging

            logging.getLogger(__name__).warning(
                "%s has no %s: resuming with a fresh optimizer, LR schedule and RNG (resume_without_optimizer_state)",
                path, ", ".join(missing))
        return state
    other = _intact_before(path, without_optimizer)
    if problem.startswith("missing:"):
        names = problem.partition(":")[2]
        alt = f", or resume {other}, which has them" if other else ""
        raise ConfigError(f"{path} has no {names} (the optimizer, LR-scheduler and RNG state a resume continues "
                          f"with); pass --resume-without-optimizer-state true to go on with a fresh optimizer, LR "
                          f"schedule and RNG{alt}")
    alt = (f"the newest intact checkpoint is {other} (--resume_from_checkpoint {other})" if other
           else f"no earlier checkpoint in {os.path.dirname(os.path.normpath(path))} is intact")
    raise ConfigError(f"{path} is damaged: {problem}; {alt}")
