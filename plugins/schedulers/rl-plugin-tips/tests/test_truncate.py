"""The token-space cut: kept tokens are a prefix of the sampled ones, text lines up with the marker."""

from __future__ import annotations

from rl_plugin_tips.truncate import cut_before_marker, find_marker


def test_find_marker_takes_the_earliest() -> None:
    assert find_marker("a<answer>b</think>", ("</think>", "<answer>")) == (1, "<answer>")
    assert find_marker("plain", ("</think>",)) == (5, None)


def test_cut_at_think_close_keeps_exact_prefix(tokenizer) -> None:
    text = "<think>3 + 4 = 8 so the answer is 8</think><answer>8</answer>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    lps = [-0.1 * (i + 1) for i in range(len(ids))]
    cut = cut_before_marker(tokenizer, ids, lps, ("</think>", "<answer>"))
    k = len(cut.kept_ids)
    assert cut.kept_ids == ids[:k] and cut.kept_logprobs == lps[:k]
    assert cut.marker == "</think>" and cut.bridge == ""  # </think> is a single special token here
    assert cut.kept_text + cut.bridge == "<think>3 + 4 = 8 so the answer is 8"


def test_straddling_token_becomes_bridge_text(tokenizer) -> None:
    """A marker that starts inside a token: that token is dropped (it was not all before the
    marker) and the part of it before the marker comes back as bridge text, never re-tokenised
    into the kept ids."""
    text = "the total answer is 8"
    ids = tokenizer.encode(text, add_special_tokens=False)
    marker = "nswer"  # starts inside the token(s) that spell "answer"
    cut = cut_before_marker(tokenizer, ids, None, (marker,))
    pos = text.index(marker)
    assert cut.kept_ids == ids[: len(cut.kept_ids)]
    assert len(tokenizer.decode(cut.kept_ids)) <= pos
    assert cut.kept_text + cut.bridge == text[:pos] and cut.bridge.endswith("a")
    assert cut.kept_logprobs == [None] * len(cut.kept_ids)  # no logprobs given: none invented


def test_no_marker_keeps_everything(tokenizer) -> None:
    ids = tokenizer.encode("just 8", add_special_tokens=False)
    cut = cut_before_marker(tokenizer, ids, [-1.0] * len(ids), ("</think>",))
    assert cut.kept_ids == ids and cut.marker is None and cut.bridge == ""


def test_marker_at_start_keeps_nothing(tokenizer) -> None:
    ids = tokenizer.encode("<answer>8</answer>", add_special_tokens=False)
    cut = cut_before_marker(tokenizer, ids, [-1.0] * len(ids), ("<answer>",))
    assert cut.kept_ids == [] and cut.kept_text == "" and cut.bridge == ""
