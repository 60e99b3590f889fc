"""rl-plugin-agents: train agents as they are, behind an OpenAI-compatible endpoint.

The plugin as rlcore sees it (pluggy's eggsample shape): registration hooks naming lazily imported
factories, so loading the plugin imports neither the server nor the ``openai`` SDK until a run
uses them. What it adds:

* scheduler ``agent_proxy`` — each trajectory is one run of the user's agent (``--agent
  my_pkg.agent:run`` or ``--agent-cmd 'python my_agent.py'``) against the run's endpoint on
  127.0.0.1; every request is sampled by the run's sampler and recorded token-exactly
  (:mod:`rl_plugin_agents.scheduler`, :mod:`rl_plugin_agents.session`);
* reward ``agent_reward`` — the reward each trajectory's agent returned.
"""

from __future__ import annotations

from typing import Callable

import rlcore

__version__ = "0.1.0"


@rlcore.hookimpl
def register_schedulers(register: Callable[..., None]) -> None:
    register("agent_proxy", "rl_plugin_agents.scheduler:AgentProxyScheduler",
             description="each trajectory runs your agent (--agent module:function or --agent-cmd) against an "
                         "OpenAI-compatible endpoint that records the exact tokens of every request")


@rlcore.hookimpl
def register_rewards(register: Callable[..., None]) -> None:
    register("agent_reward", "rl_plugin_agents.scheduler:agent_reward",
             description="the reward the trajectory's agent returned (agent_proxy)")
