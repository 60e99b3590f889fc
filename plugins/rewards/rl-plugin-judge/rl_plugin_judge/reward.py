"""``llm_judge``: a reward that asks a language model to grade each completion against a rubric.

Two judges, one reward, chosen by the options given:

* ``judge_url=URL`` — any OpenAI-compatible chat-completions server (``judge_model`` names the
  served model; the API key comes from the environment variable ``api_key_env``);
* ``judge_model=PATH`` alone — a generative reward model run in-process (a model directory, a
  ``.gguf`` file or a Hugging Face id), loaded once when the reward is built, asked in batches.

Each completion becomes one question (the rubric filled in with its prompt, completion and dataset
columns); identical questions — the same completion twice in a group, or again in a later step —
are asked once (:mod:`rl_plugin_judge.cache`). The score found in the reply
(:mod:`rl_plugin_judge.parse`) is scaled to ``[0, 1]``.

A question the judge could not answer (after retries) or whose reply holds no score gives its sample
``None``: rlcore leaves it out of the advantages and counts it in ``reward_errors/llm_judge``, the
first such error is printed once per run, and the run goes on. As for any reward, a batch on which
*every* sample failed stops the run with one line naming the cause (a judge that is down, a rubric
the judge never answers in the expected format): training on nothing must not look like training.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rlcore import hookimpl
from rlcore.errors import ConfigError
from rlcore.rewards import Reward

from .cache import VerdictCache, cache_key
from .endpoint import EndpointJudge, JudgeError
from .parse import DEFAULT_PATTERNS, compile_pattern, parse_score
from .rubric import BUILT_IN_FIELDS, DEFAULT_RUBRIC, prompt_text, render, rubric_fields


def _number(value: float) -> str:
    return f"{value:g}"


class LLMJudge(Reward):
    """Scores each completion by asking a judge model; ``None`` (a counted reward error) where the
    judge fails or its reply holds no score. See the module docstring and docs/plugins/judge.md."""

    name = "llm_judge"

    def __init__(
        self,
        judge_url: str | None = None,
        judge_model: str | None = None,
        rubric: str | None = None,
        rubric_file: str | None = None,
        judge_system_prompt: str | None = None,
        score_pattern: str | None = None,
        max_score: float = 10.0,
        min_score: float = 0.0,
        api_key_env: str = "OPENAI_API_KEY",
        max_concurrency: int = 8,
        judge_timeout: float = 60.0,
        retries: int = 2,
        retry_backoff: float = 0.5,
        max_new_tokens: int = 256,
        judge_temperature: float = 0.0,
        judge_batch_size: int = 8,
        judge_device: str | None = None,
        cache_path: str | None = None,
    ) -> None:
        if not judge_url and not judge_model:
            raise ConfigError("llm_judge needs a judge: judge_url=URL (an OpenAI-compatible server; judge_model names its "
                              "model) or judge_model=PATH alone (a local model run in-process), e.g. "
                              "--judge-url http://127.0.0.1:8000/v1 --judge-model Qwen/Qwen3-8B")
        if rubric is not None and rubric_file is not None:
            raise ConfigError("llm_judge: give rubric or rubric_file, not both")
        if rubric_file is not None:
            try:
                rubric = Path(rubric_file).expanduser().read_text(encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"llm_judge: cannot read rubric_file {rubric_file} ({exc.strerror or exc})") from None
        self.rubric = DEFAULT_RUBRIC if rubric is None else str(rubric)
        self.fields = rubric_fields(self.rubric)
        if "completion" not in self.fields:
            raise ConfigError("llm_judge: the rubric never shows the judge the completion; put {completion} in it")
        if not max_score > min_score:
            raise ConfigError(f"llm_judge: max_score ({max_score:g}) must be above min_score ({min_score:g})")
        for option, value, least in (("max_concurrency", max_concurrency, 1), ("retries", retries, 0),
                                     ("max_new_tokens", max_new_tokens, 1), ("judge_batch_size", judge_batch_size, 1)):
            if int(value) != value or value < least:
                raise ConfigError(f"llm_judge: {option} must be a whole number of at least {least}, got {value}")
        if not judge_timeout > 0:
            raise ConfigError(f"llm_judge: judge_timeout must be a positive number of seconds, got {judge_timeout}")
        if not retry_backoff >= 0:
            raise ConfigError(f"llm_judge: retry_backoff must be zero or more seconds, got {retry_backoff}")
        try:
            self.patterns = (compile_pattern(score_pattern),) if score_pattern else DEFAULT_PATTERNS
        except Exception as exc:  # re.error
            raise ConfigError(f"llm_judge: score_pattern {score_pattern!r} is not a regular expression ({exc})") from None
        self.max_score, self.min_score = float(max_score), float(min_score)
        self.system_prompt = judge_system_prompt
        if judge_url:
            self.judge: Any = EndpointJudge(
                judge_url, judge_model, api_key=os.environ.get(api_key_env) if api_key_env else None, timeout=judge_timeout,
                retries=int(retries), backoff=retry_backoff, max_tokens=int(max_new_tokens), temperature=judge_temperature,
                max_concurrency=int(max_concurrency))
        else:
            if judge_temperature != 0:
                raise ConfigError("llm_judge: the in-process judge (judge_model without judge_url) decodes greedily; "
                                  "judge_temperature applies to a judge_url server only")
            from .local import LocalJudge

            self.judge = LocalJudge(str(judge_model), max_new_tokens=int(max_new_tokens), batch_size=int(judge_batch_size),
                                    device=judge_device)
        self.cache = VerdictCache(cache_path)
        self.errors = 0
        # counters over the run (each step's share goes to the step's metrics too)
        self.calls = 0  # questions sent to the judge
        self.cache_hits = 0  # samples scored without a question of their own
        self.call_errors = 0  # questions the judge did not answer
        self.parse_errors = 0  # replies with no score in them
        self._failures: list[BaseException] = []

    # --- the hook: rlcore's scoring, plus this reward's per-sample failures ----------------------------
    @hookimpl
    async def compute_reward(self, trajectories: list[Any]) -> dict[str, list[float | None]]:
        """rlcore's own scoring of :meth:`score`; the samples the judge failed on are then counted as
        reward errors (``reward_errors/llm_judge``) with their causes, as if they had raised."""
        self._failures = []
        out = await Reward.compute_reward(self, trajectories)
        self.errors += len(self._failures)
        self.last_failures = [*getattr(self, "last_failures", []), *self._failures]
        self._failures = []
        return out

    def questions(self, prompts: list[Any], completions: list[str], trajectories: list[Any]) -> list[Any]:
        """The judge's messages for each sample, or the :class:`JudgeError` that says why there are none."""
        columns = [f for f in self.fields if f not in BUILT_IN_FIELDS]
        for col in columns:
            if not any(col in (t.data or {}) for t in trajectories):
                have = sorted({k for t in trajectories for k in (t.data or {})})
                raise ConfigError(f"llm_judge: the rubric names {{{col}}}, which is neither prompt, completion, max_score "
                                  f"nor a column of this dataset (columns: {', '.join(have) or 'none'})")
        out: list[Any] = []
        for p, c, t in zip(prompts, completions, trajectories):
            data = t.data or {}
            missing = [col for col in columns if col not in data]
            if missing:
                out.append(JudgeError(f"this row has no {', '.join(repr(m) for m in missing)} for the rubric"))
                continue
            fields = {col: data[col] for col in columns}
            fields.update(prompt=prompt_text(p), completion=c or "", max_score=_number(self.max_score))
            messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
            messages.append({"role": "user", "content": render(self.rubric, fields)})
            out.append(messages)
        return out

    async def score(self, prompts: list[Any], completions: list[str], trajectories: list[Any]) -> list[float | None]:
        questions = self.questions(prompts, completions, trajectories)
        n = len(questions)
        results: list[float | BaseException | None] = [None] * n
        replies: list[str | None] = [None] * n
        keys: list[str | None] = [None] * n
        to_ask: dict[str, list[dict[str, Any]]] = {}  # key -> messages, each asked once
        for i, q in enumerate(questions):
            if isinstance(q, JudgeError):
                results[i] = q
                continue
            key = keys[i] = cache_key(self.judge.identity, q)
            if self.cache.get(key) is None:
                to_ask.setdefault(key, q)
        answers = await self.judge.ask_all(list(to_ask.values()))
        verdict: dict[str, float | JudgeError] = {}
        reply_of: dict[str, str] = {}
        fresh: dict[str, tuple[float, str]] = {}
        parse_errors = call_errors = 0
        for key, answer in zip(to_ask, answers):
            if isinstance(answer, JudgeError):
                verdict[key] = answer
                call_errors += 1
                continue
            reply_of[key] = answer
            value = parse_score(answer, self.max_score, self.min_score, self.patterns)
            if value is None:
                short = " ".join(answer.split())[:120]
                verdict[key] = JudgeError(f"no score from {_number(self.min_score)} to {_number(self.max_score)} in the "
                                          f"judge's reply: {short!r}")
                parse_errors += 1
            else:
                verdict[key] = value
                fresh[key] = (value, answer)
        self.cache.put_many(fresh)
        for i, key in enumerate(keys):
            if key is None:
                continue
            cached = self.cache.get(key)
            if key in verdict:
                results[i] = verdict[key]
                replies[i] = reply_of.get(key)
            elif cached is not None:
                results[i], replies[i] = cached
        scored = sum(1 for k in keys if k is not None)
        self.calls += len(to_ask)
        self.cache_hits += scored - len(to_ask)
        self.call_errors += call_errors
        self.parse_errors += parse_errors
        self._report(len(to_ask), scored - len(to_ask), call_errors, parse_errors, replies)
        out: list[float | None] = []
        for r in results:
            if isinstance(r, BaseException):
                self._failures.append(r.with_traceback(None))  # a judge's failure, not a bug: its cause is the message
                out.append(None)
            else:
                out.append(r)
        return out

    def _report(self, calls: int, hits: int, call_errors: int, parse_errors: int, replies: list[str | None]) -> None:
        """This batch's judge counts as step metrics and the judge's replies beside the logged
        completions (inside a trainer; elsewhere the counters on the object are all there is)."""
        context = getattr(self, "context", None)
        log_metric = getattr(context, "log_metric", None)
        if log_metric is not None:
            log_metric(f"{self.name}/calls", float(calls))
            log_metric(f"{self.name}/cache_hits", float(hits))
            log_metric(f"{self.name}/call_errors", float(call_errors))
            log_metric(f"{self.name}/parse_errors", float(parse_errors))
        log_extra = getattr(context, "log_extra", None)
        if log_extra is not None:
            log_extra(f"{self.name}_reply", [r if r is not None else "" for r in replies])
