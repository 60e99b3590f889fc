import pytest


@pytest.fixture
def rlcore_plugins() -> str:
    """Load this package's plugin (and only it) in these tests."""
    return "rl-plugin-openenv"
