"""Example agents for ``agent_proxy`` (plain ``openai`` SDK code, nothing rlcore-specific)."""
