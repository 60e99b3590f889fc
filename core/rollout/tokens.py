"""Moved to :mod:`rlcore.chat_template` (the data and rollout layers both encode with the chat
template, so it lives below both); this name stays importable for plugins written against it."""

from ..chat_template import (
    ChatTemplateError,
    render,
    encode_text,
    encode_prompt,
    template_delta,
    not_prefix_error,
    encode_observation,
    assistant_closing,
    generic_assistant_closing,
    decode,
    sampled_prefix_len,
)

__all__ = ['ChatTemplateError', 'render', 'encode_text', 'encode_prompt', 'template_delta', 'not_prefix_error', 'encode_observation', 'assistant_closing', 'generic_assistant_closing', 'decode', 'sampled_prefix_len']
