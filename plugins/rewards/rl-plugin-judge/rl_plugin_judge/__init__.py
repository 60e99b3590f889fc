"""rl-plugin-judge: LLM-as-judge rewards for rlcore.

This module is the plugin (the ``rlcore`` entry point names it). It only registers the name; the
reward lives in :mod:`rl_plugin_judge.reward`, named as a ``"module:attr"`` string, so loading the
plugin imports neither httpx nor transformers until a run asks for the judge.
"""

from __future__ import annotations

from typing import Callable

from rlcore import hookimpl

from .parse import parse_score

__all__ = ["parse_score", "register_rewards"]


@hookimpl
def register_rewards(register: Callable[..., None]) -> None:
    register("llm_judge", "rl_plugin_judge.reward:LLMJudge")
