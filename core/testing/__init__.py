"""Offline test helpers: tiny models and tokenizers built locally, and pytest fixtures for plugins."""

from .tiny import SIZES, build_model_dir, build_tokenizer, load_tiny, tiny_model_path

__all__ = ["SIZES", "build_model_dir", "build_tokenizer", "load_tiny", "tiny_model_path"]
