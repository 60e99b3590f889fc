"""TRL compatibility: :mod:`.agents` (``rollout_func``, ``environment_factory``). The TRL
``GRPOConfig`` fields rlcore refuses are its config's own rule (:mod:`rlcore.training.trl_fields`)."""
