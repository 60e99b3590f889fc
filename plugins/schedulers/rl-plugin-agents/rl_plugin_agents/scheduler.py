"""``agent_proxy``: train an agent as it is, behind an OpenAI-compatible endpoint.

Each trajectory is one run of the user's agent — a Python callable or a command — against the
run's endpoint (:mod:`~rl_plugin_agents.server`, one per run, 127.0.0.1 only) with an API key of
its own. Every request the agent makes is rendered with the policy's chat template, sampled by the
run's sampler and recorded token-exactly (:mod:`~rl_plugin_agents.session`); the trajectory ends
when the agent returns. Its reward is what the agent returned (reward ``agent_reward``), the run's
reward functions on the final conversation, or both with the run's reward weights.

A crashed, hung or misbehaving agent fails only its own trajectory, with a reason.
"""

from __future__ import annotations

import asyncio
import copy
import os
import weakref
from typing import Any, Callable

from rlcore.errors import ConfigError
from rlcore.rollout.scheduler import RolloutScheduler
from rlcore.rollout.tool_parsers import check_tool_parser_name, make_tool_parser
from rlcore.rollout.tools import parse_reply_calls, warn_if_tools_not_rendered
from rlcore.types import Trajectory

from .agents import AgentFailed, failure, load_agent, read_result, run_callable, run_command, split_command
from .server import ProxyServer
from .session import Session, tool_call_reader

AGENT_SAMPLING = ("refuse", "ignore")


class AgentProxyScheduler(RolloutScheduler):
    """Options:

    * ``agent`` — ``"module:function"`` or a callable: ``async def run(client, row)`` (``client`` an
      ``openai.AsyncOpenAI`` bound to the trajectory's session; a plain ``def`` gets ``openai.OpenAI``
      and runs in a thread); returns the reward, a dict with ``reward``, or None;
    * ``agent_cmd`` — instead, a command run per trajectory (``OPENAI_BASE_URL``/``OPENAI_API_KEY`` in
      its environment, the row as JSON on stdin, its last stdout line JSON with the reward);
      ``agent_cwd`` its working directory;
    * ``agent_timeout`` — seconds an agent may take for its episode (300); then it is cancelled (a
      command's process group killed) and the trajectory fails;
    * ``agent_concurrency`` — at most this many agents at once (default: as many as the run's
      ``rollout_concurrency`` lets in);
    * ``max_requests`` — requests per trajectory (default ``max_turns``, 32); ``max_request_tokens`` —
      the longest rendered request (tokens); ``max_request_bytes`` — the largest HTTP body (8 MiB);
    * ``agent_sampling`` — ``refuse`` (default): a request asking for another temperature, top_p,
      top_k, min_p, penalty or logit bias than the run's is answered 400; ``ignore``: such fields
      are counted and every request is sampled with the run's parameters;
    * ``tool_parser`` — how replies are read into ``tool_calls`` (default ``auto``: the family's own);
    * ``model_name`` — the model id ``/v1/models`` lists (default: the run's model name).
    """

    name = "agent_proxy"
    default_max_turns = 32

    def __init__(self, sampler: Any = None, max_turns: int | None = None, *, agent: Any = None, agent_cmd: Any = None,
                 agent_cwd: str | None = None, agent_timeout: float = 300.0, agent_concurrency: int | None = None,
                 max_requests: int | None = None, max_request_tokens: int | None = None,
                 max_request_bytes: int = 8 << 20, agent_sampling: str = "refuse", tool_parser: str = "auto",
                 model_name: str | None = None, **kwargs: Any) -> None:
        if kwargs.get("tools") is not None:
            raise ConfigError("agent_proxy takes no tools option: each request carries its own tools (the agent's), "
                              "and those are what the chat template renders")
        super().__init__(sampler, max_turns, **kwargs)
        if (agent is None) == (agent_cmd is None):
            raise ConfigError("agent_proxy needs one agent: --agent my_pkg.agent:run (a Python function) or "
                              "--agent-cmd 'python my_agent.py' (a command)" if agent is None else
                              "agent_proxy: give --agent or --agent-cmd, not both")
        self.agent = load_agent(agent) if agent is not None else None
        self.agent_cmd = split_command(agent_cmd) if agent_cmd is not None else None
        self.agent_cwd = agent_cwd
        if not (isinstance(agent_timeout, (int, float)) and agent_timeout > 0):
            raise ConfigError(f"agent_timeout must be a positive number of seconds, got {agent_timeout!r}")
        self.agent_timeout = float(agent_timeout)
        if agent_concurrency is not None and int(agent_concurrency) < 1:
            raise ConfigError(f"agent_concurrency must be at least 1, got {agent_concurrency!r}")
        self.agent_concurrency = int(agent_concurrency) if agent_concurrency is not None else None
        self.max_requests = int(max_requests) if max_requests is not None else self.max_turns
        if self.max_requests < 1:
            raise ConfigError(f"max_requests must be at least 1, got {max_requests!r}")
        self.max_turns = max(self.max_turns, self.max_requests)
        self.max_request_tokens = int(max_request_tokens) if max_request_tokens is not None else None
        if int(max_request_bytes) < 1024:
            raise ConfigError(f"max_request_bytes must be at least 1024, got {max_request_bytes!r}")
        self.max_request_bytes = int(max_request_bytes)
        if agent_sampling not in AGENT_SAMPLING:
            raise ConfigError(f"agent_sampling {agent_sampling!r} is not one of {', '.join(AGENT_SAMPLING)}")
        self.agent_sampling = agent_sampling
        self.tool_parser_name = check_tool_parser_name(tool_parser)
        self._parser: Any = None
        self._model_name = model_name
        self.server: ProxyServer | None = None
        self._limits: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]" = weakref.WeakKeyDictionary()
        self.sessions: dict[str, Session] = {}  # by trajectory uuid, while it runs

    @classmethod
    def default_task(cls) -> Any:
        from .default_task import calculator_task

        return calculator_task()

    # --- wiring ----------------------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        if self._model_name:
            return self._model_name
        name = getattr(self.sampler, "model_name", None) or getattr(self._require_tokenizer(), "name_or_path", None)
        return os.path.basename(str(name).rstrip("/")) if name else "rlcore-policy"

    @property
    def tool_parser(self) -> Any:
        if self._parser is None:
            self._parser = make_tool_parser(self.tool_parser_name, self._require_tokenizer())
        return self._parser

    def parse_calls(self, trajectory: Trajectory, text: str) -> list[Any]:
        """The calls in ``text`` as the run's tool parser finds them (typed by the trajectory's tools)."""
        return parse_reply_calls(self.tool_parser, self._require_tokenizer(), trajectory, text, self.tools_for(trajectory))

    @property
    def template_tools(self) -> list[dict[str, Any]] | None:
        """None: each trajectory renders the tools its agent's requests carry (``infos["template_tools"]``)."""
        return None

    def reply_reader(self, trajectory: Trajectory) -> Any:
        return tool_call_reader(self, trajectory)

    def ensure_server(self) -> ProxyServer:
        """The run's endpoint, started on first use."""
        if self.server is None or not self.server.running:
            self.server = ProxyServer(max_request_bytes=self.max_request_bytes, model_name=self.model_name).start()
            # the trainer does not close its scheduler: the endpoint goes when the scheduler does
            weakref.finalize(self, self.server.stop)
        return self.server

    def _limit(self) -> asyncio.Semaphore | None:
        if self.agent_concurrency is None:
            return None
        loop = asyncio.get_running_loop()
        sem = self._limits.get(loop)
        if sem is None:
            sem = self._limits[loop] = asyncio.Semaphore(self.agent_concurrency)
        return sem

    def on_trajectory_start(self, trajectories: list[Trajectory]) -> None:
        self._require_tokenizer()
        self.tool_parser  # noqa: B018 - a parser that cannot serve this tokenizer says so before any agent runs
        self.ensure_server()

    # --- one episode ----------------------------------------------------------------------------------------
    def row_of(self, trajectory: Trajectory) -> dict[str, Any]:
        """What the agent is given: the dataset row's columns, ``messages`` (its prompt as chat
        messages) and ``prompt`` (the text of its last user message)."""
        messages = copy.deepcopy(trajectory.messages)
        user = next((m for m in reversed(messages) if m.get("role") == "user"), None)
        row = {k: v for k, v in trajectory.data.items()}
        row.setdefault("messages", messages)
        row["prompt"] = str(user.get("content") or "") if user is not None else ""
        return row

    async def run(self, infer_request: Trajectory, request_config: Any = None, **kwargs: Any) -> Trajectory:
        traj = infer_request
        server = self.ensure_server()
        session = Session(self, traj, asyncio.get_running_loop())
        key = server.open(session)
        self.sessions[traj.uuid] = session
        row = self.row_of(traj)
        who = f"agent {getattr(self.agent, '__qualname__', self.agent)!s}" if self.agent is not None else "the agent command"
        limit = self._limit()
        try:
            if limit is not None:
                await limit.acquire()
            try:
                if self.agent is not None:
                    result = await asyncio.wait_for(
                        run_callable(self.agent, server.url, key, row, self.agent_timeout), self.agent_timeout)
                else:
                    result = await run_command(self.agent_cmd or [], server.url, key, self.model_name, row,
                                               self.agent_timeout, cwd=self.agent_cwd)
                reward, extra = read_result(result, who)
            finally:
                if limit is not None:
                    limit.release()
        except asyncio.TimeoutError:
            self._fail(traj, session, f"{who} did not finish within {self.agent_timeout:g} s (agent_timeout)")
            return traj
        except Exception as exc:  # noqa: BLE001 - the agent's failure is its trajectory's, never the run's
            self._fail(traj, session, failure(exc, who))
            return traj
        finally:
            server.close(key)
            async with session.lock:  # a request still being served finishes before the trajectory is read
                session.closed = True
            self._record(traj, session)
        if session.fatal is not None:
            traj.fail(session.fatal)
        elif session.requests == 0 or not traj.turns:
            traj.fail(f"{who} made no request to the proxy ({server.url}); nothing was sampled"
                      + (f" (last refusal: {session.last_error})" if session.last_error else ""))
        else:
            traj.infos["agent_reward"] = reward
            if extra:
                traj.infos["agent"] = extra
            last = next((t for t in reversed(traj.turns) if any(t.loss_mask)), None)
            if last is not None and last.finish_reason == "length":
                traj.status, traj.reason = "truncated", "max_tokens reached"
            else:
                traj.status = "ok"
        return traj

    def _fail(self, traj: Trajectory, session: Session, reason: str) -> None:
        if session.fatal is not None:
            reason = f"{session.fatal} (then {reason})"
        elif session.last_error is not None:
            reason = f"{reason}; the proxy's last refusal: {session.last_error}"
        traj.fail(reason)

    def _record(self, traj: Trajectory, session: Session) -> None:
        traj.infos["proxy"] = {"requests": session.requests, **session.stats}
        if session.last_error is not None:
            traj.infos["proxy"]["last_error"] = session.last_error
        if session.tools:
            warn_if_tools_not_rendered(self._require_tokenizer(), session.tools)

    def on_trajectory_end(self, trajectory: Trajectory) -> None:
        self.sessions.pop(trajectory.uuid, None)

    async def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


def agent_reward(infos: list[dict[str, Any]]) -> list[float | None]:
    """The reward each trajectory's agent returned (``None`` where it returned none)."""
    out: list[float | None] = []
    for i in infos:
        value = i.get("agent_reward") if isinstance(i, dict) else None
        out.append(float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None)
    return out


AgentFn = Callable[..., Any]
