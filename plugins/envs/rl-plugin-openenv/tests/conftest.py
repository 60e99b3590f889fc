import pytest

from rlcore.testing import build_tokenizer

from rl_plugin_openenv.server import ServerThread


@pytest.fixture
def rlcore_plugins() -> str:
    """Load this package's plugin (and only it) in these tests."""
    return "rl-plugin-openenv"


@pytest.fixture(scope="module")
def server():
    """A guess_number server on 127.0.0.1 (a free port) for the tests of one module."""
    with ServerThread(max_concurrent_envs=4) as url:
        yield url


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()
