"""Which packages the rlcore wheel carries: every package under ``core/``, found, never listed.

``core/`` is the import package ``rlcore``. pyproject.toml's ``packages.find`` cannot rename a
folder, so the discovery lives here: every directory below ``core/`` (with or without an
``__init__.py``) becomes ``rlcore.<dir>``, so a new subpackage cannot be left out of a regular install
(a hand-written list once dropped ``rlcore.loop``). Everything else is declared in pyproject.toml;
tests/test_packaging.py builds the wheel and compares it with the source tree.
"""

from setuptools import find_namespace_packages, setup

setup(
    package_dir={"rlcore": "core"},
    packages=["rlcore", *(f"rlcore.{name}" for name in find_namespace_packages("core", exclude=["*__pycache__*"]))],
)
