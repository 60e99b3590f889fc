"""rlcore.distributed"""
