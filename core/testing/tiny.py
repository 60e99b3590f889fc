"""Moved to :mod:`rlcore.data.demo` (the CLIs' built-in model is product); importable here as before."""

from ..data.demo import (
    ARCHS,
    SIZES,
    FORMAT_VERSION,
    SPECIAL_TOKENS,
    CHAT_TEMPLATE,
    build_tokenizer,
    cache_dir,
    tiny_model_path,
    build_model_dir,
    load_tiny,
)

__all__ = ['ARCHS', 'SIZES', 'FORMAT_VERSION', 'SPECIAL_TOKENS', 'CHAT_TEMPLATE', 'build_tokenizer', 'cache_dir', 'tiny_model_path', 'build_model_dir', 'load_tiny']
