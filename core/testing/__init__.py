"""Offline test helpers: tiny models and tokenizers built locally, and pytest fixtures for plugins."""

from pathlib import Path
from typing import Any

from .checks import THINK_DROPPING_TEMPLATE, assert_token_exact
from .logprob_reference import recompute_logprobs
from .scripted import ScriptedSampler, fake_logprob
from ..data.demo import ARCHS, SIZES, build_model_dir, build_tokenizer, load_tiny, tiny_model_path

__all__ = ["ARCHS", "SIZES", "THINK_DROPPING_TEMPLATE", "ScriptedSampler", "assert_token_exact", "fake_logprob", "build_model_dir", "build_tokenizer",
           "load_script", "load_tiny", "recompute_logprobs", "tiny_model_path"]


def load_script(path: str | Path, name: str | None = None) -> Any:
    """Import a script that is not on the path (an example's ``loop.py``) as a module, so a test can
    call its functions exactly as the script's ``main`` does."""
    import importlib.util

    path = Path(path)
    spec = importlib.util.spec_from_file_location(name or f"script_{path.parent.name}_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
