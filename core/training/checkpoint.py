"""Atomic checkpoints: everything is written into a hidden temporary directory, flushed, and only
then renamed to ``checkpoint-N``. A process killed mid-save leaves a ``.incomplete-*`` directory
that ``resume_from_checkpoint`` never picks (transformers only matches ``checkpoint-<digits>``),
so a resume always loads a complete checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

STATE_FILE = "rlcore_state.json"
BUFFER_FILE = "rlcore_buffer.pt"
INCOMPLETE_PREFIX = ".incomplete-checkpoint-"


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

        torch.save(buffer, os.path.join(checkpoint_dir, BUFFER_FILE))


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

        buffer = torch.load(bpath, weights_only=False)
    return state, buffer
