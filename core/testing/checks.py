"""Checks for tests of schedulers: each trajectory trains on exactly the conversation it reports."""

from __future__ import annotations

from typing import Any, Sequence


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
