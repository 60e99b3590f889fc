"""rlcore.rollout"""
