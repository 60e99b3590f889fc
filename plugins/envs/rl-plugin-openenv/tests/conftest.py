"""rl-plugin-openenv's test fixtures beyond rlcore's pytest plugin (which loads only this package's
plugin in each test and provides the tiny model): a real OpenEnv server on 127.0.0.1."""

import pytest

from rl_plugin_openenv.server import ServerThread


@pytest.fixture(scope="module")
def server(request):
    """A guess_number server on 127.0.0.1 (a free port) for the tests of one module; a module sets
    ``SERVER_OPTIONS`` (ServerThread's keywords) to serve differently (default: 4 sessions)."""
    with ServerThread(**getattr(request.module, "SERVER_OPTIONS", {"max_concurrent_envs": 4})) as url:
        yield url


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer):
    """The tiny model's tokenizer (rlcore's pytest plugin), under the name these tests use."""
    return tiny_tokenizer
