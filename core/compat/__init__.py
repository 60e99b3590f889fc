"""Other frameworks' vocabulary, fenced off from rlcore's own.

``compat.swift``: ms-swift 3.x and 4.x scheduler names, helpers and ``RolloutOutput``, so an ms-swift
scheduler runs with its imports changed. ``compat.trl``: TRL's ``rollout_func`` and
``environment_factory`` and TRL's config field names. ``compat.moved``: the import paths of modules
that moved, kept working with a deprecation warning. The core below ``commands`` reaches these only
through registration (a factory string), never by importing them.
"""
