"""``rlcore train --scheduler agent_proxy --agent my_agent:run`` as a user types it, from the
folder that holds the agent (no dataset, no model: the scheduler's calculator task and the built-in
tiny model), cut to two steps: the agent's rewards reach the loss, and the run closes its server."""

from __future__ import annotations

import gc
import json
import textwrap
import threading

from rlcore.commands.cli import main

AGENT = textwrap.dedent('''
    from rl_plugin_agents.examples.calculator import TOOLS, score

    async def run(client, row):
        reply = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}],
                                                      tools=TOOLS)
        text = reply.choices[0].message.content or ""
        # a graded reward, so a random policy already shows signal: the share of digits it wrote
        digits = sum(c.isdigit() for c in text) / max(1, len(text.strip()))
        return {"reward": score(text, row["answer"], bool(reply.choices[0].message.tool_calls)) + digits}
''')


def test_rlcore_train_with_an_agent_from_the_working_folder(tmp_path, monkeypatch):
    (tmp_path / "my_rlcore_agent.py").write_text(AGENT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    main(["train", "--scheduler", "agent_proxy", "--agent", "my_rlcore_agent:run", "--max-steps", "2",
          "--per-device-train-batch-size", "8", "--num-generations", "4", "--max-completion-length", "12",
          "--plots", "false", "--output-dir", str(out)])
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 2
    assert all(s["failed_trajectories"] == 0 for s in steps)
    assert all("rewards/agent_reward" in s for s in steps)
    assert any(s["reward_std"] > 0 and s["grad_norm"] > 0 for s in steps)
    gc.collect()  # the trainer is gone: its scheduler's endpoint went with it
    assert not [t for t in threading.enumerate() if t.name.startswith("rlcore-agent-proxy")]
