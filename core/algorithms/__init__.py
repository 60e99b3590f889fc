"""rlcore.algorithms"""
