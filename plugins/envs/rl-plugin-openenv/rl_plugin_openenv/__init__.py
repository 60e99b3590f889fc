"""OpenEnv environments for rlcore: openenv_scheduler, a robust WebSocket session client, and example servers."""
