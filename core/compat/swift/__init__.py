"""ms-swift compatibility: :mod:`.api` (3.x: ``swift.plugin.multi_turn`` and ``swift.llm``'s
response types) and :mod:`.v4` (4.x: ``swift.rollout.multi_turn``)."""
