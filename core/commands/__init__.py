"""The command line: ``rlcore`` and its subcommands, each a thin layer over the library below it.

``cli`` (the ``rlcore`` group, ``plugins``/``components``/``doctor``), ``train`` (``rlcore train``),
``rollout`` (``rlcore rollout``, ``check-rollouts``), ``distributed`` (``--distributed ray``),
``scaffold`` (``rlcore new``), ``docgen`` (``rlcore docs``). Nothing in the library imports this package.
"""
