"""TRL compatibility: :mod:`.agents` (``rollout_func``, ``environment_factory``) and
:mod:`.fields` (TRL's ``GRPOConfig`` field names and how they map onto rlcore's)."""
