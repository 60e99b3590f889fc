"""One trajectory's session: each request the agent makes becomes exact tokens of its trajectory.

How a request is served (on the trajectory's own event loop, one request of a session at a time):

1. The messages are read in the template's shape (:mod:`~rl_plugin_agents.openai_format`). Every
   assistant message the agent sends back *as the proxy returned it* (same content, reasoning
   and calls; call ids aside) stands for the tokens that were sampled for it: it is replaced by
   the message as the trajectory recorded it (the sampled text, or the tool-call message the
   template renders exactly as sampled), so the model is shown what it really wrote.
2. The first request is the trajectory's prompt: its rendering (with the request's ``tools``) is
   the prompt the sampler gets.
3. A later request whose messages **extend** the conversation recorded so far is appended to the
   token stream: the template's delta for the new messages, loss mask 0
   (:class:`rlcore.rollout.stream.TokenStream`, which also starts a per-turn sample where the
   template itself rewrites history under ``multi_turn_mode`` auto). One whose rendering still
   starts with the tokens recorded so far (the agent re-serialized a message the same way) is
   appended as the rest of that rendering.
4. Anything else (the agent edited, dropped or compacted earlier messages) starts a **new
   sample**: its prompt is the rendering of the request as sent (a ``"prompt"`` turn,
   :meth:`rlcore.types.Turn.restart`), and the conversation the earlier samples belong to is kept in
   ``infos["sample_messages"]`` so each sample is checked against its own conversation.
5. The reply is sampled by the run's sampler with the run's sampling parameters, recorded with its
   logprobs, read by the family's tool-call parser into ``content`` and ``tool_calls``, and returned.

Every trained token is thus a sampled token, and each sample's prompt is exactly what the sampler
was given; the driver's invariant checker holds every sample to it.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import re
from typing import Any

from rlcore import chat_template as tk
from rlcore.errors import RlcoreError, SamplerError
from rlcore.rollout.tools import tool_call_message
from rlcore.types import Trajectory, Turn

from .openai_format import ChatRequest, ProxyError, Reply, new_call_id, parse_request, same_reply

_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.DOTALL)
_CALL_BLOCK = re.compile(r"<tool_call>.*?(?:</tool_call>|$)", re.DOTALL)


class Session:
    """The proxy's state for one trajectory (created by the scheduler's ``run``)."""

    def __init__(self, scheduler: Any, trajectory: Trajectory, loop: asyncio.AbstractEventLoop) -> None:
        self.scheduler = scheduler
        self.trajectory = trajectory
        self.loop = loop
        self.model_name = scheduler.model_name
        self.lock = asyncio.Lock()
        self.requests = 0
        #: a failure the run cannot train past (the trajectory fails with it, whatever the agent does)
        self.fatal: str | None = None
        #: the last request that was refused, with why (the agent may have given up on it)
        self.last_error: str | None = None
        self.tools: list[dict[str, Any]] | None = None
        self.started = False
        #: set once the trajectory's agent is done: a request still arriving is refused
        self.closed = False
        #: (the reply as returned, normalized; the message recorded for it; its conversation; its index there)
        self.replies: list[tuple[dict[str, Any], dict[str, Any], int, int]] = []
        #: which conversation the trajectory's messages are (a new one after each rewrite)
        self.conversation = 0
        self.stats = {"appended": 0, "rerendered": 0, "new_samples": 0, "sampling_ignored": 0, "tool_choice_unmet": 0}

    # --- the entry point ------------------------------------------------------------------------------
    async def serve(self, body: Any) -> Reply:
        async with self.lock:
            try:
                return await self._serve(body)
            except ProxyError as exc:
                self.last_error = f"HTTP {exc.status}: {exc.message}"
                if exc.fatal and self.fatal is None:
                    self.fatal = exc.message
                raise

    async def _serve(self, body: Any) -> Reply:
        traj = self.trajectory
        sched = self.scheduler
        if self.closed:
            raise ProxyError(401, "the trajectory of this API key has ended", kind="authentication_error")
        if self.fatal is not None:
            raise ProxyError(409, f"this trajectory already failed: {self.fatal}", code="trajectory_failed")
        if traj.status != "running":
            raise ProxyError(409, f"this trajectory has ended ({traj.status})", code="trajectory_ended")
        self.requests += 1
        if sched.max_requests is not None and self.requests > sched.max_requests:
            raise ProxyError(429, f"this trajectory made {self.requests} requests; max_requests is {sched.max_requests}",
                             kind="rate_limit_error", code="max_requests", fatal=True)
        req = parse_request(body)
        params = self._params(req)
        tools = req.tools
        if not self.started:
            self.tools = tools
        elif tools != self.tools:
            raise ProxyError(400, "the tools changed since this trajectory's first request; one trajectory trains one "
                             "tool set (the chat template renders the tools into every prompt)", param="tools")
        messages = self._canonical(req.messages)
        tok = sched._require_tokenizer()
        try:
            rendered = tk.render(tok, messages, add_generation_prompt=True, tools=tools)
        except tk.ChatTemplateError as exc:
            raise ProxyError(400, str(exc), param="messages") from None
        if sched.max_request_tokens is not None:
            n = len(tk.encode_text(tok, rendered))
            if n > sched.max_request_tokens:
                raise ProxyError(400, f"the request renders to {n} tokens; max_request_tokens is {sched.max_request_tokens}",
                                 param="messages", code="context_length_exceeded")
        if not self.started:
            self._start(messages, rendered)
        else:
            self._extend_or_restart(messages, rendered)
        prompt_len = len(traj.sample_input_ids)
        try:
            completion = await sched.generate(traj, params)
        except SamplerError as exc:
            raise ProxyError(500, f"the sampler failed: {exc}", kind="server_error", fatal=True) from None
        except (RlcoreError, ValueError) as exc:
            raise ProxyError(500, f"{type(exc).__name__}: {exc}", kind="server_error", fatal=True) from None
        traj.num_turns += 1
        recorded = copy.deepcopy(traj.messages[-1])
        reply = self._reply(req, completion, recorded, prompt_len)
        self.replies.append((_returned_form(reply), recorded, self.conversation, len(traj.messages) - 1))
        return reply

    # --- sampling parameters ----------------------------------------------------------------------------
    def _params(self, req: ChatRequest) -> Any:
        """The run's sampling parameters for this request: the agent's ``max_tokens`` (at most the
        run's), its stop strings added, its seed; a field that would change the distribution the
        tokens are drawn from is refused (or, with ``agent_sampling="ignore"``, counted and not used)."""
        sched = self.scheduler
        base = sched.sampling_params
        run = {"temperature": base.temperature, "top_p": base.top_p, "top_k": base.top_k if base.top_k > 0 else None,
               "min_p": base.min_p or None, "repetition_penalty": base.repetition_penalty, "presence_penalty": 0.0,
               "frequency_penalty": 0.0, "logit_bias": None}
        for key, value in req.sampling.items():
            have = run.get(key)
            same = value == have or (key == "top_k" and value in (0, -1) and have is None) or (
                key == "logit_bias" and not value) or (
                isinstance(value, (int, float)) and isinstance(have, (int, float)) and math.isclose(value, have, abs_tol=1e-6))
            if same:
                continue
            if sched.agent_sampling == "ignore":
                self.stats["sampling_ignored"] += 1
                continue
            raise ProxyError(400, f"{key}={value!r}: this run samples with {key}={have!r} (the trainer scores the policy "
                             f"at the run's sampling parameters); leave {key} out, send the run's value, or run with "
                             "--agent-sampling ignore to sample every request with the run's parameters", param=key)
        params = base
        if req.max_tokens is not None:
            params = params.replace(max_tokens=min(int(params.max_tokens), int(req.max_tokens)))
        if req.stop:
            params = params.replace(stop=list(params.stop) + [s for s in req.stop if s not in params.stop])
        if req.seed is not None:
            params = params.replace(seed=int(req.seed))
        return params

    # --- messages -> the token stream ------------------------------------------------------------------
    def _canonical(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each assistant message that is a returned reply, as the trajectory recorded it: the
        message at its place in the current conversation when it is sent back at that place (the
        token stream may have given it the tool-call form there), else as it was sampled."""
        current = self.trajectory.messages
        out = []
        for i, m in enumerate(messages):
            if m.get("role") == "assistant":
                for returned, recorded, conversation, index in reversed(self.replies):
                    if same_reply(m, returned):
                        here = conversation == self.conversation and index == i and i < len(current)
                        out.append(copy.deepcopy(current[i] if here else recorded))
                        break
                else:
                    out.append(m)
            else:
                out.append(m)
        return out

    def _start(self, messages: list[dict[str, Any]], rendered: str) -> None:
        """The first request: its rendering is the trajectory's prompt."""
        traj = self.trajectory
        tok = self.scheduler._require_tokenizer()
        traj.messages[:] = copy.deepcopy(messages)
        traj.prompt_ids = tk.encode_text(tok, rendered)
        traj.infos.pop("prompt_truncated", None)
        traj.infos["prompt_messages"] = len(messages)
        if self.tools:
            traj.infos["template_tools"] = copy.deepcopy(self.tools)
        self.started = True

    def _extend_or_restart(self, messages: list[dict[str, Any]], rendered: str) -> None:
        traj = self.trajectory
        sched = self.scheduler
        tok = sched._require_tokenizer()
        current = traj.messages
        if len(messages) > len(current) and messages[:len(current)] == current:
            traj.messages[:] = copy.deepcopy(messages)  # the stream appends the new messages at the next generate
            self.stats["appended"] += 1
            return
        st = sched.stream(traj)
        so_far = tk.decode(tok, traj.sample_input_ids)
        k = sum(1 for t in traj.turns if t.is_restart)  # the sample being built
        if len(rendered) > len(so_far) and rendered.startswith(so_far):
            # the rendering goes on from this sample's tokens: the rest of it is appended; the samples
            # before this one keep the conversation they were made in
            self._pin(k - 1)
            rest = rendered[len(so_far):]
            first_new = next((m for a, m in zip(current, messages) if a != m), messages[min(len(current), len(messages) - 1)])
            traj.turns.append(Turn.observation(tk.encode_text(tok, rest), role=str(first_new.get("role") or "user"), text=rest))
            self.stats["rerendered"] += 1
        else:
            self._pin(k)
            traj.turns.append(Turn.restart(tk.encode_text(tok, rendered), messages=len(messages), text=rendered))
            self.stats["new_samples"] += 1
        traj.messages[:] = copy.deepcopy(messages)
        self.conversation += 1
        # the stream now stands at the end of this rendering, no assistant message open
        st.synced = copy.deepcopy(messages)
        st.open = False
        st.gen_start = len(traj.turns)
        st.head = (len(messages), rendered)
        st.closed_ids = {}
        st.last_sample = None
        st.base_content = ""

    def _pin(self, last: int) -> None:
        """Samples ``0..last`` keep the conversation as it stands (``infos["sample_messages"]``;
        ``None`` there means the trajectory's final messages)."""
        if last < 0:
            return
        samples = self.trajectory.infos.setdefault("sample_messages", [])
        while len(samples) <= last:
            samples.append(None)
        for j in range(last + 1):
            if samples[j] is None:
                samples[j] = copy.deepcopy(list(self.trajectory.messages))

    # --- the answer ---------------------------------------------------------------------------------------
    def _reply(self, req: ChatRequest, completion: Any, recorded: dict[str, Any], prompt_len: int) -> Reply:
        sched = self.scheduler
        text = str(completion.text or "")
        for s in req.stop + list(sched.sampling_params.stop):
            cut = text.find(s) if s else -1
            if cut >= 0:
                text = text[:cut]
        reasoning = None
        if isinstance(recorded.get("reasoning_content"), str) and recorded["reasoning_content"]:
            reasoning = recorded["reasoning_content"]
            text = str(recorded.get("content") or "")
        else:
            m = _THINK.match(text)
            if m is not None:
                reasoning, text = m.group(1).strip("\n"), text[m.end():]
        calls: list[dict[str, Any]] = []
        if req.tools and req.tool_choice != "none":
            found = [c for c in sched.parse_calls(self.trajectory, str(completion.text or "")) if c.error is None]
            if found:
                calls = [{"id": new_call_id(), "type": "function",
                          "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}} for c in found]
                text = _CALL_BLOCK.sub("", text).strip() if "<tool_call>" in text else ("" if text.lstrip().startswith("{") else text)
            elif req.tool_choice == "required" or isinstance(req.tool_choice, dict):
                self.stats["tool_choice_unmet"] += 1
        finish = "tool_calls" if calls else ("length" if completion.finish_reason == "length" else "stop")
        lps = None
        if req.logprobs:
            tok = sched._require_tokenizer()
            lps = [{"token": tk.decode(tok, [t]), "logprob": float(lp) if lp is not None else None,
                    "bytes": list(tk.decode(tok, [t]).encode("utf-8")), "top_logprobs": []}
                   for t, lp in zip(completion.token_ids, completion.logprobs or [None] * len(completion.token_ids))]
        return Reply(content=text if (text or not calls) else None, tool_calls=calls, finish_reason=finish,
                     prompt_tokens=prompt_len, completion_tokens=len(completion.token_ids), model=req.model or self.model_name,
                     reasoning=reasoning, logprobs=lps)


def _returned_form(reply: Reply) -> dict[str, Any]:
    """The reply as an agent sends it back, normalized like request messages."""
    msg: dict[str, Any] = {"role": "assistant", "content": reply.content or ""}
    if reply.tool_calls:
        msg["tool_calls"] = [{"type": "function", "function": {"name": c["function"]["name"],
                                                               "arguments": json.loads(c["function"]["arguments"])}}
                             for c in reply.tool_calls]
    if reply.reasoning:
        msg["reasoning_content"] = reply.reasoning
    return msg


def tool_call_reader(scheduler: Any, trajectory: Trajectory) -> Any:
    """The token stream's ``reader``: a reply with calls as the tool-call message (kept in that
    form only where the template then renders it exactly as sampled)."""
    return lambda text: tool_call_message(scheduler.parse_calls(trajectory, text))
