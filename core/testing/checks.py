"""Checks for tests of schedulers: each trajectory trains on exactly the conversation it reports."""

from __future__ import annotations

from typing import Any, Sequence

#: ChatML, except that assistant messages before the last user message lose their ``<think>`` block
#: (the last one keeps it): what Qwen3-style templates do. Such a template is not prefix-preserving;
#: set it as ``tokenizer.chat_template`` to test how a scheduler behaves on one.
THINK_DROPPING_TEMPLATE = (
    "{% set ns = namespace(last_user=-1) %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{% for message in messages %}"
    "{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip() %}{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ content }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def assert_token_exact(trajectories: Sequence[Any], tokenizer: Any) -> None:
    """Fail unless every trajectory is ``ok`` or ``truncated``, rlcore's invariant checker finds
    nothing, and — checked independently of that checker — each trajectory's tokens decode to the
    chat template's rendering of its final messages, up to the closing after the last reply when
    the model did not sample it. For a scheduler's tests: a wrong token, mask or message shows here
    whatever the scheduler claims."""
    from rlcore.rollout import check_batch

    assert trajectories, "no trajectories to check"
    problems = check_batch(list(trajectories), tokenizer)
    assert not problems, problems
    for t in trajectories:
        assert t.status in ("ok", "truncated"), (t.status, t.reason)
        text = tokenizer.decode(t.input_ids, skip_special_tokens=False)
        want = tokenizer.apply_chat_template(t.messages, tokenize=False)
        assert want.startswith(text) and want[len(text):].strip() in ("", tokenizer.eos_token), (text, want)
