"""Offline test helpers: tiny models and tokenizers built locally, and pytest fixtures for plugins."""

from .scripted import ScriptedSampler, fake_logprob
from ..demo import SIZES, build_model_dir, build_tokenizer, load_tiny, tiny_model_path

__all__ = ["SIZES", "ScriptedSampler", "fake_logprob", "build_model_dir", "build_tokenizer", "load_tiny", "tiny_model_path"]
