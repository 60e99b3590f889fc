"""Tip schedulers for rlcore: math_tip_trick and thinking_tips_scheduler."""
