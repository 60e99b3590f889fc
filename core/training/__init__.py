"""The training half: config, the GRPO trainer and its helpers (checkpoints, metrics, plots, data)."""
