"""gymnasium environments and text games for rlcore, with gym_scheduler."""
